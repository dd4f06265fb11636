"""The ``exercises`` of a graded run: in the package copy a worker sees (``censor.package_copy``) this file is
``minidape/classroom/exercises/__init__.py``, and nothing else of the checks is there. :func:`check` only records
the answer it is given, for the grader to judge in its own process: no check, reference measurement, hint or
helper of the checks is in the student's process to call, read or copy."""

import sys

answers: dict = {}  # by exercise name: (the answer's arguments, its keyword arguments), read by the worker
framework = sys.modules[__name__]  # the worker reads ``exercises.framework.answers``, as in the real package
ask = None  # set by the worker: asks the grader, which judges in its own process, whether an answer passes
results: dict = {}  # the grader's answers to ``ask``, by exercise name


class NotDone(NotImplementedError):
    """Raised by an exercise's stub: the student has not written this part yet."""


class RemoteAnswer:
    """Only the grader holds handles on answers; named here because the worker's protocol module imports it."""


class WorkerGone(RuntimeError):
    """The worker ended, broke the protocol or did not answer in time."""


def todo(what: str = "this exercise") -> None:
    raise NotDone(f"{what} is not written yet")


def check(name: str, *answer, **options) -> bool:
    """Record the answer to exercise ``name``; whether it passes comes from the grader (which asks only for the
    exercises its notebook branches on); its verdict is in the feedback, under this cell."""
    answers[str(name)] = (answer, options)
    results[str(name)] = bool(ask(str(name))) if ask is not None else False
    print(f"exercise {name}: recorded for the grader")
    return results[str(name)]


def passed(name: str) -> bool:
    """Whether the grader found the recorded answer to ``name`` right (so a notebook takes the path the student's
    own run takes)."""
    return results.get(name, False)


def summary(notebook: str) -> dict:
    print(f"notebook {notebook}: the grader's verdicts and points are in the feedback")
    return {}
