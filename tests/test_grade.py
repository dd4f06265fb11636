"""The grader's parts: the teacher's roster, restored check cells, unreadable files, student folders, the
worker's data-only answers, the CLI; and one real notebook graded in both editions.

The hostile class (one `grade` run over many hostile submissions) is in test_grade_hostile.py.
"""

import ast
import csv
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from minidape import exercises, grade
from minidape.classroom import gradebook, sandbox
from minidape.classroom.sandbox import confine

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
EDITIONS = grade.editions()


def cells(*sources, kind="code"):
    return [{"cell_type": kind, "source": source} for source in sources]


def notebook_file(path, cell_list):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "cells": [
                    {
                        "cell_type": c["cell_type"],
                        "source": c["source"],
                        "metadata": {"tags": c.get("tags", [])},
                        **(
                            {"outputs": [], "execution_count": c.get("execution_count")}
                            if c["cell_type"] == "code"
                            else {}
                        ),
                    }
                    for c in cell_list
                ],
                "metadata": {},
                "nbformat": 4,
                "nbformat_minor": 4,
            }
        )
    )
    return path


def test_the_roster_of_every_notebook_is_the_registry_and_its_check_cells():
    assert sorted(EDITIONS) == sorted({e.notebook for e in exercises.EXERCISES.values()})
    for number, edition in EDITIONS.items():
        assert [e.name for e in edition.roster] == [e.name for e in exercises.exercises_of(number)]
        for name, index in edition.checks.items():
            assert f'exercises.check("{name}"' in edition.cells[index]["source"]


def test_a_workers_copy_of_the_package_holds_no_reference_measurement():
    """The teacher's reference measurements ship in the package (a quick run's own feedback judges with them), but a
    judged run must not read them: it could print the reference as its own table. Its copy has neither file."""
    for name in ("references.json", "reference_runs.json"):
        assert (exercises.helpers.TEACHER_REFERENCES.parent / name).is_file()  # there to leave out
    copy = sandbox.censored_copy(set(), "03")
    try:
        held = {path.name for path in copy.rglob("*.json")}
        assert not held & {"references.json", "reference_runs.json"}, held
    finally:
        shutil.rmtree(copy.parent)


def test_library_names_exist_and_belong_to_exercises():
    assert set(exercises.LIBRARY) == set(exercises.EXERCISES)
    copy = sandbox.censored_copy({name for names in exercises.LIBRARY.values() for name in names})
    shutil.rmtree(copy.parent)
    with pytest.raises(LookupError, match="minidape.kernels.no_such_thing"):
        sandbox.censored_copy({"minidape.kernels.pd_shift", "minidape.kernels.no_such_thing"})


def student_cells(edition, answers=None, drop=()):
    """The student edition of ``edition`` (solutions out), each exercise's stub replaced by answers[name]."""
    answers = answers or {}
    out = []
    for index, cell in enumerate(edition.cells):
        if "solution" in cell["tags"] or index in drop:
            continue
        source = cell["source"]
        for name, answer in answers.items():
            if f"def {name}(" in source and "todo(" in source:
                source = answer
        out.append({"cell_type": cell["cell_type"], "source": source, "tags": cell["tags"]})
    return out


def test_restore_puts_the_teachers_checks_back_where_the_teacher_has_them():
    edition = EDITIONS["02"]
    honest = student_cells(edition)
    assert [c["source"] for c in grade.restore(edition, honest)] == [c["source"] for c in honest]
    check = edition.checks["find_shift"]
    # the check deleted, another one rewritten, a dead check call added: the teacher's three come back in place
    tampered = student_cells(edition, drop={check})
    rewritten = next(c for c in tampered if 'check("kerple_log_bias"' in c["source"])
    rewritten["source"] = 'exercises.check("kerple_log_bias", lambda *a: None)'
    tampered.insert(3, {"cell_type": "code", "source": 'if False:\n    exercises.check("find_shift", print)'})
    restored = grade.restore(edition, tampered)
    assert [c["source"] for c in restored] == [c["source"] for c in honest]
    assert [c.get("checks") for c in restored if c.get("checks")] == list(edition.checks)


def test_restore_appends_checks_whose_surroundings_are_gone():
    edition = EDITIONS["02"]
    restored = grade.restore(edition, cells("x = 1"))
    assert [c.get("checks") for c in restored] == [None, *edition.checks]


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "the file is empty"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", "binary"),
        (b'{"cells": [', "invalid JSON"),
        (b'{"hello": 1}', r"no list of cells \(found: hello\)"),
        (b'{"cells": [{"cell_type": "code"}]}', "cell 1 has no cell_type or source"),
    ],
)
def test_unreadable_files_are_described_in_words(tmp_path, content, message):
    path = tmp_path / "02_x.ipynb"
    path.write_bytes(content)
    with pytest.raises(grade.NotANotebook, match=message):
        grade.read_cells(path)


def test_a_file_deleted_before_its_turn_gets_its_rows(tmp_path):
    submission = grade.Submission("ann", tmp_path / "02_kerple_cpd_kernels.ipynb")
    grader = grade.Grader(EDITIONS, "none", {}, timeout=10)
    grader._grade(submission, worker=None)
    assert [(r.exercise, r.status, r.message) for r in submission.rows] == [
        (name, "failed", "the file is gone (deleted before it was graded)") for name in EDITIONS["02"].checks
    ]


def test_a_notebook_is_known_by_its_name_or_by_the_teachers_cells_it_holds(tmp_path):
    edition = EDITIONS["05"]
    assert grade.identify(tmp_path / "05_mine.ipynb", None, EDITIONS) is edition
    assert grade.identify(tmp_path / "homework.ipynb", student_cells(edition), EDITIONS) is edition
    assert grade.identify(tmp_path / "homework.ipynb", cells("print(1)"), EDITIONS) is None


def test_student_folders_name_the_students(tmp_path):
    notebook_file(tmp_path / "class" / "ann" / "02_kerple_cpd_kernels.ipynb", [])
    notebook_file(tmp_path / "class" / "ann" / "sub" / "07_chomsky_hierarchy.ipynb", [])
    notebook_file(tmp_path / "class" / "bob.ipynb", [])
    (tmp_path / "class" / "cem").mkdir()
    (tmp_path / "class" / ".hidden").mkdir()
    found = grade.submissions([tmp_path / "class"])
    assert [(s.student, s.path.name) for s in found] == [
        ("ann", "02_kerple_cpd_kernels.ipynb"),
        ("ann", "07_chomsky_hierarchy.ipynb"),
        ("bob", "bob.ipynb"),
        ("cem", "cem"),
    ]
    assert "no notebook (.ipynb)" in found[-1].rows[0].message


@pytest.fixture(scope="module")
def worker():
    with sandbox.Worker(sandbox.isolation(), 200, grade.worker_env()) as started:
        started.wait_ready(grade.START_TIMEOUT)
        yield started


def test_the_worker_answers_with_data_and_handles_only(worker):
    worker.request(
        "run",
        0,
        "import torch\nclass Sneaky:\n    def __reduce__(self):\n"
        "        return (print, ('pwned',))\n"
        "def answer(x):\n    return x * 2, Sneaky(), torch.nn.Linear(2, 3), {'k': [1.5, 'a']}",
        timeout=60,
    )
    worker.request(
        "run", 1, "from minidape import exercises\nexercises.framework.answers = {'f': ((answer,), {})}", timeout=60
    )
    channel = sandbox.Channel(worker, time.monotonic() + 60)
    answer = channel.request("answers")["f"][0][0]
    assert isinstance(answer, sandbox.Remote)
    doubled, sneaky, linear, plain = answer(torch.arange(3))
    assert torch.equal(doubled, torch.arange(3) * 2) and plain == {"k": [1.5, "a"]}
    assert isinstance(sneaky, sandbox.Remote) and isinstance(linear, sandbox.Remote)
    assert exercises._is_module(linear) and not exercises._is_module(sneaky)
    assert exercises._parameter_shapes(linear) == [(3, 2), (3,)] and linear.in_features == 2
    source = torch.nn.Linear(2, 3)
    (way,) = exercises._hand_over(source, linear, "it")
    exercises._load_parameters(linear, way)
    assert torch.allclose(linear(torch.ones(4, 2)), source(torch.ones(4, 2)).detach())
    gradients = exercises._gradients_of_sum(linear, torch.ones(4, 2))
    assert torch.equal(gradients[0], torch.full((3, 2), 4.0)) and torch.equal(gradients[1], torch.full((3,), 4.0))


def test_refiners_in_the_worker_get_weights_by_role_and_their_mistakes_named(worker):
    worker.request(
        "run",
        0,
        textwrap.dedent("""
        import torch
        from torch import nn
        class Conv1x1OutputFirst(nn.Module):            # f as 1x1 convolutions, declared output-first
            def __init__(self, cfg):
                super().__init__()
                self.out = nn.Conv2d(cfg.refiner_width, cfg.n_head, 1)
                self.inp = nn.Conv2d(2 * cfg.n_head, cfg.refiner_width, 1)
            def forward(self, scores, bias, mask, residual=True):
                bias = bias.expand_as(scores)
                f = self.out(nn.functional.leaky_relu(self.inp(torch.cat([scores, bias], 1)), 0.01))
                return scores + bias * residual + f
        class WithoutB(Conv1x1OutputFirst):
            def forward(self, scores, bias, mask):
                return super().forward(scores, bias, mask, residual=False)
        from minidape import exercises
        exercises.framework.answers = {"right": ((Conv1x1OutputFirst,), {}), "wrong": ((WithoutB,), {})}
        """),
        timeout=60,
    )
    channel = sandbox.Channel(worker, time.monotonic() + 120)
    answers = channel.request("answers")
    assert exercises.verdict("dape_refiner", *answers["right"][0])[::2] == ("passed", 3)
    status, message, points = exercises.verdict("dape_refiner", *answers["wrong"][0])
    assert (status, points) == ("failed", 0) and "the residual + B is missing" in message


def test_a_judged_worker_sees_minidape_with_what_the_exercise_forbids_refusing(tmp_path):
    copy = sandbox.censored_copy(set(exercises.LIBRARY["my_kernel"]) | set(exercises.LIBRARY["my_bias"]))
    try:
        with sandbox.Worker(sandbox.isolation(), 201, grade.worker_env(), censored=copy) as judged:
            judged.wait_ready(grade.START_TIMEOUT)
            [output] = judged.request(
                "run",
                0,
                textwrap.dedent("""
                import inspect, minidape as md
                refused = []
                for make in (md.kernels.log_kernel, lambda: md.model.ALiBiBias(md.GPTConfig(pe="alibi")),
                             lambda: type("Mine", (md.model.FIREBias,), {})(md.GPTConfig(pe="fire"))):
                    try:
                        make()
                    except RuntimeError as error:
                        refused.append(str(error).split()[0])
                source = inspect.getsource(md.kernels)
                print(refused, "def gram" in source, "torch.log1p" in source)
                """),
                timeout=60,
            )
    finally:
        shutil.rmtree(copy.parent)
    # refused: the factory, a class, a subclass of one; kept: what no exercise of theirs forbids; gone: the source
    assert output["text"] == "['md.kernels.log_kernel', 'md.model.ALiBiBias', 'md.model.FIREBias'] True False\n"


def test_the_worker_gets_the_checks_lambdas_and_reports_the_students_errors(worker):
    worker.request("run", 0, "def apply(f, n):\n    return f(n) / (n - 3)", timeout=60)
    worker.request(
        "run", 1, "from minidape import exercises\nexercises.framework.answers = {'g': ((apply,), {})}", timeout=60
    )
    apply = sandbox.Channel(worker, time.monotonic() + 60).request("answers")["g"][0][0]
    offset = 10
    assert apply(lambda n: n + offset, 5) == 7.5
    with pytest.raises(sandbox.StudentError, match="ZeroDivisionError"):
        apply(lambda n: n, 3)


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "minidape", "grade", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["missing.ipynb"], "no such notebook or folder: missing.ipynb"),
        (["README.md"], "is not a notebook"),
        (["notebooks", "--timeout", "0"], "argument --timeout: must be a number > 0"),
        (["notebooks", "--jobs", "0"], "argument --jobs"),
        (["notebooks", "--csv", "no/such/folder/g.csv"], "does not exist"),
        (["notebooks", "--feedback", "README.md"], "--feedback README.md is a file"),
    ],
)
def test_cli_mistakes_are_one_line_and_exit_code_2(args, message):
    result = run_cli(*args)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_the_default_number_of_workers_fits_a_machine_with_many_cores(monkeypatch):
    """Before: on a machine with 128 cores or more, `grade` without --jobs refused its own default."""
    from minidape.classroom import grade as grading

    monkeypatch.setattr(grading.os, "cpu_count", lambda: 192)
    assert grading.worker_count(None) == grading.MAX_JOBS and grading.worker_count(3) == 3
    with pytest.raises(ValueError, match="--jobs must be between 1 and 127; got 128"):
        grading.worker_count(128)


def student_edition(source, folder):
    """What `make student` does for one notebook: jupytext, then nbconvert's tag and output preprocessors."""
    full = folder / "teacher" / f"{source.stem}.ipynb"
    full.parent.mkdir()
    subprocess.run([BIN / "jupytext", "--quiet", "--to", "ipynb", "-o", full, source], check=True)
    subprocess.run(
        [
            BIN / "jupyter-nbconvert",
            "--to",
            "notebook",
            "--log-level",
            "WARN",
            "--TagRemovePreprocessor.enabled=True",
            "--TagRemovePreprocessor.remove_cell_tags=solution",
            "--ClearOutputPreprocessor.enabled=True",
            "--output-dir",
            folder / "student",
            full,
        ],
        check=True,
    )
    return full, folder / "student" / full.name


def test_a_real_notebook_full_edition_passes_every_exercise_and_the_student_edition_none(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIDAPE_QUICK", "1")
    full, _ = student_edition(ROOT / "notebooks" / "02_kerple_cpd_kernels.py", tmp_path)
    # The worked solutions handed in as a student's answers (their `solution` tags gone): the teacher's edition
    # itself is refused (it is below, graded last).
    solved = json.loads(full.read_text())
    for cell in solved["cells"]:
        cell["metadata"]["tags"] = [t for t in cell["metadata"].get("tags", []) if t != "solution"]
    (tmp_path / "solved").mkdir()
    (tmp_path / "solved" / full.name).write_text(json.dumps(solved))
    out = tmp_path / "grades.csv"
    graded = grade.grade(
        [tmp_path / "solved", tmp_path / "student", tmp_path / "teacher"], csv_path=out, timeout=300, jobs=2
    )
    assert graded[2].problem.startswith("refused: this is the teacher's edition") and graded[2].points == 0
    graded = graded[:2]
    names = list(EDITIONS["02"].checks)
    with open(out) as file:
        verdicts = (exercises.PASSED, exercises.PARTLY, exercises.FAILED, exercises.NOT_DONE)
        rows = [
            (
                r["student"],
                r["exercise"],
                r["points"],
                r["passed"],
                next(v for v in verdicts if r["message"].startswith(v)),
            )
            for r in csv.DictReader(file)
        ]
    points = {e.name: f"{e.points:g}" for e in EDITIONS["02"].roster}
    # both files are named 02_kerple_cpd_kernels.ipynb: the student id is the file name here
    assert rows[: 2 * len(names)] == [
        ("02_kerple_cpd_kernels", name, points[name], "1", "passed") for name in names
    ] + [("02_kerple_cpd_kernels", name, "0", "0", "not done yet") for name in names]
    assert [g.problem for g in graded] == ["", ""]
    # the written answers, for the teacher: here both editions hold the question's cell as it is handed out
    with open(grade.written_path(out)) as file:
        written = list(csv.DictReader(file))
    (question,) = [c["source"].strip() for c in EDITIONS["02"].cells if "rubric:shift_growth" in c["tags"]]
    assert [(w["rubric"], w["answer"], w["problem"]) for w in written][:2] == [
        ("shift_growth", question, gradebook.NOT_ANSWERED)
    ] * 2


def test_predictions_are_the_literals_of_the_prediction_cells():
    assert EDITIONS["02"].predictions == {
        "square_quadratic_form": {},
        "find_shift": {},
        "shift_growth": {"prediction": "shift_prediction"},
        "kerple_log_bias": {},
    }
    assert grade.literal_assignments(cells("a = 1\nb = {'x': True}", "a = 2.5\nc = a + 1", "b = f()", "(")) == {
        "a": 2.5
    }


def test_an_experiment_is_judged_on_its_recorded_prediction_not_the_variable_at_check_time(monkeypatch):
    class Alive:
        alive = True

    channel = sandbox.Channel(Alive(), time.monotonic() + 60)
    judge = grade.Grader(EDITIONS, "none", {}, timeout=10)._judge
    exercise = exercises.EXERCISES["shift_growth"]
    measured = {"triangle": 256.0, "log": 8.0}
    answers = {"shift_growth": ((measured, measured), {})}  # the prediction overwritten by the measurement
    row = judge(exercise, answers, channel, "", {"prediction": ("shift_prediction", {"triangle": 1.0, "log": 1.0})})
    assert (row.status, row.points) == ("passed", 1) and "outside a factor of 2" in row.message
    assert judge(exercise, answers, channel, "", {"prediction": ("shift_prediction", measured)}).points == 3
    row = judge(exercise, answers, channel, "", {"prediction": ("shift_prediction", grade.NOT_RECORDED)})
    assert (row.status, row.points) == ("failed", 0) and "tagged 'prediction'" in row.message
    # passed by keyword, or mixed, the prediction follows the same rule (bound by the checker's parameter name)
    recorded = {"prediction": ("shift_prediction", {"triangle": 1.0, "log": 1.0})}
    for call in (((), {"prediction": measured, "measured": measured}), ((measured,), {"measured": measured})):
        row = judge(exercise, {"shift_growth": call}, channel, "", recorded)
        assert (row.status, row.points) == ("passed", 1), row.message
    source = 'exercises.check("shift_growth", measured=shift_measured, prediction=shift_prediction)'
    assert grade._names_passed_to_check(source, "shift_growth") == {
        "measured": "shift_measured",
        "prediction": "shift_prediction",
    }


def test_written_answers_are_collected_by_rubric_and_a_missing_one_is_named(tmp_path):
    edition = EDITIONS["02"]
    kept = [
        {**c, "source": "c grows linearly for the triangle"} if "written" in c["tags"] else c
        for c in student_cells(edition)
    ]
    assert [(w.rubric, w.answer, w.problem) for w in grade.written_answers(edition, kept)] == [
        ("shift_growth", "c grows linearly for the triangle", "")
    ]
    untagged = [{**c, "tags": []} for c in kept]
    (missing,) = grade.written_answers(edition, untagged)
    assert missing.answer == "" and "rubric:shift_growth" in missing.problem
    submission = grade.Submission(
        "ann",
        tmp_path / "02_kerple_cpd_kernels.ipynb",
        edition.stem,
        rows=[grade.Row("shift_growth", 1, 3, "partly right", "your prediction ...")],
        cells=kept,
    )
    feedback = json.loads(grade.write_feedback(submission, tmp_path / "fb").read_text())
    sources = [c["source"] for c in feedback["cells"]]
    at = sources.index("c grows linearly for the triangle")
    assert "written answer (rubric:shift_growth)" in sources[at + 1]


def test_partial_credit_is_a_credit_of_fewer_points(monkeypatch):
    def two_parts(answer):
        if answer[0] != 1:
            raise exercises.Wrong("both parts are wrong")
        if answer[1] != 2:
            return exercises.Credit(2, "the second part is wrong", answer_right=False)

    monkeypatch.setitem(
        exercises.EXERCISES,
        "two_parts",
        exercises.Exercise("two_parts", "02", "derive", "two parts", "hint", two_parts, points=4),
    )
    assert exercises.verdict("two_parts", (1, 2))[::2] == ("passed", 4)
    status, message, earned = exercises.verdict("two_parts", (1, 3))
    assert (status, earned) == ("partly right", 2) and "second part" in message
    assert exercises.verdict("two_parts", (0, 3))[::2] == ("failed", 0)


def test_without_namespaces_the_grader_warns_what_is_not_isolated(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sandbox, "isolation", lambda: "none")
    path = notebook_file(
        tmp_path / "ann" / "07_chomsky_hierarchy.ipynb",
        cells(
            "from minidape import exercises",
            "def output_length(name, n):\n    return {'reverse_string': n, 'duplicate_string': 2 * n, "
            "'compute_sqrt': (n + 1) // 2, 'binary_multiplication': n, 'parity_check': 1}[name]",
            'exercises.check("output_length", output_length)',
        ),
    )
    graded = grade.grade([path.parent.parent], timeout=120, jobs=1)
    assert "warning: no namespaces available" in capsys.readouterr().err
    assert [(r.exercise, r.status) for r in graded[0].rows] == [
        ("addition_sample", "failed"),
        ("output_length", "passed"),
        ("masked_accuracy", "failed"),
        ("shuffle_invariance", "failed"),
    ]


def test_root_without_namespaces_still_gets_user_ids_and_limits(monkeypatch):
    monkeypatch.setattr(confine.shutil, "which", lambda name: None)
    monkeypatch.setattr(confine.os, "geteuid", lambda: 0)
    assert sandbox.isolation() == "uid" and "user id of its own" in sandbox.WARNINGS["uid"]
    monkeypatch.setattr(confine.os, "geteuid", lambda: 1000)
    assert sandbox.isolation() == "none"


def test_a_weaker_level_can_be_asked_for_never_a_stronger_one(monkeypatch):
    monkeypatch.setattr(confine, "_detected", lambda: "root")
    monkeypatch.setenv("MINIDAPE_ISOLATION", "uid")
    assert sandbox.isolation() == "uid"
    monkeypatch.setattr(confine, "_detected", lambda: "uid")
    monkeypatch.setenv("MINIDAPE_ISOLATION", "root")
    with pytest.raises(ValueError, match="MINIDAPE_ISOLATION='root': this machine allows 'uid' and the weaker"):
        sandbox.isolation()


def test_a_worker_that_cannot_start_stops_grading_before_any_submission(tmp_path, monkeypatch):
    def broken(self, timeout):
        self.close()
        raise sandbox.WorkerGone("did not start (ModuleNotFoundError: No module named 'shlex')")

    monkeypatch.setattr(sandbox.Worker, "wait_ready", broken)
    path = notebook_file(tmp_path / "02_kerple_cpd_kernels.ipynb", cells("x = 1"))
    with pytest.raises(OSError, match="did not start .*No module named 'shlex'.*must be able to read Python"):
        grade.grade([path], csv_path=tmp_path / "g.csv", jobs=1)
    assert not (tmp_path / "g.csv").exists()


@pytest.mark.skipif(sandbox.cgroup_version() is None, reason="a cgroup per submission needs root and cgroups")
def test_a_submissions_cgroup_bounds_all_its_processes_together():
    """Every process a worker starts is in its submission's cgroup (one CPU's worth of time), and their memory is
    bounded together: two children that each fit the limit alone cannot both live (the limit lowered here)."""
    version = sandbox.cgroup_version()
    box = sandbox.Box(version, f"test-{os.getpid()}")
    box._write("memory.max" if version == "v2" else "memory.limit_in_bytes", 1 << 30)
    try:
        with sandbox.Worker(sandbox.isolation(), 202, grade.worker_env(), box=box) as worker:
            worker.wait_ready(grade.START_TIMEOUT)
            [output] = worker.request(
                "run",
                0,
                textwrap.dedent("""
                import os, time
                read, write = os.pipe()
                if os.fork() == 0:
                    os.write(write, open("/proc/self/cgroup").read().encode())
                    os._exit(0)
                os.wait()
                print(dict(line.split(":")[1:] for line in os.read(read, 10_000).decode().splitlines()))
                children = []
                for _ in range(2):
                    pid = os.fork()
                    if pid == 0:
                        block = b"x" * (600 << 20)       # touched: 600 MB each, the worker's own besides
                        time.sleep(3)
                        os._exit(0)
                    children.append(pid)
                print(sorted(os.waitpid(pid, 0)[1] & 0x7F for pid in children))
                """),
                timeout=120,
            )
            quota = box._read("cpu.max" if version == "v2" else "cpu.cfs_quota_us")
    finally:
        box.close()
    groups, killed = output["text"].splitlines()
    groups = ast.literal_eval(groups)
    controllers = [""] if version == "v2" else ["cpu", "memory", "pids"]
    assert all(groups[c] == f"/minidape-test-{os.getpid()}" for c in controllers), groups
    assert ast.literal_eval(killed) in ([0, 9], [9, 9]), killed  # SIGKILL from the cgroup's out-of-memory killer
    assert quota.split()[0] == "100000"
    assert not any(folder.exists() for folder in box.folders)


def test_a_worker_is_given_the_package_and_corpora_not_the_checkout_around_them(monkeypatch):
    """The grader's working folder (the checkout's root, on sys.path under `python -m pytest` or `-m minidape`)
    is not bound into a worker whole: a checkout closed to others (`mktemp -d` makes it 0700) then closed the
    worker out of its own venv inside it ("the sandboxed worker did not start" for every grader test of a clone
    under /tmp), and its tests/ and notebooks/ have no business there. The package and the corpora are bound."""
    from minidape.classroom.sandbox import host
    from minidape.lab import data

    checkout = host.PACKAGE.parent
    monkeypatch.setattr(sys, "path", [str(checkout), str(checkout.parent), *sys.path])
    needed = host.needed_trees()
    assert str(host.PACKAGE) in needed and os.path.realpath(data.DATA_DIR) in needed
    assert not any(Path(tree) in (checkout, *checkout.parents) for tree in needed), needed


# ------------------------------------------------------------------------- bounded before parsing (issue 47)


def test_a_giant_notebook_or_cell_is_refused_before_it_is_parsed(tmp_path):
    """A 10 MB code cell (a 5-million-element literal) took the grader to 5 GB while it parsed it: refused with
    its size and the limit, from the file's bytes, before any JSON or Python of it is parsed."""
    from minidape.classroom import collect

    cell = "x = [" + "1," * 5_000_000 + "]"
    notebook_file(tmp_path / "02_giant_cell.ipynb", cells(cell))
    with pytest.raises(grade.NotANotebook, match=r"cell 1 is too large: 1e\+07 characters, limit 200000 characters"):
        grade.read_cells(tmp_path / "02_giant_cell.ipynb")
    big = tmp_path / "02_giant_file.ipynb"
    big.write_bytes(b" " * (collect.MAX_SUBMISSION_BYTES + 1))  # not even JSON: never read past the limit
    with pytest.raises(grade.NotANotebook, match=r"^refused, too large: 32 MB, limit 32 MB$"):
        grade.read_cells(big)
    submission = grade.Submission("ann", tmp_path / "02_giant_cell.ipynb")
    grade.Grader(EDITIONS, "none", {}, timeout=10)._grade(submission, worker=None)
    assert {r.message for r in submission.rows} == {
        "refused, cell 1 is too large: 1e+07 characters, limit 200000 characters"
    }


def test_a_giant_written_answer_is_kept_only_up_to_its_limit():
    from minidape.classroom import collect

    edition = EDITIONS["02"]
    rubric = edition.rubrics[0]
    answer = "c grows. " * 3_400_000  # 30 MB
    [written, *_] = grade.written_answers(
        edition, [{"cell_type": "markdown", "source": answer, "tags": ["written", f"rubric:{rubric}"]}]
    )
    assert written.answer == answer[: collect.MAX_WRITTEN]
    assert written.problem == "too large: 3.06e+07 characters, limit 20000 characters: cut there"


def test_experiments_are_judged_on_the_reference_run_whole(monkeypatch):
    """8.3 has a reference like 3.1, 4.4 and 5.3: a typed mean_gate with nothing trained earns nothing, and a
    table cut to fewer entries than the notebook's run (LONGEST = TRAIN_LENGTH) is not that run's measurement."""
    gates = {"letter": 0.93, "space": 0.71, "punctuation": 0.80, "newline": 0.75}
    references = {mode: {"where_fox_forgets": {**gates, "_machine": "x"}} for mode in ("quick", "full")}
    monkeypatch.setenv("MINIDAPE_QUICK", "1")
    monkeypatch.setattr(exercises.framework, "references", references)
    verdict = lambda table: exercises.verdict("where_fox_forgets", "space", min(table, key=table.get), table)
    assert verdict(gates)[::2] == ("passed", 2)
    typed = {"letter": 0.9, "space": 0.5, "punctuation": 0.8, "newline": 0.8}  # the right kind, invented gates
    assert verdict(typed)[0] == "failed" and "reference run (quick mode" in verdict(typed)[1]
    assert verdict({"letter": 0.93, "space": 0.71})[1].startswith("not yet right: your run's table holds")
    monkeypatch.setattr(exercises.framework, "references", {"quick": {}, "full": {}})
    assert verdict(gates)[0] == exercises.NEEDS_FULL


def test_far_mass_in_float32_passes_every_time_and_an_off_by_one_never():
    def far_mass_float32(a, s, L, T):
        d = torch.arange(T, dtype=torch.float32)
        weights = torch.softmax(a / (1 + (d / s) ** 2), 0)
        return 1 - weights[:L].sum().item()

    def one_too_far(a, s, L, T):
        d = torch.arange(T, dtype=torch.float64)
        weights = (a / (1 + (d / s) ** 2)).exp()
        return (weights[L + 1 :].sum() / weights.sum()).item()

    assert {exercises.verdict("far_mass", far_mass_float32)[0] for _ in range(25)} == {"passed"}
    assert {exercises.verdict("far_mass", one_too_far)[0] for _ in range(25)} == {"failed"}


def test_samples_must_come_from_the_given_generator():
    """7.1: an answer that keeps its first sample and ignores the generator it is given (round 2's memo) earns
    nothing; the worked solution earns its points."""
    solution = {}
    exec(
        next(
            c["source"]
            for c in EDITIONS["07"].cells
            if "def addition_sample" in c["source"] and "solution" in c["tags"]
        ),
        {"torch": torch, "exercises": exercises},
        solution,
    )
    kept = {}

    def memoised(batch_size, n, generator):
        if (batch_size, n) not in kept:
            kept[batch_size, n] = solution["addition_sample"](batch_size, n, torch.Generator().manual_seed(0))
        return kept[batch_size, n]

    assert exercises.verdict("addition_sample", solution["addition_sample"])[::2] == ("passed", 3)
    status, message, _ = exercises.verdict("addition_sample", memoised)
    assert status == "failed" and "generators seeded differently gave the same inputs" in message


def test_a_refiner_whose_first_layer_is_split_into_its_s_and_b_halves_earns_full_marks():
    """The same function as DAPE's f([S, B]) = W2·LeakyReLU(W1·[S; B] + b1) + b2 with W1·[S; B] written as
    W_S·S + W_B·B (two layers, each with a bias): matched by behaviour, it passes; a wrong residual still fails."""

    class SplitDAPE(torch.nn.Module):
        def __init__(self, cfg, residual=True):
            super().__init__()
            h, width = cfg.n_head, cfg.refiner_width
            self.from_scores, self.from_bias = torch.nn.Linear(h, width), torch.nn.Linear(h, width)
            self.out, self.residual = torch.nn.Linear(width, h), residual

        def forward(self, scores, bias, mask):
            cells = lambda x: x.movedim(-3, -1)  # (..., h, Tq, Tk) -> (..., Tq, Tk, h)
            hidden = self.from_scores(cells(scores)) + self.from_bias(cells(bias).expand_as(cells(scores)))
            refined = scores + self.out(torch.nn.functional.leaky_relu(hidden, 0.01)).movedim(-1, -3)
            return refined + bias if self.residual else refined

    assert exercises.verdict("dape_refiner", SplitDAPE)[::2] == ("passed", 3)
    no_residual = type("NoResidual", (SplitDAPE,), {"__init__": lambda self, cfg: SplitDAPE.__init__(self, cfg, False)})
    assert exercises.verdict("dape_refiner", no_residual)[0] == "failed"


def test_mistake_codes_are_short_and_stable():
    """The documented form (docs/teaching.md): `one-doubling-too-many`, whatever kernel and sizes were drawn."""
    from minidape import kernels

    codes = {exercises.verdict("find_shift", lambda kernel, n: 2 * kernels.pd_shift(kernel, n)).code for _ in range(3)}
    assert codes == {"one-doubling-too-many"}
    assert exercises.mistake_code(
        "for 3 random points your form gives 2.1, which is minus cᵀKc: the sign is wrong"
    ) == ("the-sign-is-wrong")


def test_feedback_shows_the_graders_verdicts_only_and_the_marks_and_the_teacher_reads_it(tmp_path):
    """13 of 30 feedback notebooks contradicted the grade (the re-run's own "✓ passed" above the grader's ✗): the
    re-run's check and summary outputs are gone; a written mark shows once entered; the files belong to the
    owner of the folder above the feedback folder (the teacher), not 0600 root."""
    printed = [{"output_type": "stream", "name": "stdout", "text": "✓ passed, 2 of 2"}]
    cells = [
        {
            "cell_type": "code",
            "source": "def f():\n    pass",
            "outputs": [{"output_type": "stream", "name": "stdout", "text": "mine"}],
        },
        {"cell_type": "code", "source": 'exercises.check("find_shift", f)', "checks": "find_shift", "outputs": printed},
        {"cell_type": "markdown", "source": "c grows", "tags": ["written", "rubric:shift_growth"]},
        {"cell_type": "code", "source": 'exercises.summary("02")', "outputs": printed},
    ]
    submission = grade.Submission(
        "ann",
        tmp_path / "02_kerple_cpd_kernels.ipynb",
        "02_kerple_cpd_kernels",
        [grade.Row("find_shift", 0, 2, "failed", "x")],
        cells=cells,
    )
    entered = {("ann", "02_kerple_cpd_kernels", "shift_growth", "c grows"): "1.5"}
    teacher = tmp_path / "teacher"
    teacher.mkdir()
    os.chown(teacher, 4242, 4242) if os.geteuid() == 0 else None
    path = grade.write_feedback(submission, teacher / "feedback", entered)
    notebook = json.loads(path.read_text())
    outputs = [c.get("outputs") for c in notebook["cells"] if c["cell_type"] == "code"]
    assert outputs == [cells[0]["outputs"], [], []]
    assert any("marked by your teacher: 1.5 / 2" in c["source"] for c in notebook["cells"])
    assert path.stat().st_mode & 0o777 == 0o640 and path.parent.stat().st_mode & 0o777 == 0o750
    if os.geteuid() == 0:
        assert (path.stat().st_uid, path.parent.stat().st_uid) == (4242, 4242)


ROPE = dict(n_layer=2, n_head=4, n_embd=64, block_size=64, pe="rope")  # notebook 03's config("rope")


def _quick_references(monkeypatch, name: str, table: dict) -> None:
    monkeypatch.setenv("MINIDAPE_QUICK", "1")
    monkeypatch.setattr(exercises.framework, "references", {mode: {name: table} for mode in ("quick", "full")})


def test_a_table_read_at_one_length_is_refused(monkeypatch):
    """3.1 with LONGEST = TRAIN_LENGTH: a one-number table whose ratio is 1 measures nothing beyond the training
    length; quick mode's reference (8 steps: both perplexities near 62) used to take it as the run's."""
    _quick_references(monkeypatch, "rope_ratio", {"train_length": 62.0, "longest": 62.1})
    status, message, earned = exercises.verdict("rope_ratio", False, 1.0, {"rope": {64: 62.0}}, 64, 64)
    assert (status, earned) == ("failed", 0) and "measures up to 256" in message
    assert exercises.verdict("rope_ratio", False, 1.0, {"rope": {64: 62.0}}, 64, 64).code == "lengths-not-the-budgets"


def test_an_experiments_table_must_be_the_grader_measurement_of_the_runs_own_models(worker, monkeypatch):
    """A table typed in or copied from a classmate agrees with the reference as well as the run's own would; the
    grader measures the models the judged run trained (their weights, in its own process) and refuses a table
    that is not theirs. Here the run's model is an untrained RoPE model of notebook 03's config (seed 0), and
    the references are its own measurement, so that the honest table passes and only where it came from differs."""
    from minidape.lab.data import load_corpus
    from minidape.lab.evaluate import perplexity_by_length
    from minidape.model import GPT, GPTConfig

    worker.request(
        "run",
        0,
        f"import torch, minidape as md\ntorch.manual_seed(0)\nmodels = {{'rope': md.GPT(md.GPTConfig(**{ROPE!r}))}}",
        timeout=60,
    )
    torch.manual_seed(0)
    model = GPT(GPTConfig(**ROPE)).eval()  # the same weights as the worker's: same seed, same construction
    curve = perplexity_by_length(model, load_corpus("austen", "val"), (64, 128, 256), protocol="last_k", n_windows=4)
    _quick_references(monkeypatch, "rope_ratio", {"train_length": curve[64], "longest": curve[256]})
    recomputed = exercises.MEASURED_BY_GRADER["rope_ratio"](None, sandbox.Channel(worker, time.monotonic() + 120))

    def verdict(table):
        return exercises.verdict("rope_ratio", False, table[256] / table[64], {"rope": table}, 64, 256, recomputed)

    assert verdict(curve)[::2] == ("passed", 2)
    copied = {length: value * 1.05 for length, value in curve.items()}  # within the reference's 25 %
    assert verdict(copied).code == "measurement-not-this-runs"
    worker.request("run", 1, "del models", timeout=60)
    assert verdict(curve).code == "run-models-missing"


def test_far_shares_must_be_the_grader_measurement_of_the_runs_own_models(worker, monkeypatch):
    """4.4 as 3.1: the far attention shares handed in are the grader's measurement of the run's two models, each
    the last query's attention beyond one training length (64) at the longest length (256), over heads and
    layers, averaged over the first and the last window of the validation split."""
    from minidape.lab.data import load_corpus
    from minidape.model import GPT, GPTConfig

    def config(refiner):  # notebook 04's config(): Kerple-log, with DAPE's refiner or none
        return dict(n_layer=2, n_head=4, n_embd=64, block_size=64, pe="kerple_log", refiner=refiner, refiner_width=32)

    worker.request(
        "run",
        0,
        "import torch, minidape as md\ntorch.manual_seed(0)\n"
        f"models = {{'kerple_log': md.GPT(md.GPTConfig(**{config('none')!r})), "
        f"'dape-kerple': md.GPT(md.GPTConfig(**{config('dape')!r}))}}",
        timeout=60,
    )
    torch.manual_seed(0)
    models = {"kerple_log": GPT(GPTConfig(**config("none"))), "dape-kerple": GPT(GPTConfig(**config("dape")))}
    tokens = load_corpus("austen", "val")
    shares = {}
    for name, model in models.items():
        masses = []
        for window in (tokens[:256], tokens[-256:]):
            with torch.no_grad():
                probs = [model.eval().attention_maps(window.long()[None], layer)["probs"] for layer in (0, 1)]
            masses.append(sum(p[0, :, -1, :192].sum(-1).mean().item() for p in probs) / 2)
        shares[name] = sum(masses) / 2
    _quick_references(monkeypatch, "locality", shares)
    recomputed = exercises.MEASURED_BY_GRADER["locality"](None, sandbox.Channel(worker, time.monotonic() + 120))
    local = min(shares, key=shares.get)
    assert exercises.verdict("locality", local, shares, recomputed)[::2] == ("passed", 2)
    copied = {name: value * 1.05 for name, value in shares.items()}
    assert exercises.verdict("locality", local, copied, recomputed).code == "measurement-not-this-runs"


def test_fox_gates_must_be_the_grader_measurement_of_the_runs_own_model(worker, monkeypatch):
    """8.3 as 3.1 and 4.4: the mean gates handed in are the grader's measurement of the FoX model the run trained
    (notebook 08's `trained["FoX"]`, 4 layers), the mean of f_t = exp(log_forget) over layers and heads after
    each kind of byte of the first 4,096 bytes of the validation split, written out here from notebook 08's cell.
    A typed table, one copied from a classmate, or a run without the model earns nothing."""
    from minidape.lab.data import load_corpus
    from minidape.model import GPT, GPTConfig

    fox = dict(n_layer=4, n_head=4, n_embd=64, block_size=64, pe="fox")
    worker.request(
        "run",
        0,
        f"import torch, minidape as md\ntorch.manual_seed(0)\ntrained = {{'FoX': md.GPT(md.GPTConfig(**{fox!r}))}}",
        timeout=60,
    )
    torch.manual_seed(0)
    model = GPT(GPTConfig(**fox)).eval()  # the worker's weights: same seed, same construction
    text = load_corpus("austen", "val")[:4096]
    with torch.no_grad():
        x, inputs = model.hidden_states(text[None].long(), upto_layer=0)
        gates = []
        for layer, block in enumerate(model.blocks):
            gates.append(block.attn.data_bias.log_forget(block.ln_1(x)).exp()[0])
            x = block(x, inputs[layer])
    per_byte = torch.cat(gates).mean(0)
    kinds = {
        "letter": torch.tensor([chr(b).isalpha() for b in text.tolist()]),
        "space": text == ord(" "),
        "newline": text == ord("\n"),
        "punctuation": torch.tensor([chr(b) in ".,;:!?\"'-" for b in text.tolist()]),
    }
    mean_gate = {kind: per_byte[where].mean().item() for kind, where in kinds.items()}
    _quick_references(monkeypatch, "where_fox_forgets", mean_gate)
    recomputed = exercises.MEASURED_BY_GRADER["where_fox_forgets"](
        None, sandbox.Channel(worker, time.monotonic() + 120)
    )
    lowest = min(mean_gate, key=mean_gate.get)
    assert exercises.verdict("where_fox_forgets", lowest, lowest, mean_gate, recomputed)[::2] == ("passed", 2)
    copied = {kind: value * 1.005 for kind, value in mean_gate.items()}  # within the reference's 2 %
    assert (
        exercises.verdict("where_fox_forgets", lowest, lowest, copied, recomputed).code == "measurement-not-this-runs"
    )
    worker.request("run", 1, "del trained", timeout=60)
    assert exercises.verdict("where_fox_forgets", lowest, lowest, mean_gate, recomputed).code == "run-models-missing"


LEAKY_CONV = '''
from minidape.model import ConvRefiner


class LeakyConvRefiner(ConvRefiner):  # notebook 05's leaky_conv: the conv refiner with its mask ignored
    row_local = True

    def __init__(self, cfg):
        super().__init__(cfg)
        self.key_margin = 2 * (cfg.refiner_kernel // 2)

    def forward(self, scores, bias, mask):
        return super().forward(scores, bias, torch.ones_like(mask))
'''


def test_leakage_losses_must_be_the_grader_measurement_of_the_runs_own_models(worker, monkeypatch):
    """5.3 as 3.1: the final validation losses handed in (the histories' last entries) are the grader's measurement
    of the run's two models, the honest conv and the leaky one (which reads the next key's score), on the windows
    md.train logs its last val_loss on (quick mode: 8 windows of 65 bytes, seed 0), computed here from their
    definition: the mean next-byte cross-entropy of each window."""
    import torch.nn.functional as F

    from minidape.lab.data import load_corpus
    from minidape.model import GPT, GPTConfig, register_refiner

    config = dict(n_layer=2, n_head=4, n_embd=64, block_size=64, pe="kerple_log", refiner_kernel=3)
    build = (
        f"torch.manual_seed(0)\nmodels = {{'conv k=3': md.GPT(md.GPTConfig(**{config!r}, refiner='conv')), "
        f"'leaky_conv k=3': md.GPT(md.GPTConfig(**{config!r}, refiner='leaky_conv'))}}"
    )
    setup = f"import torch, minidape as md\n{LEAKY_CONV}\nmd.register_refiner('leaky_conv')(LeakyConvRefiner)\n"
    worker.request("run", 0, setup + build, timeout=60)
    namespace = {"torch": torch}
    exec(LEAKY_CONV, namespace)  # noqa: S102 - the test's own class
    register_refiner("leaky_conv")(namespace["LeakyConvRefiner"])
    torch.manual_seed(0)
    models = {
        "conv k=3": GPT(GPTConfig(**config, refiner="conv")).eval(),
        "leaky_conv k=3": GPT(GPTConfig(**config, refiner="leaky_conv")).eval(),
    }
    tokens = load_corpus("austen", "val")
    starts = torch.randint(len(tokens) - 65 + 1, (8, 1), generator=torch.Generator().manual_seed(0))
    windows = tokens[starts + torch.arange(65)].long()
    with torch.no_grad():
        losses = {
            name: F.cross_entropy(model(windows[:, :-1])[0].flatten(0, 1), windows[:, 1:].flatten()).item()
            for name, model in models.items()
        }
    assert losses["leaky_conv k=3"] != losses["conv k=3"]
    _quick_references(monkeypatch, "leakage", losses)
    recomputed = exercises.MEASURED_BY_GRADER["leakage"](None, sandbox.Channel(worker, time.monotonic() + 120))

    def verdict(table):
        histories = {name: [{"val_loss": 9.0}, {"val_loss": value}] for name, value in table.items()}
        return exercises.verdict("leakage", True, dict(table), histories, recomputed)

    assert verdict(losses)[0] == "passed"
    copied = {name: value * 1.05 for name, value in losses.items()}  # within the reference's 25 %
    assert verdict(copied).code == "measurement-not-this-runs"
    worker.request("run", 1, "del models", timeout=60)
    assert verdict(losses).code == "run-models-missing"
