"""The checks of the notebooks' exercises, one module per notebook.

``framework`` is the machinery (the registry, :func:`check`, :func:`verdict`, :func:`summary`, what the grader's
worker records); ``helpers`` holds what the checks share (reading answers, drawing inputs, handing weights over to
an answer); ``positional_encodings`` (01) ... ``positions_that_read_the_data`` (08) hold each notebook's checks.
This package re-exports the names notebooks, the grader and users write as ``exercises.NAME``.

The grader's worker and the grader set two switches on ``exercises.framework`` itself, where the checks read them:
``framework.answers`` (``{}`` while a submission runs: :func:`check` then only records its answers) and
``framework.CHECK_DEVICE`` (where answers' modules run).
"""

# ruff: noqa: I001  (the notebook modules are imported in the notebooks' order: it is EXERCISES' order)
from . import framework
from .framework import (
    EXERCISES,
    EXPECT,
    FAILED,
    JUDGED_IMPORTS,
    LIBRARY,
    MEASURED_BY_GRADER,
    NEEDS_FULL,
    NOT_DONE,
    PARTLY,
    PASSED,
    Credit,
    Exercise,
    ExerciseFailed,
    NeedsFullMode,
    NotDone,
    RemoteAnswer,
    StudentError,
    Verdict,
    WorkerGone,
    Wrong,
    check,
    earned,
    exercises_of,
    mistake_code,
    passed,
    results,
    summary,
    todo,
    verdict,
)

# One module per notebook: importing each registers its checks in EXERCISES.
from . import positional_encodings, kerple_cpd_kernels, train_and_extrapolate, dape_and_cape  # noqa: F401
from . import dape_v2_convolutions, your_own_bias, chomsky_hierarchy  # noqa: F401
from . import positions_that_read_the_data  # noqa: F401
from .chomsky_hierarchy import SHUFFLE_CASES
from .helpers import _gradients_of_sum, _hand_over, _is_module, _load_parameters, _parameter_shapes

__all__ = [
    "framework",
    "EXERCISES",
    "EXPECT",
    "FAILED",
    "JUDGED_IMPORTS",
    "LIBRARY",
    "MEASURED_BY_GRADER",
    "NEEDS_FULL",
    "NOT_DONE",
    "PARTLY",
    "PASSED",
    "Credit",
    "Exercise",
    "ExerciseFailed",
    "NeedsFullMode",
    "NotDone",
    "RemoteAnswer",
    "StudentError",
    "Verdict",
    "WorkerGone",
    "Wrong",
    "check",
    "earned",
    "exercises_of",
    "mistake_code",
    "passed",
    "results",
    "summary",
    "todo",
    "verdict",
    "SHUFFLE_CASES",
    "_gradients_of_sum",
    "_hand_over",
    "_is_module",
    "_load_parameters",
    "_parameter_shapes",
]
