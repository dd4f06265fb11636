"""The ``exercises`` of a graded run: in the package copy a worker sees (``censor.package_copy``) this file is
``minidape/classroom/exercises/__init__.py``, and nothing else of the checks is there. :func:`check` only records
the answer it is given, for the grader to judge in its own process: no check, reference measurement, hint or
helper of the checks is in the student's process to call, read or copy."""

import sys

answers: dict = {}  # by exercise name: (the answer's arguments, its keyword arguments), read by the worker
framework = sys.modules[__name__]  # the worker reads ``exercises.framework.answers``, as in the real package


class NotDone(NotImplementedError):
    """Raised by an exercise's stub: the student has not written this part yet."""


class RemoteAnswer:
    """Only the grader holds handles on answers; named here because the worker's protocol module imports it."""


class WorkerGone(RuntimeError):
    """The worker ended, broke the protocol or did not answer in time."""


def todo(what: str = "this exercise") -> None:
    raise NotDone(f"{what} is not written yet")


def check(name: str, *answer, **options) -> bool:
    """Record the answer to exercise ``name``; the grader's verdict is in the feedback, under this cell."""
    answers[str(name)] = (answer, options)
    print(f"exercise {name}: recorded for the grader")
    return False


def passed(name: str) -> bool:
    """False: no answer is judged in this process (a notebook's demonstrations take minidape's path)."""
    return False


def summary(notebook: str) -> dict:
    print(f"notebook {notebook}: the grader's verdicts and points are in the feedback")
    return {}
