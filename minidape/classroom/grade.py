"""Grade students' notebooks against the teacher's edition, with verdicts computed outside the students' code.

    python -m minidape grade student_work/ --csv grades.csv --jobs 4 --feedback feedback/

1. **Roster.** The exercises of notebook NN are the package's own (``exercises.exercises_of("NN")``, each with
   its points), and their check cells come from the teacher's edition (``notebooks/NN_*.py``). A submission is
   matched to NN by its file name (``NN_...``) or else by the teacher's cells it contains; every exercise of NN
   gets a row, whatever the submission did with its checks.
2. **Restored checks.** Every submission cell that calls ``exercises.check("name", ...)`` for an exercise of NN
   (a call in its syntax tree, not a mention) is dropped, and the teacher's check cell is put back where the
   teacher has it: just before the first teacher's cell after it that the submission still holds unchanged (or
   at the end). Edits to check cells, deleted or moved checks, dead ``if False: exercises.check(...)`` lines:
   none of them counts; an answer defined inside a dropped check cell is named in its row.
3. **Execution.** The cells run in a sandboxed worker (:mod:`minidape.classroom.sandbox`): its own namespaces, user id,
   scratch tmpfs and limits. In the worker, ``exercises.check`` only records the answer it is given.
4. **Verdicts.** The grader then runs each exercise's check in its own process, on fresh random inputs, with
   the answers as handles: calling one runs the student's code in the worker and brings the result back as
   data. An exercise that forbids minidape's own implementation (``exercises.LIBRARY``) and earned points
   is judged again on a second run of the notebook in a worker whose minidape has that implementation
   refusing (one per set of forbidden names, up to the last check that forbids it), and that verdict stands;
   the first run's outputs are the feedback's.
5. **Output.** A table; ``--csv FILE`` rows ``student,notebook,exercise,points,max_points,passed,message,mistake``
   rewritten atomically after every submission (a crash of the grader keeps what was graded), under a lock on
   ``FILE``, never over an earlier batch without ``overwrite``; and beside it the gradebook
   (:mod:`minidape.classroom.gradebook`: the written answers to mark, totals, the class summary, the Gradescope export).
   ``--feedback DIR``: each executed notebook with the grader's verdict under each check cell and a note under
   each written answer. The submission's own cells (predictions, written answers, its code) are kept as it has
   them; only check cells are the teacher's. An experiment's recorded prediction is read by the grader from the
   submission's ``prediction`` cell (literal values only) and bound to the checker's parameter it was passed to
   (by position or keyword), not taken from the variable at check time, so a prediction rewritten after the
   measurement does not count. Experiments on the notebooks' own models are judged against the teacher's
   reference measurements (``minidape/classroom/references.json``), whatever the grading mode; an experiment on the
   student's own code (6.5) against the grader's own measurement of it (``exercises.MEASURED_BY_GRADER``: in
   full mode it trains the submission's runs here, the student's bias answering from the worker).
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..threads import THREADS_VARIABLE
from ..utils import quick_mode
from . import exercises, gradebook, sandbox
from .collect import (
    MAX_WRITTEN,
    TEACHER,
    NotANotebook,
    Row,
    Submission,
    Written,
    printable,
    read_cells,
    submissions,
    too_large,
)
from .edition import (  # noqa: F401  (re-exported: what the tests and tools read as grade.NAME)
    Edition,
    _names_passed_to_check,
    _rubrics,
    _same,
    checked,
    defined_in_check_cells,
    editions,
    exercise_names,
    identify,
    in_execution_order,
    literal_assignments,
    restore,
)
from .gradebook import COLUMNS, WRITTEN_COLUMNS, csv_message, write_csv, write_written, written_path  # noqa: F401

REFERENCES = exercises.helpers.TEACHER_REFERENCES  # the teacher's reference measurements (make notebooks records)
NOT_RECORDED = object()  # a prediction variable that no prediction cell of the submission assigns literally
START_TIMEOUT = 180  # seconds for a worker to start (import torch) before its first cell


# ------------------------------------------------------------------------------------------- grading


@dataclass
class Grader:
    """What every job shares: the teacher's edition, the sandbox's settings, the time limit."""

    known: dict[str, Edition]
    level: str
    env: dict[str, str]
    timeout: float
    # (notebook or None for a first run, forbidden names) -> the package copy its workers see
    censored: dict[tuple, Path] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    cgroups: str | None = None  # "v1", "v2" or None (per-process limits only)

    def start(self, slot: int, censored: Path | None = None, box=None) -> sandbox.Worker:
        """A worker (with a cgroup of its own for its submission where there are cgroups, ``worker.box``)."""
        if box is None and self.cgroups is not None:
            box = sandbox.Box(self.cgroups, f"{os.getpid()}-{slot}-{time.monotonic_ns()}")
        # CPU seconds per process: the cells' and the checks' time, with room for a busy machine's start-up.
        return sandbox.Worker(
            self.level,
            slot,
            self.env,
            cpu_seconds=2 * self.timeout + START_TIMEOUT,
            censored=censored or self.censored_copy(),
            box=box,
        )

    def censored_copy(self, forbidden: frozenset = frozenset(), notebook: str | None = None) -> Path:
        """The package copy of a first run (``notebook`` None) or of notebook's judged run in which ``forbidden``
        refuses (:func:`sandbox.censored_copy`), made the first time a submission needs it."""
        with self.lock:
            if (notebook, forbidden) not in self.censored:
                self.censored[notebook, forbidden] = sandbox.censored_copy(forbidden, notebook)
            return self.censored[notebook, forbidden]

    def stop(self, worker: sandbox.Worker) -> None:
        """End a worker started by :meth:`start` and remove its submission's cgroup (with any worker left in it)."""
        worker.close()
        if worker.box is not None:
            worker.box.close()

    def grade(self, submission: Submission, worker: sandbox.Worker, judged_slot: int = 0) -> Submission:
        """Fill ``submission``'s rows: read, restore, run in ``worker`` (which it closes with its cgroup), judge;
        ``judged_slot``: the first of the user id slots its judged workers take (one per forbidden set)."""
        start, judged = time.monotonic(), []
        try:
            self._grade(submission, worker, judged_slot, judged)
        except Exception as error:  # a bug of the grader's own: this submission's rows say so, the rest go on
            problem = f"the grader failed on this submission ({type(error).__name__}: {error}); grade it again"
            edition = self.known.get(submission.notebook[:2])
            submission.problem = problem
            submission.rows = (
                [Row(e.name, 0, e.points, exercises.FAILED, problem) for e in edition.roster]
                if edition
                else [Row("", 0, 0, exercises.FAILED, problem)]
            )
        finally:
            for each in judged:
                each.close()
            self.stop(worker)
            submission.seconds = time.monotonic() - start
        return submission

    def _grade(
        self, submission: Submission, worker: sandbox.Worker, judged_slot: int = 0, started: list | None = None
    ) -> None:
        """``started`` gets the judged workers it starts (for :meth:`grade` to close)."""
        started = [] if started is None else started
        if submission.rows:  # refused before it was read (see submissions())
            return
        cells, unreadable = None, ""
        try:
            cells = read_cells(submission.path)
        except NotANotebook as error:
            unreadable = str(error)
        edition = identify(submission.path, cells, self.known)
        if edition is None:
            submission.notebook = submission.path.name
            submission.problem = unreadable or (
                f"cannot tell which notebook this is: name it NN_... like the "
                f"teacher's ({', '.join(e.stem for e in self.known.values())})"
            )
            submission.rows = [Row("", 0, 0, exercises.FAILED, submission.problem)]
            return
        submission.notebook = edition.stem
        solutions = {_same(c["source"]) for c in edition.cells if "solution" in c["tags"] and c["cell_type"] == "code"}
        if cells and any("solution" in c["tags"] and _same(c["source"]) in solutions for c in cells):
            unreadable = (
                "refused: this is the teacher's edition (its worked solutions, tagged solution), not a student's work"
            )
        if unreadable:
            submission.problem = unreadable
            submission.rows = [Row(e.name, 0, e.points, exercises.FAILED, unreadable) for e in edition.roster]
            return
        cells = in_execution_order(cells)
        submission.cells = restore(edition, cells)
        submission.written = written_answers(edition, cells)
        lost = defined_in_check_cells(edition, cells)

        def predicted(exercise) -> dict:
            """Its prediction: each variable as the first prediction cell that assigns it a value (not None: the
            hand-out's stub; None when that is all there is), of those that run before its check (the
            submission's own check cell, else the teacher's where it was put back); a prediction cell after the
            check (after the result was there to see) does not count."""
            own = [i for i, c in enumerate(cells) if c["cell_type"] == "code" and exercise.name in checked(c["source"])]
            restored = next(i for i, c in enumerate(submission.cells) if c.get("checks") == exercise.name)
            predictions: dict = {}
            for cell in cells[: own[0]] if own else submission.cells[:restored]:
                if cell["cell_type"] == "code" and "prediction" in cell.get("tags", ()):
                    for variable, value in literal_assignments([cell]).items():
                        if predictions.get(variable) is None:
                            predictions[variable] = value
            return {
                at: (variable, predictions.get(variable, NOT_RECORDED))
                for at, variable in edition.predictions.get(exercise.name, {}).items()
            }

        # The exercises the notebook branches on (``exercises.passed("name")``, or a check's value kept, in the
        # teacher's edition): a check of them asks for the verdict during the run, so the run takes the path the
        # student's own run takes.
        branched = set(
            re.findall(
                r"(?:exercises\.passed\(|(?:=|if)\s*exercises\.check\()\s*[\"'](\w+)[\"']",
                "\n".join(c["source"] for c in edition.cells),
            )
        )
        roster = {e.name: e for e in edition.roster}

        def ask(name: str, channel) -> bool:
            if name not in branched or name not in roster:
                return False
            answers = channel.request("answers")
            row = self._judge(
                roster[name], answers if isinstance(answers, dict) else None, channel, "", predicted(roster[name])
            )
            return row.status == exercises.PASSED

        answers, channel = self._answers(worker, submission.cells, submission, ask)
        # Every exercise is judged on this run first. One that forbids parts of minidape and earned points here is
        # judged again, on a judged run (one per set of forbidden names, in the roster's order), and that verdict
        # stands: an answer that earns nothing with the library whole cannot earn with it refusing.
        rows = {e.name: self._judge(e, answers, channel, submission.problem, predicted(e)) for e in edition.roster}
        worker.close()
        groups: dict[frozenset, list] = {}
        for exercise in edition.roster:
            if exercises.LIBRARY.get(exercise.name) and rows[exercise.name].points > 0:
                groups.setdefault(frozenset(exercises.LIBRARY[exercise.name]), []).append(exercise)
        for number, (forbidden, judged) in enumerate(groups.items()):
            # A judged run: the cells up to the last check of these exercises, in a worker whose minidape refuses
            # what they forbid. Its outputs are not kept (the feedback shows the first run's).
            copy = self.censored_copy(forbidden, edition.stem[:2])
            started.append(self.start(judged_slot + number, copy, worker.box))
            last = max(i for i, c in enumerate(submission.cells) if c.get("checks") in {e.name for e in judged})
            copies = [{"cell_type": c["cell_type"], "source": c["source"]} for c in submission.cells[: last + 1]]
            run = Submission(submission.student, submission.path)
            judged_answers, judged_channel = self._answers(started[-1], copies, run, ask, figures=False)
            rows.update(
                {e.name: self._judge(e, judged_answers, judged_channel, run.problem, predicted(e)) for e in judged}
            )
            started[-1].close()
        submission.rows = [rows[e.name] for e in edition.roster]
        for row in submission.rows:
            if row.status != exercises.PASSED and lost.get(row.exercise):
                row.code = "answer-in-check-cell"
                row.message += (
                    f"\n    note: your check cell also defined {', '.join(lost[row.exercise])}; the "
                    f"grader replaces every check cell with the teacher's, so that definition was not "
                    f"run. Move it into a cell of its own above the check cell."
                )

    def _answers(self, worker: sandbox.Worker, cells: list[dict], submission: Submission, ask=None, figures=True):
        """Run ``cells`` in ``worker`` (what stopped them goes to ``submission.problem``; ``ask``: see
        :meth:`_cell_outputs`); the answers their check cells recorded (None when there are none to be had) and
        the channel the checks reach them through. ``figures``: whether the worker draws the figures a cell made
        (a judged run's outputs are not kept: it closes them undrawn)."""
        answers, channel = None, None
        try:
            worker.wait_ready(START_TIMEOUT)
            submission.problem = self._run(cells, worker, ask, figures)
            channel = sandbox.Channel(worker, time.monotonic() + self.timeout)  # the checks' time starts
            if worker.alive:
                answers = channel.request("answers")
        except sandbox.WorkerGone as gone:
            submission.problem = submission.problem or f"the worker {gone}"
        except Exception:  # an error where the protocol has none: a forged answer
            worker.close()
            submission.problem = submission.problem or "the worker broke the protocol"
        return (answers if isinstance(answers, dict) else None), channel

    def _cell_outputs(self, worker: sandbox.Worker, deadline: float, ask) -> list:
        """A cell's outputs, answering on the way each ``exercises.check`` of it that asks whether its answer
        passes (``ask(name, channel)``: the grader's verdict, judged here; the cell's time runs meanwhile)."""
        while True:
            message = worker.read(max(0.0, deadline - time.monotonic()))
            if isinstance(message, dict) and set(message) == {"ask"} and isinstance(message["ask"], str):
                passed = ask(message["ask"], sandbox.Channel(worker, deadline)) if ask is not None else False
                worker.send_only("verdict", passed is True, deadline=deadline)
                continue
            return worker.unpack(message)

    def _run(self, cells: list[dict], worker: sandbox.Worker, ask=None, figures: bool = True) -> str:
        """Execute the code cells in order; what stopped or broke the run ("" when nothing did)."""
        deadline, errors, room = time.monotonic() + self.timeout, [], sandbox.MAX_NOTEBOOK_OUTPUT
        for index, cell in enumerate(cells):
            if cell["cell_type"] != "code":
                continue
            try:
                worker.send_only("run", index, cell["source"], figures, deadline=deadline)
                try:
                    outputs = self._cell_outputs(worker, deadline, ask)
                    stopped = ""
                except sandbox.TimeLimit:
                    worker.interrupt()  # a KeyboardInterrupt in the cell, so the answers survive
                    outputs = self._cell_outputs(worker, time.monotonic() + 10, ask)
                    stopped = f"stopped at the time limit of {self.timeout:g} s"
            except Exception as gone:  # WorkerGone, or an error where the protocol has none
                worker.close()
                what = gone if isinstance(gone, sandbox.WorkerGone) else "broke the protocol"
                cell["outputs"] = [
                    {
                        "output_type": "stream",
                        "name": "stderr",
                        "text": f"[grader] the worker {what} while running this cell\n",
                    }
                ]
                return f"the worker {what} while running a cell"
            cell["outputs"], room = sandbox.cap_outputs(_outputs(outputs), room)
            errors += [o["ename"] for o in cell["outputs"] if o["output_type"] == "error"]
            if stopped:
                return stopped
        return f"{len(errors)} cell(s) raised, first {errors[0]}" if errors else ""

    def _judge(self, exercise, answers: dict | None, channel, problem: str, predicted: dict) -> Row:
        """``predicted``: the experiment's predictions as its prediction cell wrote them, by the checker's
        parameter: (variable, value)."""
        name, points = exercise.name, exercise.points
        if answers is None:
            return Row(name, 0, points, exercises.FAILED, f"not graded: {problem or 'the worker ended'}", "not-graded")
        answer = answers.get(name)
        if not (
            isinstance(answer, (tuple, list))
            and len(answer) == 2
            and isinstance(answer[0], (tuple, list))
            and isinstance(answer[1], dict)
            and all(isinstance(k, str) for k in answer[1])
        ):
            why = f" ({problem})" if problem else ""
            return Row(name, 0, points, exercises.FAILED, f"no answer: its check cell did not run{why}", "no-answer")
        if not channel.worker.alive:
            return Row(
                name,
                0,
                points,
                exercises.FAILED,
                "not graded: the worker ended while an earlier exercise was checked",
                "not-graded",
            )
        missing = [variable for variable, value in predicted.values() if value is NOT_RECORDED]
        if missing:
            return Row(
                name,
                0,
                points,
                exercises.FAILED,
                f"no recorded prediction: the grader reads {missing[0]} "
                f"from your cell tagged 'prediction', as a literal value (a number, True/False, a name or a "
                f"dict of them) written before the run; keep that cell and its tag",
                "no-recorded-prediction",
            )
        arguments, options = list(answer[0]), dict(answer[1])
        try:  # the recorded prediction replaces what the call passed, by position or by keyword alike
            bound = inspect.signature(exercise.checker).bind(*arguments, **options)
        except TypeError:
            pass  # a call the checker cannot take: the verdict says so
        else:
            bound.arguments.update({parameter: value for parameter, (_, value) in predicted.items()})
            measure = exercises.MEASURED_BY_GRADER.get(name)
            if measure is not None:  # an experiment on the student's own code: the grader's measurement, never theirs
                bound.arguments["recomputed"] = measure(answers, channel)
            arguments, options = list(bound.args), dict(bound.kwargs)
        result = exercises.verdict(name, *arguments, **options)
        return Row(name, result[2], points, result[0], result[1], result.code)


def written_answers(edition: Edition, cells: list[dict]) -> list[Written]:
    """The submission's answer to each written question of the teacher's edition, found by its rubric tag; one
    that still holds the teacher's prompt unchanged is flagged "not answered"."""
    found, prompts = {}, {}
    for cell in cells:
        if "written" in cell.get("tags", ()):
            for rubric in _rubrics(cell):
                found.setdefault(rubric, cell["source"].strip())
    for cell in edition.cells:
        if "written" in cell["tags"] and "solution" not in cell["tags"]:
            prompts.update({rubric: _same(cell["source"]) for rubric in _rubrics(cell)})
    return [
        _written(rubric, found[rubric], prompts.get(rubric))
        if rubric in found
        else Written(rubric, "", f"no cell tagged written and rubric:{rubric} (deleted, or its tags removed)")
        for rubric in edition.rubrics
    ]


def _written(rubric: str, answer: str, prompt: str | None) -> Written:
    """One written answer; one over :data:`collect.MAX_WRITTEN` is kept only up to it, and the row says so."""
    if len(answer) > MAX_WRITTEN:
        return Written(rubric, answer[:MAX_WRITTEN], f"{too_large(len(answer), MAX_WRITTEN, 'characters')}: cut there")
    return Written(rubric, answer, gradebook.NOT_ANSWERED if _same(answer) == prompt else "")


def _outputs(outputs) -> list[dict]:
    """The worker's outputs for a cell, rebuilt from their text only (the worker is not trusted)."""
    kept = []
    for output in outputs if isinstance(outputs, list) else []:
        if not isinstance(output, dict):
            continue
        kind = output.get("output_type")
        if kind == "stream" and isinstance(output.get("text"), str):
            kept.append(
                {
                    "output_type": "stream",
                    "name": "stderr" if output.get("name") == "stderr" else "stdout",
                    "text": output["text"],
                }
            )
        elif kind in ("display_data", "execute_result") and isinstance(output.get("data"), dict):
            data = {
                mime: value
                for mime, value in output["data"].items()
                if mime in ("text/plain", "text/markdown", "image/png") and isinstance(value, str)
            }
            kept.append({"output_type": "display_data", "data": data, "metadata": {}})
        elif kind == "error":
            trace = output.get("traceback")
            kept.append(
                {
                    "output_type": "error",
                    "ename": str(output.get("ename")),
                    "evalue": str(output.get("evalue")),
                    "traceback": [str(line) for line in trace] if isinstance(trace, list) else [],
                }
            )
    return kept


# ---------------------------------------------------------------------------------------- the outputs


def table(graded: list[Submission]) -> str:
    rows = [
        (printable(s.student), printable(s.notebook), f"{s.points:g} / {s.max_points:g}", printable(s.problem) or "-")
        for s in graded
    ]
    header = ("student", "notebook", "points", "problem")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(3)) + f"  {r[3]}" for r in [header, *rows]]
    return "\n".join(lines)


def write_feedback(submission: Submission, folder: Path, entered: dict | None = None) -> Path:
    """The executed notebook with the grader's verdict (a markdown cell) under each exercise's check cell,
    after a first cell with the total and what stopped the run (alone when the file could not be run). The
    re-run's own check and summary outputs are left out (only the grader's verdicts speak); a written answer's
    mark is shown once the teacher entered it (``entered``: see ``gradebook.held``). Readable by the owner of
    the folder above ``folder`` (the teacher's account, also when the grader runs as root), by no one else."""
    rows = {row.exercise: row for row in submission.rows}
    summary = f"**Grader · {submission.notebook}: {submission.points:g} / {submission.max_points:g} points**"
    if submission.problem:
        summary += f"\n\n{submission.problem}"
    cells = [{"cell_type": "markdown", "metadata": {"tags": ["grader"]}, "source": summary}]
    for cell in submission.cells:
        if cell["cell_type"] == "code":
            cells.append(
                {
                    "cell_type": "code",
                    "execution_count": None,
                    "metadata": {},
                    "outputs": []
                    if cell.get("checks") or "exercises.summary(" in cell["source"]
                    else cell.get("outputs", []),
                    "source": cell["source"],
                }
            )
        else:
            cells.append({"cell_type": cell["cell_type"], "metadata": {}, "source": cell["source"]})
        row = rows.get(cell.get("checks"))
        if row is not None:
            mark = {exercises.PASSED: "✓", exercises.PARTLY: "±", exercises.NEEDS_FULL: "?"}.get(row.status, "✗")
            message = "\n".join(f"    {line}" for line in row.message.splitlines())
            cells.append(
                {
                    "cell_type": "markdown",
                    "metadata": {"tags": ["grader"]},
                    "source": f"**Grader · {row.exercise}: {mark} {row.points:g} / {row.max_points:g}**\n\n{message}\n",
                }
            )
        if "written" in cell.get("tags", ()) and _rubrics(cell):
            marked = [
                (
                    rubric,
                    (entered or {}).get(
                        (
                            gradebook.spreadsheet_safe(submission.student),
                            submission.notebook,
                            rubric,
                            gradebook.spreadsheet_safe(cell["source"].strip()),
                        )
                    ),
                )
                for rubric in _rubrics(cell)
            ]
            marks = "; ".join(f"{mark} / {gradebook.WRITTEN_POINTS}" for _, mark in marked if mark)
            cells.append(
                {
                    "cell_type": "markdown",
                    "metadata": {"tags": ["grader"]},
                    "source": f"**Grader · written answer ({', '.join(f'rubric:{r}' for r, _ in marked)})**: "
                    + (f"marked by your teacher: {marks}" if marks else "marked by your teacher, not by the grader"),
                }
            )
    notebook = {
        "cells": cells,
        "nbformat": 4,
        "nbformat_minor": 4,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    }
    target = (
        folder
        / submission.student
        / (submission.path.name if submission.path.suffix == ".ipynb" else f"{submission.path.name}.ipynb")
    )
    target.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
    gradebook.write_atomically(target, json.dumps(notebook, indent=1, ensure_ascii=False))
    teacher = Path(folder).resolve().parent.stat()
    for path, mode in ((target.parent, 0o750), (target, 0o640)):
        if os.geteuid() == 0:
            os.chown(path, teacher.st_uid, teacher.st_gid)
        os.chmod(path, mode)
    return target


def worker_env() -> dict[str, str]:
    """The worker's environment: nothing of the grader's but what running the notebooks needs."""
    threads = os.environ.get(THREADS_VARIABLE, "1")  # one each by default: the workers fill the cores
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        THREADS_VARIABLE: threads,
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "OMP_WAIT_POLICY": "PASSIVE",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONPATH": os.pathsep.join([str(TEACHER.parent), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    if quick_mode():  # switched on by either of its names here; the workers get one
        env["MINIDAPE_QUICK"] = "1"
    return env


def references(path: Path = REFERENCES) -> dict:
    """The teacher's reference measurements, by mode and experiment (see ``exercises.helpers._measurement``)."""
    if not path.is_file():
        raise FileNotFoundError(
            f"the teacher's edition has no reference measurements ({path}): run `make notebooks` "
            f"once, which records them"
        )
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:  # a truncated file (a run of `make notebooks` stopped while writing it)
        raise ValueError(
            f"{path} is not whole JSON ({err.msg} at line {err.lineno}): run `make notebooks` again to record the "
            f"references (or restore the file: git checkout {path.name})"
        ) from None


MAX_JOBS = 127


def worker_count(jobs: int | None) -> int:
    """Submissions graded at once: ``jobs``, or by default the CPU cores up to MAX_JOBS (a machine with more cores
    than that grades with MAX_JOBS, rather than refusing a default the teacher did not choose)."""
    jobs = min(os.cpu_count() or 1, MAX_JOBS) if jobs is None else jobs
    if not 1 <= jobs <= MAX_JOBS:
        raise ValueError(f"--jobs must be between 1 and {MAX_JOBS}; got {jobs}")
    return jobs


def grade(
    paths,
    csv_path: str | os.PathLike | None = None,
    timeout: float = 600,
    jobs: int | None = None,
    feedback: str | os.PathLike | None = None,
    overwrite: bool = False,
) -> list[Submission]:
    """Grade every submission named (files or folders), print the table, write the CSV and feedback if asked.
    With a CSV, the gradebook beside it too (:mod:`minidape.classroom.gradebook`), under the CSV's lock; an earlier
    batch's CSV is replaced only with ``overwrite`` (the teacher's marks for unchanged written answers kept)."""
    if not timeout > 0:
        raise ValueError(f"--timeout must be > 0 seconds; got {timeout}")
    jobs = worker_count(jobs)
    gradebook.check_output_paths(csv_path, feedback)
    if csv_path is None:
        return _grade(paths, None, timeout, jobs, feedback, {})
    with gradebook.held(csv_path, overwrite) as entered:
        graded = _grade(paths, csv_path, timeout, jobs, feedback, entered)
        written = gradebook.gradebook(csv_path)
    print(
        f"wrote {csv_path}, the written answers to {written_path(csv_path)} (fill in their points column, then "
        f"grade --gradebook {csv_path}), and {', '.join(map(str, written))}"
    )
    return graded


def _grade(paths, csv_path, timeout: float, jobs: int, feedback, entered: dict) -> list[Submission]:
    known = editions()
    measured = references()
    todo = submissions(paths)
    gradebook.refuse_collisions(s.student for s in todo)  # before anything runs: its exports would collide
    level = sandbox.isolation()
    grader = Grader(known, level, worker_env(), timeout, cgroups=sandbox.cgroup_version())
    for warning in sandbox.warnings(level, grader.cgroups):
        print(f"warning: {warning}", file=sys.stderr)
    try:
        return _grade_all(grader, todo, csv_path, jobs, feedback, entered, measured)
    finally:
        for copy in grader.censored.values():
            shutil.rmtree(copy.parent, ignore_errors=True)


def _grade_all(
    grader: Grader, todo: list[Submission], csv_path, jobs: int, feedback, entered: dict, measured: dict
) -> list[Submission]:
    probe = grader.start(sandbox.UIDS_PER_GRADER - 1)  # a worker that cannot start is this machine's problem
    try:
        probe.wait_ready(START_TIMEOUT)
    except sandbox.WorkerGone as gone:
        raise OSError(
            f"the sandboxed worker {gone}; with isolation level {grader.level!r} it runs as another "
            f"user, who must be able to read Python and minidape"
        ) from None
    finally:
        grader.stop(probe)
    if feedback is not None:
        Path(feedback).mkdir(mode=0o750, parents=True, exist_ok=True)
        if os.geteuid() == 0:  # the teacher's account (the owner of the folder above it) reads it
            above = Path(feedback).resolve().parent.stat()
            os.chown(feedback, above.st_uid, above.st_gid)
    done: dict[int, Submission] = {}
    lock = threading.Lock()
    queue = iter(enumerate(todo))

    def work(slot: int) -> None:
        # Eight user ids per slot: the next worker starts (imports torch) while the current one and its judged
        # workers (at most 3 per notebook) run.
        ready = grader.start(8 * slot)
        try:
            for turn, (index, submission) in enumerate(_locked(queue, lock)):
                worker, ready = ready, grader.start(8 * slot + (turn + 1) % 2)
                grader.grade(submission, worker, judged_slot=8 * slot + 2)
                with lock:
                    done[index] = submission
                    print(
                        f"graded {printable(submission.student)} · {printable(submission.notebook)}: "
                        f"{submission.points:g} / "
                        f"{submission.max_points:g} ({submission.seconds:.1f} s)",
                        flush=True,
                    )
                    if csv_path is not None:
                        write_csv([done[i] for i in sorted(done)], csv_path)
                        write_written([done[i] for i in sorted(done)], written_path(csv_path), entered)
                    if feedback is not None:
                        write_feedback(submission, Path(feedback), entered)
        finally:
            grader.stop(ready)

    # The workers run the students' modules on the CPU and hand back CPU tensors: so do the checks here
    # (exercises.framework.CHECK_DEVICE is CUDA where present, for a notebook checking its own answers), and
    # experiments are judged against the teacher's reference measurements (a notebook uses its own run).
    framework = exercises.framework
    saved = framework.CHECK_DEVICE, framework.references
    framework.CHECK_DEVICE, framework.references = "cpu", measured
    try:
        with ThreadPoolExecutor(max_workers=min(jobs, len(todo))) as pool:
            for future in [pool.submit(work, slot) for slot in range(min(jobs, len(todo)))]:
                future.result()
    finally:
        framework.CHECK_DEVICE, framework.references = saved
    graded = [done[i] for i in sorted(done)]
    print(table(graded))
    return graded


def _locked(iterator, lock):
    while True:
        with lock:
            item = next(iterator, None)
        if item is None:
            return
        yield item
