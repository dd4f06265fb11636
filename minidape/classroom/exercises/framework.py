"""The machinery of the notebooks' exercise checks (the checks themselves: one module per notebook beside this one).

Every exercise of notebooks 01-08 has a name and one check. A notebook cell calls

    exercises.check("kerple_log_bias", kerple_log_bias)

which prints one verdict:

* ``passed`` — the answer behaves like minidape's own implementation (or like the maths) on random inputs
  (derive exercises: drawn afresh at every check, so a table of answers cannot pass); an experiment whose
  measurement is right passes even when its recorded prediction missed, without the prediction's point;
* ``failed`` — which mistake the check recognises (or where the answer differs), and hints as a ladder: hint 1
  points to the idea the exercise rests on, hint 2 to the step that goes wrong (the recognised mistake's own hint
  when there is one). In a notebook a failed check shows hint 1, and hint 2 from the next failed check of the same
  exercise on; the grader's verdict shows both. No hint gives the formula or the code of the answer
  (tests/test_hints.py searches them all for the worked solutions' tokens);
* ``partly right`` — some parts of an exercise with parts earned their points, others did not;
* ``not done yet`` — the answer is still the stub (it calls :func:`todo` or is ``None``). A check never passes
  on a stub, and a stub never stops the notebook, so the student edition runs from top to bottom.

Each verdict comes with points (``Exercise.points``; a checker returns a :class:`Credit` for less).
Implementations are compared by behaviour, never by the names or order of minidape's internal parameters:
modules are built from the same config and handed minidape's weights by role (:func:`_hand_over`), and a
difference is named as a known mistake when the check recognises it (:func:`_compare`). A check touches an
answer only by calling it with data and through the small helpers of "how a check touches an answer" below.

:func:`summary` ends each notebook: a table of the verdicts, and an error if an answer is wrong (so a broken
worked solution fails ``make test``, which also sets ``MINIDAPE_EXPECT_EXERCISES`` to ``all`` or ``none``).

Grading (:mod:`minidape.classroom.grade`) uses the same checks, but never in the student's process: there :func:`check`
only records its answer in :data:`answers`, and the grader later runs :func:`verdict` in its own process with
the answers as :class:`minidape.classroom.sandbox.Remote` handles. A check therefore touches an answer only by calling
it with data (tensors, numbers, strings, configs, picklable objects) and through the helpers of "how a check
touches an answer" below, each of which works on a local object and on a handle alike. What an answer returns
comes back as data.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass

import torch

PASSED, PARTLY, FAILED, NOT_DONE = "passed", "partly right", "failed", "not done yet"
NEEDS_FULL = "needs full mode"  # graded in quick mode, an experiment the grader cannot judge there
EXPECT = "MINIDAPE_EXPECT_EXERCISES"  # "all" (worked solutions) or "none" (student edition): see summary()


class NotDone(NotImplementedError):
    """Raised by an exercise's stub: the student has not written this part yet."""


class Wrong(Exception):
    """Raised by a check: the answer runs, but does not do what the exercise asks. The message says how; ``hint``
    (when the check recognised a known mistake) is the second rung of the hint ladder, in place of the exercise's
    step (a pair replaces both rungs). ``code`` names the mistake the same way whatever the random inputs (the
    class summary counts mistakes by it): given, or made from the message's words without its numbers, quoted
    values and bracketed parts."""

    def __init__(self, message: str, hint: str | tuple[str, str] | None = None, code: str | None = None):
        super().__init__(message)
        self.hint = hint
        self.code = code or mistake_code(message)


def mistake_code(message: str) -> str:
    """``"your ratio 0.19 is upside down"`` -> ``"your-ratio-is-upside-down"``: short and stable, the words that
    do not change with the inputs (numbers, quoted values and anything in brackets dropped) of the mistake itself
    -- a message names where first and the mistake after its last colon ("for 3 random points ... your c is
    2 · the shift: one doubling too many" -> ``one-doubling-too-many``) -- at most the last five."""
    text = message.split("\n")[0]
    for pattern in (r"'[^']*'", r'"[^"]*"', r"\([^()]*\)", r"\[[^\[\]]*\]", r"\{[^{}]*\}", r"\([^()]*\)"):
        text = re.sub(pattern, " ", text)
    mistake = text.rpartition(": ")[2]
    words = [w for w in re.findall(r"[a-z_]+", mistake.lower()) if not re.fullmatch(r"e|x|k|t|h|w|d|i|j", w)]
    if not words:  # nothing but numbers after the colon: the words before it
        words = [w for w in re.findall(r"[a-z_]+", text.lower()) if not re.fullmatch(r"e|x|k|t|h|w|d|i|j", w)]
    return "-".join(words[-5:]) or "wrong"


class NeedsFullMode(Exception):
    """Raised by a check that cannot judge this answer in quick mode (the measurement needs the full budget)."""


# When the grader runs a submission, its answers live in a worker process (``classroom.sandbox``, which builds on
# this module): the checks hold handles on them, and the student's code fails in two more ways.


class RemoteAnswer:
    """Base of the grader's handles on answers that live in its worker (``sandbox.Remote``)."""


class StudentError(Exception):
    """The student's code raised (in the worker): the message names its type and text."""


class WorkerGone(RuntimeError):
    """The worker ended, broke the protocol or did not answer in time."""


@dataclass(frozen=True)
class Credit:
    """What a checker returns when an answer earns less than the exercise's points: the points earned, a note,
    and whether the answer itself is right (``answer_right``: only a prediction missed, so the exercise still
    counts as passed) or only some of its parts are (status "partly right")."""

    points: float
    note: str = ""
    answer_right: bool = True


class ExerciseFailed(AssertionError):
    """Raised by :func:`summary` when a checked answer is wrong."""


def todo(what: str = "this exercise") -> None:
    """The body of a stub: ``def my_function(...): todo()``."""
    raise NotDone(f"{what} is not written yet")


@dataclass(frozen=True)
class Exercise:
    name: str
    notebook: str  # "01" .. "08"
    kind: str  # "derive", "implement" or "experiment"
    title: str
    hint: tuple[str, str]  # the ladder: (hint 1, the idea; hint 2, the step), never the answer's formula or code
    checker: Callable
    points: int = 1  # what a fully right answer earns; a checker may return a Credit for less


EXERCISES: dict[str, Exercise] = {}
results: dict[str, str] = {}  # this session's verdicts, by exercise name
failures: dict[str, int] = {}  # this session's failed checks, by exercise name: the second shows hint 2 too
earned: dict[str, float] = {}  # this session's points, by exercise name
answers: dict | None = None  # the grader's worker sets {}: check() then records (answer, options) by name
# The grader sets the teacher's reference measurements (minidape/classroom/references.json, see helpers._measurement):
# {"full": {exercise: {...}}, "quick": {...}}; None in a notebook, where an experiment uses its own run.
references: dict | None = None
CHECK_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # where answers' modules run (the grader sets "cpu")
# Per experiment on the student's own code (06), how the grader measures it itself (registered by that notebook's
# checks): ``measure(answers, channel)``, from the submission's recorded answers (handles on its worker's objects)
# and the checks' channel into that worker (its ``deadline`` the end of their time), gives what the grader binds
# to the checker's ``recomputed`` parameter, whatever the call passed (see ``grade.Grader._judge``).
MEASURED_BY_GRADER: dict[str, Callable] = {}


def _exercise(notebook: str, kind: str, title: str, hint: tuple[str, str], points: int = 1):
    def register(checker):
        EXERCISES[checker.__name__] = Exercise(checker.__name__, notebook, kind, title, hint, checker, points)
        return checker

    return register


# Per exercise, minidape's own implementation of what it asks for (module-level functions and classes). The grader
# judges the exercise on a run whose minidape has these refusing (``sandbox.censor``): calling any of them, however
# reached, raises an error naming it. Experiments answer with data (measurements, predictions, configs): nothing of
# theirs is called, so nothing is forbidden; a derive exercise that minidape does not compute forbids nothing.
LIBRARY: dict[str, tuple[str, ...]] = {
    # 01
    "sinusoidal_table": ("minidape.model.SinusoidalPositions",),
    "rope_score": ("minidape.model.RotaryEmbedding", "minidape.model.apply_rotary"),
    "alibi_bias": ("minidape.model.ALiBiBias", "minidape.model.alibi_slopes"),
    "alibi_entropy": (),
    # 02
    "square_quadratic_form": ("minidape.kernels.gram",),
    "find_shift": ("minidape.kernels.pd_shift",),
    "shift_growth": (),
    "kerple_log_bias": ("minidape.model.KerpleLogBias",),
    # 03
    "rope_ratio": (),
    "protocols_from_curve": (),
    "running_mean": (),
    # 04
    "dape_refiner": (
        "minidape.model.DAPERefiner",
        "minidape.model.DAPEConcatRefiner",
        "minidape.model.HeadMLP",
        "minidape.fast_refiners.dape",
        "minidape.fast_refiners.dape_concat",
        "minidape.fast_refiners.head_mlp",
        "minidape.fast_refiners.cell_mlp",
        "minidape.native.forward",
    ),
    "dape_cost": (
        "minidape.model.DAPERefiner",
        "minidape.model.DAPEConcatRefiner",
        "minidape.model.DAPEAddRefiner",
        "minidape.model.HeadMLP",
    ),
    "far_attention": (),
    "locality": (),
    # 05
    "receptive_keys": ("minidape.model.ConvRefiner", "minidape.fast_refiners.conv"),
    "conv_refiner": ("minidape.model.ConvRefiner", "minidape.fast_refiners.conv"),
    "leakage": (),
    # 06
    "my_kernel": ("minidape.kernels.log_kernel", "minidape.kernels.power_kernel"),
    "far_mass": (),
    "my_bias": (
        "minidape.model.ALiBiBias",
        "minidape.model.T5Bias",
        "minidape.model.KerpleLogBias",
        "minidape.model.KerplePowerBias",
        "minidape.model.FIREBias",
        "minidape.kernels.log_kernel",  # the same biases, written as kernels
        "minidape.kernels.power_kernel",
    ),
    "my_runs": (),
    "best_run": (),
    # 07
    "addition_sample": ("minidape.lab.tasks.BinaryAddition", "minidape.lab.tasks._BinaryOperation"),
    "output_length": (
        "minidape.lab.tasks.get_task",
        "minidape.lab.tasks.ReverseString",
        "minidape.lab.tasks.DuplicateString",
        "minidape.lab.tasks.ComputeSqrt",
        "minidape.lab.tasks.BinaryMultiplication",
        "minidape.lab.tasks.ParityCheck",
    ),
    "masked_accuracy": ("minidape.lab.tasks.accuracy", "minidape.lab.tasks.output_mask"),
    "shuffle_invariance": (),
    # 08
    "fox_bias": ("minidape.model.ForgetGateBias",),
    "focus_temperature": (),
    "where_fox_forgets": (),
    "stick_breaking_weights": ("minidape.model.StickBreakingAttention",),
    "path_scores": ("minidape.model.PaTHAttention",),
}


# Per notebook, the optional parts of minidape (``sandbox.censor.OPTIONAL``) that its judged runs may import: what
# its cells up to its checks use. Every other one is absent from a judged run's package copy (not refusing: not
# there), with the command line and the checks themselves; the core and the lab's training are always there.
JUDGED_IMPORTS: dict[str, tuple[str, ...]] = {
    "01": ("lab.plots",),
    "02": ("kernels", "lab.plots"),
    "03": ("lab.plots",),
    "04": ("lab.plots",),
    "05": ("lab.che", "lab.tasks", "lab.plots"),
    "06": ("kernels", "lab.che", "lab.tasks", "lab.plots", "study"),
    "07": ("lab.che", "lab.tasks", "lab.plots"),
    "08": ("lab.plots", "study"),
}


def exercises_of(notebook: str) -> list[Exercise]:
    """The exercises of one notebook ("01" .. "08"), in order."""
    return [exercise for exercise in EXERCISES.values() if exercise.notebook == notebook]


class Verdict(tuple):
    """(status, message, points earned), and ``code``: the stable name of the mistake ("" when none)."""

    def __new__(cls, status: str, message: str, points: float, code: str = ""):
        made = super().__new__(cls, (status, message, points))
        made.code = code
        return made


def _ladder(hint) -> tuple[str, ...]:
    return (hint,) if isinstance(hint, str) else tuple(hint)


def _hints(exercise: Exercise, mistake, rungs: int) -> str:
    """The first ``rungs`` hints for a failed answer: the exercise's idea, then the recognised mistake's hint (or
    the exercise's step); with one rung shown, a line saying that the next failed check adds the second."""
    ladder = _ladder(exercise.hint)
    ladder = _ladder(mistake) if isinstance(mistake, tuple) else ladder[:1] + ((mistake,) if mistake else ladder[1:])
    shown = "".join(f"\n    hint {rung}: {text}" for rung, text in enumerate(ladder[:rungs], 1))
    return shown + (
        "\n    (a second failed check of this exercise adds hint 2, the step)" if rungs < len(ladder) else ""
    )


def verdict(name: str, *answer, **options) -> Verdict:
    """Run exercise ``name``'s check on an answer: (status, message, points earned) and its mistake code, with
    both hints of a failure. Random inputs are drawn afresh on every call (a seed nobody chose), and the caller's
    random stream is left as it was."""
    return _verdict(name, answer, options, rungs=2)


def _verdict(name: str, answer: tuple, options: dict, rungs: int) -> Verdict:
    exercise = EXERCISES[name]
    code = ""
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(secrets.randbits(63))
            note = exercise.checker(*answer, **options)
        credit = note if isinstance(note, Credit) else Credit(exercise.points, note or "")
        status = PASSED if credit.answer_right else PARTLY
        points = min(credit.points, exercise.points)
        message = f"{status}, {points:g} of {exercise.points} points" + (f". {credit.note}" if credit.note else "")
    except NotImplementedError:
        status, points, message, code = NOT_DONE, 0, "not done yet (the stub is still there)", "not-done"
    except NeedsFullMode as needs:
        status, points, message, code = NEEDS_FULL, 0, f"not judged in quick mode: {needs}", "needs-full-mode"
    except Wrong as wrong:
        status, points, message = FAILED, 0, f"not yet right: {wrong}{_hints(exercise, wrong.hint, rungs)}"
        code = wrong.code
    except Exception as error:  # the student's code itself failed: say where, never stop the notebook
        raised = (
            f"your code's worker {error}"
            if isinstance(error, WorkerGone)
            else f"your code raised {error if isinstance(error, StudentError) else f'{type(error).__name__}: {error}'}"
        )
        status, points, message = FAILED, 0, f"{raised}{_hints(exercise, None, rungs)}"
        kind = re.match(r"\w*", str(error)).group() if isinstance(error, StudentError) else type(error).__name__
        code = "worker-gone" if isinstance(error, WorkerGone) else f"raised-{kind or 'error'}"
    return Verdict(status, message, points, code)


def check(name: str, *answer, **options) -> bool:
    """Check the answer to exercise ``name``; print the verdict and return True when it passed."""
    if name not in EXERCISES:
        raise ValueError(f"unknown exercise {name!r}; the exercises are: {', '.join(EXERCISES)}")
    if answers is not None:  # graded: the grader judges this answer in its own process
        answers[name] = (answer, options)
    exercise = EXERCISES[name]
    status, message, points = _verdict(name, answer, options, rungs=1 + failures.get(name, 0))
    results[name], earned[name] = status, points
    failures[name] = failures.get(name, 0) + 1 if status == FAILED else 0
    mark = {PASSED: "✓", PARTLY: "±", FAILED: "✗", NOT_DONE: "…", NEEDS_FULL: "?"}[status]
    print(f"{mark} exercise {exercise.notebook}·{name} ({exercise.kind}): {message}")
    return status == PASSED


def passed(name: str) -> bool:
    """Whether exercise ``name`` passed its check in this session."""
    return results.get(name) == PASSED


def summary(notebook: str) -> dict[str, str]:
    """Print this notebook's verdicts; raise :class:`ExerciseFailed` if an answer was checked and is wrong."""
    verdicts = {exercise.name: results.get(exercise.name, "not checked") for exercise in exercises_of(notebook)}
    width = max(map(len, verdicts))
    total = sum(EXERCISES[name].points for name in verdicts)
    print(
        f"notebook {notebook}: {sum(v == PASSED for v in verdicts.values())} of {len(verdicts)} exercises passed, "
        f"{sum(earned.get(name, 0) for name in verdicts):g} of {total} points"
    )
    for name, verdict in verdicts.items():
        score = f"{earned.get(name, 0):g}/{EXERCISES[name].points}"
        print(f"  {name:<{width}}  {EXERCISES[name].kind:<10}  {score:>5}  {verdict}")
    wrong = [name for name, verdict in verdicts.items() if verdict == FAILED]
    if wrong:
        raise ExerciseFailed(f"exercises with a wrong answer: {', '.join(wrong)} (see their check cells above)")
    # `make test` runs both editions and says what to expect: every check passes on the worked solutions, and
    # none on the stubs of the student edition (a check that passed there would accept an empty answer).
    expected = os.environ.get(EXPECT)
    if expected == "all" and any(verdict != PASSED for verdict in verdicts.values()):
        raise ExerciseFailed(f"{EXPECT}=all, but not every exercise of notebook {notebook} passed: {verdicts}")
    if expected == "none" and any(verdict == PASSED for verdict in verdicts.values()):
        raise ExerciseFailed(f"{EXPECT}=none, but a check passed on a stub in notebook {notebook}: {verdicts}")
    return verdicts
