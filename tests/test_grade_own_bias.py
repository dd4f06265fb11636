"""Exercise 6.5 (best_run) graded in full mode: the grader trains the submission's runs itself and judges the
answer against that measurement, whatever the submission's own cells computed, typed or patched.

The submissions are notebook 06's worked solutions on the smallest model (``config()`` at 1 layer, 16 wide:
the grader trains the configs of ``my_runs`` at the notebook's full budget, 400 steps, so a small config keeps
these tests small), its five-seed study left out. One ``grade`` run grades three of them: honest, one with its
``last_k`` typed in, one that patches ``md.train`` and ``md.evaluate`` (and passes a measurement of its own to the
check through a call the grader does not see as a check cell).
"""

import csv
import json
import math
import re
import time
from types import SimpleNamespace

import jupytext
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from test_grade import EDITIONS, ROOT, notebook_file

import minidape as md
from minidape import exercises, grade
from minidape.classroom import sandbox
from minidape.classroom.exercises import your_own_bias
from minidape.classroom.notebook import books_budget

OTHERS = ("my_kernel", "far_mass", "my_bias", "my_runs")  # 06's other exercises: they keep their marks
TYPED = "{length: 9.0 if name == 'kerple_log' else 3.0 for length in LENGTHS}"  # a table no run measured
PATCHED = """
real_train = md.train
def train(cfg, *args, steps=None, **options):      # 2 steps instead of the budget's
    return real_train(cfg, *args, steps=2, **options)
md.train = train
md.evaluate.perplexity_by_length = lambda model, tokens, lengths, **options: {
    length: 2.0 if model.cfg.refiner == "dape" else 5.0 for length in lengths}
"""
SNEAKED = (  # a check call restore() does not see: its `recomputed` is replaced by the grader's
    'getattr(exercises, "che" + "ck")("best_run", best_prediction, best_run, last_k, LENGTHS[-1], recomputed=None)'
)


def submission_06(path, changes=(), inserted=None, appended=None):
    """Notebook 06's worked solutions as a student's notebook on the smallest model, without the study; each of
    ``changes`` (first line of a teacher's cell, new source) replaces that cell; ``inserted`` goes before the
    training cell, ``appended`` at the end."""
    changes = dict(changes)
    cells = []
    for cell in jupytext.read(ROOT / "notebooks" / "06_your_own_bias.py").cells:
        source, tags = cell.source, [t for t in cell.metadata.get("tags", []) if t != "solution"]
        if "growth = {name" in source or "md.study.compare(" in source:  # the worked answer's asserts; the study
            continue
        if source.startswith("runs = my_runs") and inserted:
            cells.append({"cell_type": "code", "source": inserted})
        source = changes.get(source.split("\n")[0], source)
        source = source.replace("n_layer=2, n_head=4, n_embd=64", "n_layer=1, n_head=2, n_embd=16")
        cells.append({"cell_type": cell.cell_type, "source": source, "tags": tags})
    if appended:
        cells.append({"cell_type": "code", "source": appended})
    return notebook_file(path, cells)


@pytest.fixture(scope="module")
def graded(tmp_path_factory, monkeypatch_module):
    folder = tmp_path_factory.mktemp("class")
    monkeypatch_module.setenv("MINIDAPE_QUICK", "0")
    monkeypatch_module.delenv("MINIDAPE_FAST", raising=False)  # quick mode's other name
    submission_06(folder / "ann" / "06_your_own_bias.ipynb")
    typed = f"last_k = {{name: {TYPED} for name in models or my_runs}}\nlongest = LENGTHS[-1]"
    submission_06(
        folder / "bob" / "06_your_own_bias.ipynb",
        changes=[
            (
                "runs = my_runs if exercises.passed(\"my_runs\") else {\"kerple_log\": config(\"kerple_log\"), "
                "\"alibi\": config(\"alibi\")}",
                "models, histories = {}, {}",
            ),
            (
                "last_k = {name: md.evaluate.perplexity_by_length(model, val_tokens, LENGTHS, n_windows=EVAL_WINDOWS)",
                typed,
            ),
        ],
    )
    submission_06(folder / "cem" / "06_your_own_bias.ipynb", inserted=PATCHED, appended=SNEAKED)
    out = folder / "grades.csv"
    started = time.monotonic()
    submissions = grade.grade([folder], csv_path=out, timeout=900, jobs=1, feedback=folder / "feedback")
    print(f"graded 3 submissions of 06 in full mode in {time.monotonic() - started:.0f} s")
    with open(out) as file:
        rows = {(r["student"], r["exercise"]): r for r in csv.DictReader(file)}
    return submissions, rows, folder / "feedback"


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_an_honest_submission_earns_6_5_on_the_graders_own_measurement(graded):
    submissions, rows, feedback = graded
    assert [(rows["ann", name]["passed"], rows["ann", name]["points"]) for name in OTHERS] == [
        ("1", f"{e.points:g}") for e in exercises.exercises_of("06") if e.name in OTHERS
    ]
    row = rows["ann", "best_run"]
    assert row["passed"] == "1" and float(row["points"]) >= 1, row["message"]
    # the measurement the verdict used, and where it came from: every run, by the grader, at the full budget
    assert "recomputed by the grader" in row["message"] and "steps 400, batch 16" in row["message"]
    for run in ("kerple_log", "my_bias", "dape-my_bias"):
        assert re.search(rf"[:,] {run} \d+\.\d\d,", row["message"]), row["message"]
    notebook = json.loads((feedback / "ann" / "06_your_own_bias.ipynb").read_text())
    (verdict,) = [c["source"] for c in notebook["cells"] if c["source"].startswith("**Grader · best_run")]
    assert "recomputed by the grader" in verdict


@pytest.mark.parametrize("student", ["bob", "cem"])
def test_a_typed_table_or_a_patched_training_earns_nothing_for_6_5(graded, student):
    """bob typed last_k in; cem's cells patched md.train and md.evaluate, and handed the check a `recomputed`
    of their own. Both get 0 for 6.5, with both numbers named; their other answers keep their marks."""
    submissions, rows, _ = graded
    row = rows[student, "best_run"]
    assert (row["passed"], row["points"], row["mistake"]) == ("0", "0", "measurement-not-reproduced"), row["message"]
    assert "your last_k gives kerple_log a perplexity of" in row["message"]
    assert "recomputed by the grader" in row["message"]
    assert [rows[student, name]["passed"] for name in OTHERS] == ["1"] * len(OTHERS)


# ----------------------------------------------------------------------- the parts, without a worker


class Cauchy(md.AdditiveBias):
    """The worked solution's bias, with a random start: its __init__ draws from torch's random state."""

    def __init__(self, cfg):
        super().__init__()
        self.raw_height = nn.Parameter(1.0 + 0.1 * torch.randn(cfg.n_head))
        self.log_width = nn.Parameter(torch.linspace(math.log(2), math.log(128), cfg.n_head))

    def forward(self, q_pos, k_pos):
        distance = (q_pos[:, None] - k_pos[None, :]).clamp(min=0).float()  # (Tq, Tk)
        height, width = F.softplus(self.raw_height), self.log_width.exp()  # (h,), (h,)
        return height[:, None, None] / (1 + (distance / width[:, None, None]) ** 2)  # (h, Tq, Tk)


def as_recorded(cfg):
    """A config as the grader gets it from the worker: named pe="my_bias", which its registry does not hold."""
    recorded = object.__new__(md.GPTConfig)
    vars(recorded).update({**vars(cfg), "pe": "my_bias"})
    return recorded


def test_the_graders_training_is_the_notebooks_with_the_students_bias_standing_in():
    """The grader's run of a my_bias config (its stand-in asking the student's class for the bias and for its
    parameters' gradients) measures what the notebook's cells measure with the class registered, to the bit:
    the same initial weights (those the class draws included), updates and scored windows."""
    cfg = md.GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=64, pe="kerple_log")
    answers = {"my_bias": ((Cauchy,), {}), "my_runs": (({"mine": as_recorded(cfg)},), {})}
    names, longest, source, curves = your_own_bias._grader_runs(answers, SimpleNamespace(deadline=math.inf))()
    ((run, curve),) = list(curves)
    assert (names, run, longest) == (["mine"], "mine", 1024) and "recomputed by the grader" in source
    assert not any(name.startswith("my_bias-") for name in md.PE_NAMES)  # the stand-in's name is gone
    md.register_pe("my_bias")(Cauchy)
    budget = books_budget(quick=False)
    assert curve == your_own_bias._notebook_run(md.GPTConfig(**{**vars(cfg), "pe": "my_bias"}), budget)


def judge(answers, measure, monkeypatch, prediction="b"):
    class Alive:
        alive = True

    monkeypatch.setattr(exercises.framework, "references", {"full": {}, "quick": {}})
    monkeypatch.setitem(exercises.MEASURED_BY_GRADER, "best_run", measure)
    channel = sandbox.Channel(Alive(), time.monotonic() + 60)
    return grade.Grader(EDITIONS, "none", {}, timeout=10)._judge(
        exercises.EXERCISES["best_run"], answers, channel, "", {"prediction": ("best_prediction", prediction)}
    )


TRUE = {"a": {64: 10.0, 1024: 20.0}, "b": {64: 10.0, 1024: 12.0}}


def measured(table, calls):
    def measure(answers, channel):
        def recompute():
            calls.append(channel.deadline)
            return list(table), 1024, "recomputed by the grader (a test)", (item for item in table.items())

        return recompute

    return measure


def test_the_grader_binds_its_own_measurement_whatever_the_call_passed(monkeypatch):
    monkeypatch.setenv("MINIDAPE_QUICK", "0")
    monkeypatch.delenv("MINIDAPE_FAST", raising=False)
    calls = []
    fake = lambda: (["a", "b"], 1024, "the student", (item for item in {"a": {1024: 1.0}, "b": {1024: 9.0}}.items()))  # noqa: E731
    honest = {"best_run": (("b", "b", TRUE, 1024), {"recomputed": fake})}
    row = judge(honest, measured(TRUE, calls), monkeypatch)
    assert (row.status, row.points, len(calls)) == (exercises.PASSED, 2, 1), row.message
    assert "at 1024: a 20.00, b 12.00, recomputed by the grader (a test)" in row.message
    typed = {"a": {1024: 30.0}, "b": {1024: 12.0}}  # b is still the best, but a is far from the measurement
    row = judge({"best_run": (("b", "b", typed, 1024), {})}, measured(TRUE, calls), monkeypatch)
    assert (row.status, row.points, row.code) == (exercises.FAILED, 0, "measurement-not-reproduced")
    assert "your last_k gives a a perplexity of 30 at 1024; 20 recomputed by the grader (a test)" in row.message
    other_runs = {"a": {1024: 20.0}, "c": {1024: 12.0}}
    row = judge({"best_run": (("a", "a", other_runs, 1024), {})}, measured(TRUE, calls), monkeypatch, "a")
    assert (row.points, row.code) == (0, "runs-not-my-runs")
    near = {"a": {1024: 12.5}, "b": {1024: 12.0}}  # within the margin of the measurement, whose best is a
    flipped = {"a": {64: 10.0, 1024: 12.0}, "b": {64: 10.0, 1024: 12.5}}
    row = judge({"best_run": (("b", "b", near, 1024), {})}, measured(flipped, calls), monkeypatch)
    assert (row.status, row.points) == (exercises.FAILED, 0) and "not the run with the lowest" in row.message


def test_quick_mode_grading_says_needs_full_mode_and_trains_nothing(monkeypatch):
    monkeypatch.setenv("MINIDAPE_QUICK", "1")
    calls = []
    row = judge({"best_run": (("b", "b", TRUE, 1024), {})}, measured(TRUE, calls), monkeypatch)
    assert (row.status, row.points, calls) == (exercises.NEEDS_FULL, 0, [])
    assert "MINIDAPE_QUICK=0" in row.message


def test_a_run_the_grader_cannot_train_is_named():
    cfg = md.GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=64, pe="kerple_log")
    leaky = object.__new__(md.GPTConfig)
    vars(leaky).update({**vars(cfg), "refiner": "peeks_next_key"})
    for runs, your_class, message in (
        ({"mine": leaky}, Cauchy, "refiner='peeks_next_key': the grader trains minidape's own refiners"),
        ({"mine": as_recorded(cfg)}, None, "6.3's check did not record an md.AdditiveBias class"),
    ):
        answers = {"my_bias": ((your_class,), {}), "my_runs": ((runs,), {})}
        *_, curves = your_own_bias._grader_runs(answers, SimpleNamespace(deadline=math.inf))()
        with pytest.raises(exercises.Wrong, match=message):
            next(curves)
