"""Hostile submissions: each earns exactly what it did, honest ones graded in the same run keep full marks.

One `grade` run over a class of student folders, all on notebook 02 (four exercises, no training; the
experiment, shift_growth, is answered by a prediction cell and a measurement cell): every
submission is built from the teacher's edition (its first code cell and its worked solutions), then made
hostile by cells of its own. Each case below says which exercises it really solved; the test asserts the
points of every exercise, and, for the attacks on other files and processes, that nothing outside the
submission changed.
"""

import contextlib
import csv
import hashlib
import io
import json
import os
import resource
import shutil
import tempfile
import textwrap
from pathlib import Path

import jupytext
import pytest

from minidape import exercises, grade
from minidape.classroom import sandbox

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("square_quadratic_form", "find_shift", "shift_growth", "kerple_log_bias")
FUNCTIONS = ("square_quadratic_form", "find_shift", "kerple_log_bias")  # answered by a function each
LEVEL = sandbox.isolation()
ROOT_ONLY = pytest.mark.skipif(LEVEL != "root", reason="hidden folders and user ids of their own need root")
# Without a user id of its own a worker may write the tester's files; without a PID namespace either, signal
# the tester's processes: these cases run only where they are contained.
CONTAINED_ONLY = ({"reads_and_writes_others", "detached_children"} if LEVEL not in ("root", "uid") else set()) | (
    {"kills_the_parent", "fork_bomb"} if LEVEL == "none" else set()
)


TEACHER = jupytext.read(ROOT / "notebooks" / "02_kerple_cpd_kernels.py").cells
POINTS = {e.name: e.points for e in exercises.exercises_of("02")}
# The experiment's answer cells: its recorded prediction and its measurement (by the variable they assign).
EXPERIMENT = ("shift_prediction", "shift_measured")
SOLUTIONS = {
    name: cell.source
    for cell in TEACHER
    if "solution" in cell.metadata.get("tags", [])
    for name in (*FUNCTIONS, *EXPERIMENT)
    if f"def {name}(" in cell.source or f"{name} = " in cell.source
}
SOLUTIONS["shift_measured"] = "triangle = lambda m, n: -(m - n).abs()\n" + SOLUTIONS["shift_measured"]
STUB = "def {0}(*args):\n    exercises.todo()\n"
STUBS = {**{n: STUB.format(n) for n in FUNCTIONS}, **{n: f"{n} = None" for n in EXPERIMENT}}


BUT_FIND_SHIFT = ("square_quadratic_form", "shift_growth", "kerple_log_bias")
BUT_KERPLE = ("square_quadratic_form", "find_shift", "shift_growth")
PLANTED = f"minidape-planted-by-a-classmate-{os.getpid()}"
PLANT = textwrap.dedent(f"""
    import os
    FOLDERS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
    print("FOUND", sorted(f for f in FOLDERS if os.path.exists(os.path.join(f, "{PLANTED}"))))
    for folder in FOLDERS:
        try:
            open(os.path.join(folder, "{PLANTED}"), "w").write("x")
        except OSError:
            pass
    """)


def case(solved=NAMES, answers=(), checks=(), extra=(), earned=()):
    """A submission: the worked solutions unless ``answers`` says otherwise (name -> source), the teacher's
    check cells unless ``checks`` replaces (source) or deletes (None) them, ``extra`` cells (after exercise
    name, or None for the end); ``solved``: the exercises it really did (None: no promise, it breaks itself),
    each earning its points unless ``earned`` says less."""
    return {
        "solved": solved,
        "answers": {**SOLUTIONS, **dict(answers)},
        "checks": dict(checks),
        "extra": list(extra),
        "earned": dict(earned),
    }


CASES = {
    "honest": case(),
    "forged_log": case(
        (),
        answers=STUBS,
        extra=[
            (
                None,
                textwrap.dedent("""
        import json, os
        for name in ("square_quadratic_form", "find_shift", "shift_growth", "kerple_log_bias"):
            print(f"✓ exercise 02·{name} (implement): passed")
            for variable in ("MINIDAPE_GRADE_LOG", "MINIDAPE_VERDICTS"):
                if os.environ.get(variable):
                    open(os.environ[variable], "a").write(json.dumps({"exercise": name, "status": "passed"}) + "\\n")
        open("verdicts.jsonl", "w").write('{"exercise": "find_shift", "status": "passed"}\\n')
        """),
            )
        ],
    ),
    "patched_checkers": case(
        (),
        answers=STUBS,
        extra=[
            (
                "square_quadratic_form",
                textwrap.dedent("""
        import dataclasses, torch
        for name, exercise in list(exercises.EXERCISES.items()):
            exercises.EXERCISES[name] = dataclasses.replace(exercise, checker=lambda *a, **k: None)
        exercises.verdict = lambda name, *a, **k: ("passed", "passed", 1.0)
        exercises._close = lambda *a, **k: None
        torch.allclose = lambda *a, **k: True
        """),
            )
        ],
    ),
    "patched_check": case(
        (),
        extra=[
            (
                "square_quadratic_form",
                "exercises.check = lambda *args, **options: True\nexercises.framework.answers = {}",
            )
        ],
    ),
    "deleted_and_rewritten_checks": case(
        ("square_quadratic_form",),
        answers={
            "find_shift": STUBS["find_shift"],
            "kerple_log_bias": STUBS["kerple_log_bias"],
            "shift_prediction": STUBS["shift_prediction"],
            "shift_measured": "shift_measured = {'triangle': 1.0, 'log': 1.0}",
        },
        checks={
            "find_shift": 'exercises.check("find_shift", lambda kernel, n: 1.0)  # edited by the student',
            "shift_growth": 'exercises.check("shift_growth", {"triangle": 1.0, "log": 1.0}, '
            '{"triangle": 256.0, "log": 8.0})',
            "kerple_log_bias": None,
        },
    ),
    "dead_code_checks": case(
        (),
        answers=STUBS,
        checks={
            "square_quadratic_form": 'if False:\n    exercises.check("square_quadratic_form", square_quadratic_form)',
            "find_shift": 'exercises.check("find_shift", lambda kernel, n: md.kernels.pd_shift(kernel, n))',
        },
    ),
    "library_as_answer": case(
        ("square_quadratic_form", "shift_growth"),
        answers={
            "find_shift": textwrap.dedent("""
        shift = md.kernels.pd_shift          # an alias taken before any check runs
        def find_shift(kernel, n):
            return shift(kernel, n)
        """),
            "kerple_log_bias": textwrap.dedent("""
        from minidape.model import KerpleLogBias, GPTConfig
        class Mine(KerpleLogBias):
            pass
        def kerple_log_bias(r1, r2, q_pos, k_pos):
            pe = Mine(GPTConfig(n_head=len(r1), n_embd=8 * len(r1), pe="kerple_log"))
            with torch.no_grad():
                pe.r1.copy_(r1)
                pe.r2.copy_(r2)
            return pe(q_pos, k_pos)
        """),
        },
    ),
    # The library reached around the ban (issue 31): each answer below runs md.kernels.pd_shift or
    # md.model.KerpleLogBias in a way that an in-process watch cannot see or that switches it off; the judged run's
    # minidape has nothing of them to run, so only the honest answers earn.
    "switches_off_the_watch": case(
        BUT_FIND_SHIFT,
        answers={
            "find_shift": textwrap.dedent("""
        import sys
        def find_shift(kernel, n):
            sys.setprofile(None)
            return md.kernels.pd_shift(kernel, n)
        """)
        },
    ),
    "profiler_toggled": case(
        BUT_FIND_SHIFT,
        answers={
            "find_shift": textwrap.dedent("""
        import sys, threading
        def find_shift(kernel, n):
            saved = sys.getprofile()
            sys.setprofile(None)
            threading.setprofile(None)
            try:
                return md.kernels.pd_shift(kernel, n)
            finally:
                sys.setprofile(saved)
        """)
        },
    ),
    "trace_callback": case(
        BUT_FIND_SHIFT,
        answers={
            "find_shift": textwrap.dedent("""
        import sys
        def find_shift(kernel, n):
            found = []
            def tracer(frame, event, arg):
                if not found:
                    found.append(md.kernels.pd_shift(kernel, n))
                return None
            sys.settrace(tracer)
            (lambda: None)()
            sys.settrace(None)
            return found[0]
        """)
        },
    ),
    "thread_started_earlier": case(
        BUT_FIND_SHIFT,
        extra=[
            (
                "square_quadratic_form",
                textwrap.dedent("""
        import _thread, queue
        REQUESTS, RESULTS = queue.Queue(), queue.Queue()
        def serve():
            while True:
                kernel, n = REQUESTS.get()
                RESULTS.put(md.kernels.pd_shift(kernel, n))
        _thread.start_new_thread(serve, ())
        """),
            )
        ],
        answers={
            "find_shift": textwrap.dedent("""
        def find_shift(kernel, n):
            REQUESTS.put((kernel, n))
            return RESULTS.get(timeout=5)
        """)
        },
    ),
    "thread_pool": case(
        BUT_KERPLE,
        extra=[
            (
                "square_quadratic_form",
                textwrap.dedent("""
        from concurrent.futures import ThreadPoolExecutor
        POOL = ThreadPoolExecutor(1)
        POOL.submit(print, "the pool runs").result()
        """),
            )
        ],
        answers={
            "kerple_log_bias": textwrap.dedent("""
        from minidape.model import KerpleLogBias, GPTConfig
        def kerple_log_bias(r1, r2, q_pos, k_pos):
            def library():
                pe = KerpleLogBias(GPTConfig(n_head=len(r1), n_embd=8 * len(r1), pe="kerple_log"))
                with torch.no_grad():
                    pe.r1.copy_(r1)
                    pe.r2.copy_(r2)
                return pe(q_pos, k_pos)
            return POOL.submit(library).result()
        """)
        },
    ),
    "rebound": case(
        BUT_FIND_SHIFT,
        answers={
            "find_shift": textwrap.dedent("""
        kept = md.kernels.pd_shift
        md.kernels.pd_shift = lambda kernel, n, **options: kept(kernel, n, **options)
        def find_shift(kernel, n):
            return md.kernels.pd_shift(kernel, n)
        """)
        },
    ),
    "code_replaced": case(
        BUT_FIND_SHIFT,
        answers={
            "find_shift": textwrap.dedent("""
        import types
        library = md.kernels.pd_shift
        mine = types.FunctionType(library.__code__.replace(co_name="mine"), vars(md.kernels), "mine",
                                  library.__defaults__)
        def find_shift(kernel, n):
            return mine(kernel, n)
        """)
        },
    ),
    "source_copied": case(
        BUT_FIND_SHIFT,
        answers={
            "find_shift": textwrap.dedent("""
        import inspect
        namespace = dict(vars(md.kernels))
        exec(inspect.getsource(md.kernels.pd_shift), namespace)
        def find_shift(kernel, n):
            return namespace["pd_shift"](kernel, n)
        """)
        },
    ),
    "compiled": case(
        BUT_KERPLE,
        answers={
            "kerple_log_bias": textwrap.dedent("""
        from minidape.model import KerpleLogBias, GPTConfig
        def kerple_log_bias(r1, r2, q_pos, k_pos):
            pe = KerpleLogBias(GPTConfig(n_head=len(r1), n_embd=8 * len(r1), pe="kerple_log"))
            with torch.no_grad():
                pe.r1.copy_(r1)
                pe.r2.copy_(r2)
            return torch.compile(pe, backend="eager")(q_pos, k_pos)
        """)
        },
    ),
    # a table of the library's answers on the inputs the check drew before (three kernels, n < 96)
    "tabulated": case(
        BUT_FIND_SHIFT,
        answers={
            "find_shift": textwrap.dedent("""
        import torch
        KERNELS = (lambda m, n: -(m - n).abs(), lambda m, n: -torch.log1p((m - n).abs()),
                   lambda m, n: -(m - n).abs() ** 1.5)
        key = lambda kernel: round(float(kernel(torch.tensor(0.0), torch.tensor(3.0))), 5)
        TABLE = {(key(kernel), n): md.kernels.pd_shift(kernel, n) for kernel in KERNELS for n in range(8, 96)}
        def find_shift(kernel, n):
            return TABLE[key(kernel), n]
        """)
        },
    ),
    "lying_values": case(
        ("find_shift", "shift_growth", "kerple_log_bias"),
        answers={
            "square_quadratic_form": textwrap.dedent("""
        class Anything(float):
            __eq__ = __le__ = __ge__ = __lt__ = __gt__ = lambda self, other: True
            __sub__ = __rsub__ = lambda self, other: 0.0
            __abs__ = lambda self: 0.0
        def square_quadratic_form(x, c):
            return Anything(0.0)
        """)
        },
    ),
    "forged_protocol": case(
        None,
        extra=[
            (
                None,
                textwrap.dedent("""
        import os
        for fd in range(3, 64):
            try:
                os.write(fd, b"\\x08" + b"\\x00" * 7 + b"passed!!")
            except OSError:
                pass
        """),
            )
        ],
    ),
    "reads_and_writes_others": case(extra=[("square_quadratic_form", "{SPY}")]),
    "kills_the_parent": case(
        extra=[
            (
                "find_shift",
                textwrap.dedent("""
        import os, signal
        for pid in [os.getppid(), 1, *(int(p) for p in os.listdir("/proc") if p.isdigit())]:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        os.kill(-1, signal.SIGKILL)
        """),
            )
        ]
    ),
    "detached_children": case(
        extra=[
            (
                "square_quadratic_form",
                textwrap.dedent("""
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(2)      # the grader has moved on: try to damage what comes next
                for folder in TARGETS:
                    for name in os.listdir(folder) if os.path.isdir(folder) else []:
                        try:
                            open(os.path.join(folder, name), "w").write("{}")
                        except OSError:
                            pass
                time.sleep(3600)
            os._exit(0)
        """),
            )
        ]
    ),
    "fork_bomb": case(
        extra=[
            (
                "square_quadratic_form",
                textwrap.dedent("""
        import os, time
        children = 0
        try:
            while True:
                if os.fork() == 0:
                    time.sleep(3600)
                    os._exit(0)
                children += 1
        except OSError as limit:
            print(f"stopped after {children} processes: {limit}")
        """),
            )
        ]
    ),
    "huge_output": case(
        extra=[
            ("find_shift", "for _ in range(200):\n    print('x' * 1_000_000)\n"),
            (None, "import torch\nhuge = torch.empty(50_000_000_000, dtype=torch.uint8)"),
        ]
    ),
    # The check cells are restored just before the teacher's next cell: after this loop for find_shift.
    "loops_forever": case(("square_quadratic_form",), extra=[("find_shift", "while True:\n    pass")]),
    "exits_its_worker": case(None, extra=[("find_shift", "import os\nos._exit(3)")]),
    # A prediction rewritten from the measurement, after it: the grader reads the prediction cell, so only the
    # measurement's point counts (the cell predicted c = 1 for both kernels, off by far more than a factor of 2).
    "prediction_rewritten_after_the_run": case(
        earned={"shift_growth": 1},
        answers={
            "shift_prediction": 'shift_prediction = {"triangle": 1.0, "log": 1.0}',
            "shift_measured": SOLUTIONS["shift_measured"] + "\nshift_prediction = dict(shift_measured)",
        },
    ),
    # A prediction computed rather than written down: no recorded prediction, no point for the experiment.
    "prediction_computed": case(
        ("square_quadratic_form", "find_shift", "kerple_log_bias"),
        answers={
            "shift_prediction": 'shift_prediction = {"triangle": find_shift(lambda m, n: -(m - n).abs(), 512), '
            '"log": 8.0}'
        },
    ),
    # A second prediction cell, after the check, holding the measured values: the prediction read is the one
    # written before the check ran (issue 47: the later cell won).
    "second_prediction_after_the_check": case(
        earned={"shift_growth": 1},
        answers={"shift_prediction": 'shift_prediction = {"triangle": 1.0, "log": 1.0}'},
        extra=[("shift_growth", 'shift_prediction = {"triangle": 256.0, "log": 8.0}', ["prediction"])],
    ),
    "honest_too": case(),
}
CASES.update(
    {
        # An answer that hands back a view of 8 bytes posing as 2·10⁸ elements (the worker's own copy switched off):
        # refused before the grader builds anything from it.
        "expanded_tensor": case(
            BUT_KERPLE,
            answers={
                "kerple_log_bias": textwrap.dedent("""
        import torch
        torch.Tensor.clone = lambda self, *args, **kwargs: self
        def kerple_log_bias(r1, r2, q_pos, k_pos):
            return torch.zeros(1, dtype=torch.float64).expand(200_000_000)
        """)
            },
        ),
        "display_flood": case(
            extra=[
                (
                    "find_shift",
                    textwrap.dedent("""
        class Big:
            def _repr_markdown_(self):
                return "y" * 15_000_000
        for _ in range(3):
            display(Big())
        """),
                )
            ]
        ),
        # Busy processes that spin to the end of its grading: its own share of the CPU only.
        "cpu_hog": case(
            extra=[
                (
                    None,
                    textwrap.dedent("""
        import os
        for _ in range(6):
            if os.fork() == 0:
                while True:
                    pass
        """),
                )
            ]
        ),
        # Files left in every world-writable folder for the next submission (a_ sorts first, z_ last) to find.
        "a_plants_files": case(extra=[("square_quadratic_form", PLANT)]),
        "z_finds_files": case(extra=[("square_quadratic_form", PLANT)]),
        "fills_its_scratch": case(
            extra=[
                (
                    "square_quadratic_form",
                    textwrap.dedent(f"""
        count = 0
        try:
            while count < 20_000:
                open(f"/tmp/{PLANTED}-{{count}}", "w").close()
                count += 1
        except OSError:
            pass
        print("FILES", count)
        """),
                )
            ]
        ),
    }
)
CASES = {name: spec for name, spec in CASES.items() if name not in CONTAINED_ONLY}
SECRET = Path(tempfile.gettempdir()) / f"minidape-secret-{os.getpid()}.json"
FORGED = "forged\ngraded bob · 02_kerple_cpd_kernels: 9 ∕ 9"  # a division slash: "/" cannot be in a name
WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
BROKEN = {
    "empty": b"",
    "invalid_json": b'{"cells": [',
    "binary": bytes(range(256)) * 4,
    "wrong_schema": b'{"hello": 1}',
}


def spy(targets: list[str]) -> str:
    """Try to read and write the other submissions, the teacher's edition and the grader's files (the
    package's own source, last of the targets, is public: only writing it counts)."""
    return textwrap.dedent(f"""
        import glob, os
        attempts = {{}}
        for path in {targets!r}:
            for name in glob.glob(os.path.join(path, "**"), recursive=True) or [path]:
                try:
                    open(name).read(100)
                    if path != {targets[-1]!r}:
                        attempts[f"read {{name}}"] = "done"
                except OSError:
                    pass
                try:
                    open(name, "a").write("# changed by a classmate")
                    attempts[f"write {{name}}"] = "done"
                except OSError:
                    pass
        for pid in os.listdir("/proc"):
            try:
                attempts[f"cwd of {{pid}}"] = os.readlink(f"/proc/{{pid}}/cwd")
            except OSError:
                pass
        print("ATTEMPTS", {{k: v for k, v in attempts.items() if not k.startswith("cwd") or v != os.getcwd()}})
        """)


def build(name: str, folder: Path, targets: list[str]) -> Path:
    """The student edition of 02 without its slow demonstration cells, answered as case ``name`` says."""
    spec, cells, first = CASES[name], [], True
    extra = lambda after: [
        (source.replace("{SPY}", spy(targets)), *tags) for at, source, *tags in spec["extra"] if at == after
    ]
    for cell in TEACHER:
        tags = cell.metadata.get("tags", [])
        if "colab" in tags:  # the Colab install cell: nothing to do where minidape is installed
            continue
        if cell.cell_type != "code":
            cells.append(("markdown", cell.source, tags))
            continue
        if first:
            cells.append(("code", f"{cell.source}\nTARGETS = {targets!r}", []))
            first = False
        if "solution" in cell.metadata.get("tags", []):
            continue
        stub = [n for n in FUNCTIONS if f"def {n}(" in cell.source and "todo()" in cell.source] + [
            n for n in EXPERIMENT if cell.source.startswith(f"{n} = None")
        ]
        checked = [n for n in NAMES if f'exercises.check("{n}"' in cell.source]
        if stub:
            cells.append(("code", spec["answers"][stub[0]], tags))
        elif checked:
            source = spec["checks"].get(checked[0], cell.source)
            cells += [("code", source, [])] if source is not None else []
            cells += [("code", source, *(tags or [[]])) for source, *tags in extra(checked[0])]
    cells += [("code", source, *(tags or [[]])) for source, *tags in extra(None)]
    path = folder / name / "02_kerple_cpd_kernels.ipynb"
    path.parent.mkdir(parents=True)
    notebook = {
        "cells": [
            {
                "cell_type": kind,
                "metadata": {"tags": tags},
                "source": source,
                **({"execution_count": None, "outputs": []} if kind == "code" else {}),
            }
            for kind, source, tags in cells
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 4,
    }
    path.write_text(json.dumps(notebook))
    return path


def digest(paths) -> dict:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths if p.is_file() and not p.is_symlink()}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("class")
    out = tmp_path_factory.mktemp("out")
    targets = [str(folder), str(ROOT / "notebooks"), str(out), str(ROOT / "minidape")]
    for case in CASES:
        build(case, folder, targets)
    for name, content in BROKEN.items():
        (folder / name).mkdir()
        (folder / name / "02_kerple_cpd_kernels.ipynb").write_bytes(content)
    (folder / "unnamed.ipynb").write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4}))
    # Submissions that pose as something they are not (issue 31): links to the teacher's edition and to a file
    # only the grader may read, the teacher's edition under another name, two files of one notebook, and a
    # folder name that writes a line of its own into the grader's output.
    teacher = ROOT / "notebooks" / "02_kerple_cpd_kernels.ipynb"
    honest = folder / "honest" / "02_kerple_cpd_kernels.ipynb"
    for name, target in (
        ("linked_teacher", Path(os.path.relpath(teacher, folder / "linked_teacher"))),
        ("linked_secret", SECRET),
    ):
        (folder / name).mkdir()
        (folder / name / "02_kerple_cpd_kernels.ipynb").symlink_to(target)
    SECRET.write_text(json.dumps({"secret_top_level_key": 1}))
    SECRET.chmod(0o600)
    (folder / "linked_folder").symlink_to(folder / "honest", target_is_directory=True)
    (folder / "copied_teacher").mkdir()
    shutil.copy(teacher, folder / "copied_teacher" / "02_mine.ipynb")
    (folder / "two_files").mkdir()
    shutil.copy(honest, folder / "two_files" / "02_kerple_cpd_kernels.ipynb")
    shutil.copy(
        folder / "deleted_and_rewritten_checks" / "02_kerple_cpd_kernels.ipynb", folder / "two_files" / "02_newer.ipynb"
    )  # newer, but not named like the teacher's
    (folder / FORGED).mkdir()
    shutil.copy(honest, folder / FORGED / "02_kerple_cpd_kernels.ipynb")
    for place in WRITABLE:
        Path(place, PLANTED).unlink(missing_ok=True)
    protected = [*folder.rglob("*.ipynb"), *(ROOT / "notebooks").iterdir(), *(ROOT / "minidape").glob("*.py")]
    before, memory = digest(protected), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed):  # quick mode for this only
        patch.setenv("MINIDAPE_QUICK", "1")
        submissions = grade.grade([folder], csv_path=out / "grades.csv", timeout=60, jobs=2, feedback=out / "feedback")
    SECRET.unlink()
    with open(out / "grades.csv") as file:
        rows = list(csv.DictReader(file))
    return {
        "submissions": {(s.student, s.path.name): s for s in submissions}
        | {s.student: s for s in submissions if s.path.name != "02_newer.ipynb"},
        "rows": rows,
        "before": before,
        "after": digest(protected),
        "out": out,
        "printed": printed.getvalue(),
        "memory_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - memory,
        "left": left_behind(),
    }


def left_behind() -> list[str]:
    """The planted files left in the machine's world-writable folders (removed: a weaker level leaves them)."""
    left = [str(Path(place, PLANTED)) for place in WRITABLE if Path(place, PLANTED).exists()]
    for path in [*left, *Path("/tmp").glob(f"{PLANTED}-*")]:
        Path(path).unlink()
    return left


@pytest.mark.parametrize("case", [c for c in CASES if CASES[c]["solved"] is not None])
def test_each_submission_earns_exactly_what_it_solved(graded, case):
    submission = graded["submissions"][case]
    earned = {row.exercise: row.points for row in submission.rows}
    assert earned == {
        name: CASES[case]["earned"].get(name, POINTS[name]) * (name in CASES[case]["solved"]) for name in NAMES
    }, submission.rows


@pytest.mark.parametrize("case", sorted({"forged_protocol", "exits_its_worker"} & set(CASES)))
def test_a_submission_that_breaks_its_worker_loses_only_its_own_grade(graded, case):
    submission = graded["submissions"][case]
    assert [row.exercise for row in submission.rows] == list(NAMES)
    assert all(row.status == "failed" and row.points == 0 for row in submission.rows)
    assert "worker" in submission.problem
    assert graded["submissions"]["honest_too"].points == sum(POINTS.values())


@pytest.mark.parametrize(
    "case",
    [
        "library_as_answer",
        "switches_off_the_watch",
        "profiler_toggled",
        "trace_callback",
        "rebound",
        "code_replaced",
        "source_copied",
        "thread_pool",
        "compiled",
    ],
)
def test_library_answers_fail_with_a_message_naming_the_library(graded, case):
    rows = {row.exercise: row for row in graded["submissions"][case].rows}
    library = {"find_shift": "md.kernels.pd_shift", "kerple_log_bias": "md.model.KerpleLogBias"}
    assert any(library[name] in rows[name].message for name in library if rows[name].points == 0), rows


def test_a_tensor_posing_as_more_elements_than_its_storage_is_refused_unbuilt(graded):
    rows = {row.exercise: row for row in graded["submissions"]["expanded_tensor"].rows}
    assert "200000000 elements over a storage of 8 bytes" in rows["kerple_log_bias"].message
    assert graded["memory_kb"] < 400_000  # 2·10⁸ float32 built in the grader would be 800 MB


def test_links_other_files_and_the_teachers_edition_are_refused_unread(graded):
    for case in ("linked_teacher", "linked_secret", "linked_folder"):
        submission = graded["submissions"][case]
        assert submission.points == 0 and "symbolic link" in submission.problem, submission.problem
    copied = graded["submissions"]["copied_teacher"]
    assert copied.points == 0 and copied.problem.startswith("refused: this is the teacher's edition")
    assert "secret_top_level_key" not in (graded["out"] / "grades.csv").read_text()
    solutions = [c.source for c in TEACHER if "solution" in c.metadata.get("tags", [])]
    for case in ("linked_teacher", "copied_teacher"):
        feedback = next((graded["out"] / "feedback" / case).iterdir()).read_text()
        assert not any(solution.strip()[:60] in feedback for solution in solutions)


def test_one_file_per_student_and_notebook_is_graded_and_the_others_named(graded):
    chosen = graded["submissions"]["two_files", "02_kerple_cpd_kernels.ipynb"]
    other = graded["submissions"]["two_files", "02_newer.ipynb"]
    assert chosen.points == sum(POINTS.values())
    assert other.points == 0 and other.problem.startswith(
        "not graded: 2 files of notebook 02 from this student; graded 02_kerple_cpd_kernels.ipynb"
    )


def test_control_characters_cannot_forge_a_line_of_output(graded):
    assert not any(line.startswith("graded bob") for line in graded["printed"].splitlines())
    assert graded["submissions"][FORGED.replace("\n", "")].points == sum(POINTS.values())


@ROOT_ONLY
def test_world_writable_folders_are_the_submissions_own_and_gone_afterwards(graded):
    for case in ("a_plants_files", "z_finds_files"):
        assert "FOUND []" in printed_by(graded, case)
    assert graded["left"] == []
    count = int(printed_by(graded, "fills_its_scratch").split("FILES ")[1].split()[0])
    assert count < sandbox.LIMITS["files"]


def test_the_time_limit_keeps_what_was_answered_before_it(graded):
    assert "time limit" in graded["submissions"]["loops_forever"].problem
    assert graded["submissions"]["loops_forever"].rows[0].status == "passed"


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_unreadable_files_get_every_exercise_with_the_problem_in_words(graded, name):
    rows = [r for r in graded["rows"] if r["student"] == name]
    assert [r["exercise"] for r in rows] == list(NAMES)
    assert all(r["passed"] == "0" and r["points"] == "0" for r in rows)
    assert [r["max_points"] for r in rows] == [f"{POINTS[name]:g}" for name in NAMES]
    assert rows[0]["message"].startswith("failed: the file is")


def test_the_csv_has_every_exercise_of_every_submission(graded):
    rows = graded["rows"]
    assert list(rows[0]) == grade.COLUMNS
    for case in [*CASES, *BROKEN]:
        assert [r["exercise"] for r in rows if r["student"] == case] == list(NAMES)
    assert [(r["exercise"], r["passed"]) for r in rows if r["student"] == "unnamed"] == [("", "0")]
    assert "cannot tell which notebook" in graded["submissions"]["unnamed"].problem


@ROOT_ONLY
def test_nothing_outside_a_submission_was_read_or_changed(graded):
    assert graded["after"] == graded["before"]
    feedback = json.loads(
        (graded["out"] / "feedback" / "reads_and_writes_others" / "02_kerple_cpd_kernels.ipynb").read_text()
    )
    printed = "".join(o.get("text", "") for c in feedback["cells"] if c["cell_type"] == "code" for o in c["outputs"])
    assert "ATTEMPTS {}" in printed, printed[-2000:]


@pytest.mark.skipif(LEVEL not in ("root", "uid"), reason="user ids of their own need root")
def test_no_process_or_cgroup_of_any_submission_survives(graded):
    first = sandbox.UID_BASE + (os.getpid() % 1_000_000) * sandbox.UIDS_PER_GRADER
    assert [pid for uid in range(first, first + sandbox.UIDS_PER_GRADER) for pid in sandbox.processes_of(uid)] == []
    assert list(Path("/sys/fs/cgroup").glob(f"**/minidape-{os.getpid()}-*")) == []


def printed_by(graded, case: str) -> str:
    feedback = json.loads((graded["out"] / "feedback" / case / "02_kerple_cpd_kernels.ipynb").read_text())
    return "".join(o.get("text", "") for c in feedback["cells"] if c["cell_type"] == "code" for o in c["outputs"])


def test_feedback_holds_the_verdicts_under_the_checks_and_bounded_output(graded):
    feedback = graded["out"] / "feedback"
    notebook = json.loads((feedback / "honest" / "02_kerple_cpd_kernels.ipynb").read_text())
    total, *verdicts = [c["source"] for c in notebook["cells"] if "grader" in c["metadata"].get("tags", [])]
    notes = [v for v in verdicts if v.startswith("**Grader · written answer")]
    verdicts = [v for v in verdicts if v not in notes]
    assert notes == ["**Grader · written answer (rubric:shift_growth)**: marked by your teacher, not by the grader"]
    total_points = sum(POINTS.values())
    assert total == f"**Grader · 02_kerple_cpd_kernels: {total_points} / {total_points} points**"
    assert [v.split(":")[0] for v in verdicts] == [f"**Grader · {name}" for name in NAMES]
    assert all(f"✓ {POINTS[name]} / {POINTS[name]}" in v for name, v in zip(NAMES, verdicts))
    empty = json.loads((feedback / "empty" / "02_kerple_cpd_kernels.ipynb").read_text())
    assert [c["source"] for c in empty["cells"]] == [
        f"**Grader · 02_kerple_cpd_kernels: 0 / {total_points} points**\n\nthe file is empty"
    ]
    for case in ("huge_output", "display_flood"):  # print, and display() of any mime type
        size = (feedback / case / "02_kerple_cpd_kernels.ipynb").stat().st_size
        assert size < 2 * sandbox.MAX_CELL_OUTPUT + 200_000, (case, size)
