"""The grader's gradebook: what ``python -m minidape grade ... --csv grades.csv`` writes, and how the teacher's
marks for written answers join it.

Beside ``grades.csv`` (one row per exercise of every submission) the gradebook is four more files, all made
from the two CSVs so that they can be rebuilt without grading again (``grade --gradebook grades.csv``):

* ``grades-written.csv``: one row per written answer, with an empty ``points`` column for the teacher to fill in
  (``max_points``: the rubric's, 2); an unchanged prompt says "not answered";
* ``grades-totals.csv``: one row per student: the points per notebook (written answers included once marked),
  the total, the most it could be, and how many written answers are still to mark or exercises were not judged;
* ``grades-summary.csv``: one row per exercise (and per rubric): submissions, mean points, share passed, and
  the most common mistakes by their stable code (``exercises.Wrong.code``);
* ``grades-gradescope/<notebook>/<student>/results.json``: Gradescope's autograder results format, one file
  per submission (tests with ``name``, ``score``, ``max_score``, ``status``, ``output``), for an upload to
  Gradescope or any tool that reads it.

Every field is neutralised for spreadsheets: a text that starts with ``= + - @`` (or a tab or carriage return)
gets a leading ``'``, so a student id or an answer can never run as a formula. ``grade`` holds a lock on its CSV
while it writes (a second run into the same file is refused, naming the holder), and never replaces an earlier
batch's CSV without ``--overwrite``; with it, the marks entered for written answers are carried over to the new
file for every answer whose text did not change.
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import math
import os
import socket
import tempfile
import time
from collections import Counter, defaultdict
from contextlib import contextmanager
from pathlib import Path

COLUMNS = ["student", "notebook", "exercise", "points", "max_points", "passed", "message", "mistake"]
WRITTEN_COLUMNS = ["student", "notebook", "rubric", "answer", "problem", "points", "max_points"]
WRITTEN_POINTS = 2  # each written answer, unless the course says otherwise (docs/teaching.md)
NOT_ANSWERED = "not answered: the cell still holds the question as handed out"
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def check_output_paths(csv_path, feedback) -> None:
    """Refuse a CSV path or feedback folder that cannot be written, before any notebook runs (the command line:
    before torch loads)."""
    if csv_path is not None:
        path = Path(csv_path)
        if path.is_dir():
            raise ValueError(f"--csv {path} is a folder; give a file name")
        if not path.parent.resolve().is_dir():
            raise FileNotFoundError(f"--csv {path}: the folder {path.parent} does not exist")
        if not os.access(path.parent.resolve(), os.W_OK):
            raise ValueError(f"--csv {path}: the folder {path.parent} is not writable")
    if feedback is not None and Path(feedback).exists() and not Path(feedback).is_dir():
        raise ValueError(f"--feedback {feedback} is a file; give a folder")


def spreadsheet_safe(value) -> str:
    """A CSV field a spreadsheet shows as text: ``=1+2`` -> ``'=1+2``; numbers are written as they are."""
    text = value if isinstance(value, str) else f"{value:g}" if isinstance(value, float) else str(value)
    return f"'{text}" if text.startswith(FORMULA_STARTS) and not isinstance(value, (int, float)) else text


def write_atomically(path: Path, text: str) -> None:
    """Write whole or not at all, readable by the grader's user only (grades are personal)."""
    descriptor, partial = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w", newline="") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(partial, path)
    except OSError as err:  # a full disk says "No space left on device" without the file: name it
        Path(partial).unlink(missing_ok=True)
        raise OSError(err.errno, f"{path} not written: {err.strerror or err}") from err
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


def _csv_text(header: list[str], rows) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    writer.writerows([spreadsheet_safe(field) for field in row] for row in rows)
    return buffer.getvalue()


def _read(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV the grader wrote, also as a spreadsheet saves it back: UTF-8 with a byte-order mark, `;`
    between fields (where `,` is the decimal comma); another encoding (Windows-1252) is refused naming the file."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{path} is not UTF-8 text (byte {err.start} of the file); save it from the spreadsheet as "
            f"'CSV UTF-8' and try again"
        ) from None
    header = text.partition("\n")[0]
    delimiter = ";" if header.count(";") > header.count(",") else ","
    return list(csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter))


# ----------------------------------------------------------------------------------------- file names


def sibling(csv_path, kind: str) -> Path:
    """``grades.csv`` -> ``grades-<kind>.csv`` (``written``, ``totals``, ``summary``); ``gradescope``: a folder."""
    path = Path(csv_path)
    return path.with_name(f"{path.stem}-{kind}" + ("" if kind == "gradescope" else ".csv"))


def written_path(csv_path) -> Path:
    """Where the written answers go: beside the CSV of grades, ``grades.csv`` -> ``grades-written.csv``."""
    return sibling(csv_path, "written")


# -------------------------------------------------------------------------------- the lock, no overwrite


@contextmanager
def held(csv_path, overwrite: bool):
    """Hold ``grades.csv``'s lock (``.grades.csv.lock`` beside it) while a run writes it; refuse an earlier
    batch's files unless ``overwrite``. Yields the marks already entered in the written-answers file (by
    student, notebook, rubric and answer) so that a new batch keeps them."""
    path = Path(csv_path)
    lock = path.with_name(f".{path.name}.lock")
    descriptor = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 500, 0).decode(errors="replace").strip() or "another process"
            raise ValueError(
                f"--csv {path} is being written by another grade run ({holder}); wait for it to "
                f"finish or give another file"
            ) from None
        os.ftruncate(descriptor, 0)
        os.pwrite(
            descriptor,
            f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}".encode(),
            0,
        )
        earlier = [p for p in (path, written_path(path)) if p.exists()]
        if earlier and not overwrite:
            raise ValueError(
                f"--csv {path}: {' and '.join(map(str, earlier))} hold an earlier batch's grades; give "
                f"another file, or --overwrite to replace them (the marks entered for written "
                f"answers are kept for every answer that did not change)"
            )
        yield marks(written_path(path)) if written_path(path).exists() else {}
    finally:
        os.close(descriptor)  # releases the lock


def marks(path: Path) -> dict[tuple[str, str, str, str], str]:
    """The points a teacher entered in a written-answers file, by (student, notebook, rubric, answer)."""
    return {
        (row["student"], row["notebook"], row["rubric"], row["answer"]): row["points"].strip()
        for row in _read(path)
        if row.get("points", "").strip()
    }


# ---------------------------------------------------------------------------------------- the two CSVs


def csv_message(row) -> str:
    """The row's message, opening with its verdict (passed, partly right, failed, not done yet, ...)."""
    return row.message if row.message.startswith(row.status) else f"{row.status}: {row.message}"


def write_csv(graded, path) -> None:
    """One row per exercise of every submission (``COLUMNS``): ``passed`` is 1 for a verdict of "passed", else 0;
    partial credit shows in ``points``; an exercise not judged (quick mode, see ``exercises.NeedsFullMode``) has
    no points; ``mistake`` is the stable code of what was wrong."""
    from .exercises import NEEDS_FULL, PASSED

    write_atomically(
        Path(path),
        _csv_text(
            COLUMNS,
            (
                [
                    s.student,
                    s.notebook,
                    row.exercise,
                    "" if row.status == NEEDS_FULL else row.points,
                    row.max_points,
                    int(row.status == PASSED),
                    csv_message(row),
                    row.code,
                ]
                for s in graded
                for row in s.rows
            ),
        ),
    )


def write_written(graded, path, entered: dict | None = None) -> None:
    """One row per written question of every submission (``WRITTEN_COLUMNS``), with the points already entered
    for the same answer (``entered``, from :func:`marks`)."""
    entered = entered or {}
    write_atomically(
        Path(path),
        _csv_text(
            WRITTEN_COLUMNS,
            (
                [
                    s.student,
                    s.notebook,
                    w.rubric,
                    w.answer,
                    w.problem,
                    entered.get((spreadsheet_safe(s.student), s.notebook, w.rubric, spreadsheet_safe(w.answer)), ""),
                    WRITTEN_POINTS,
                ]
                for s in graded
                for w in s.written
            ),
        ),
    )


# ------------------------------------------------------------------------- totals, summary, the export


def _number(text: str, where: str) -> float | None:
    text = text.strip().lstrip("'")
    if not text:
        return None
    try:
        value = float(text.replace(",", "."))  # a spreadsheet's decimal comma (1,5) too
    except ValueError:
        value = math.nan
    if not math.isfinite(value):  # float() reads "nan" and "inf", which would make every total nan
        raise ValueError(f"{where}: points {text!r} is not a number")
    return value


def gradebook(csv_path) -> list[Path]:
    """Rebuild totals, the class summary and the Gradescope export from ``grades.csv`` and its written answers
    (marks included) without grading anything; the files written."""
    path = Path(csv_path)
    rows = _read(path)
    if not rows or set(COLUMNS) - set(rows[0]):
        missing = sorted(set(COLUMNS) - set(rows[0])) if rows else COLUMNS
        raise ValueError(f"--gradebook {path}: not a grades file of this version (columns missing: {missing})")
    for number, row in enumerate(rows, 2):
        for column in ("points", "max_points"):
            _number(row[column], f"{path} line {number}" + (", max_points" if column == "max_points" else ""))
    written = _read(written_path(path)) if written_path(path).exists() else []
    for number, row in enumerate(written, 2):
        points = _number(row.get("points", ""), f"{written_path(path)} line {number}")
        if points is not None and not 0 <= points <= _number(row["max_points"], "max_points"):
            raise ValueError(
                f"{written_path(path)} line {number}: points {points:g} is outside 0 .. {row['max_points']}"
            )
    refuse_collisions(row["student"] for row in rows)
    write_atomically(sibling(path, "totals"), totals(rows, written))
    write_atomically(sibling(path, "summary"), summary(rows, written))
    write_atomically(sibling(path, "canvas"), canvas(rows, written))
    write_atomically(sibling(path, "moodle"), moodle(rows, written))
    folder = sibling(path, "gradescope")
    for (student, notebook), results in gradescope(rows, written).items():
        target = folder / _file_name(notebook) / _file_name(student) / "results.json"
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomically(target, json.dumps(results, indent=1, ensure_ascii=False))
    return [sibling(path, k) for k in ("totals", "summary", "canvas", "moodle")] + [folder]


def refuse_collisions(students) -> None:
    """A ValueError naming both ids where two student ids map to one export folder name (``h~a`` and ``h_a``):
    one's export would overwrite the other's."""
    seen: dict[str, str] = {}
    for student in dict.fromkeys(students):
        other = seen.setdefault(_file_name(student), student)
        if other != student:
            raise ValueError(
                f"student ids {other!r} and {student!r} map to one export name {_file_name(student)!r}; rename "
                f"one of the two folders"
            )


def _file_name(text: str) -> str:
    """A folder name from a student id or notebook (the ids are folder names already; this keeps it so)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text.lstrip("'.")) or "_"


def totals(rows: list[dict], written: list[dict]) -> str:
    """One row per student: points per notebook (exercises, plus written answers once marked), total, most."""
    points, most = defaultdict(float), defaultdict(float)
    to_mark, not_judged = Counter(), Counter()
    notebooks = sorted({row["notebook"] for row in rows})
    students = list(dict.fromkeys(row["student"] for row in rows))
    for row in rows:
        earned = _number(row["points"], f"{row['student']} {row['exercise']}")
        not_judged[row["student"]] += earned is None and row["max_points"] not in ("", "0")
        points[row["student"], row["notebook"]] += earned or 0
        # not judged yet (needs full mode): neither 0 points nor part of the maximum until it is graded
        most[row["student"], row["notebook"]] += 0 if earned is None else _number(row["max_points"], "max_points") or 0
    for row in written:
        earned = _number(row.get("points", ""), f"{row['student']} {row['rubric']}")
        to_mark[row["student"]] += earned is None
        points[row["student"], row["notebook"]] += earned or 0
        most[row["student"], row["notebook"]] += _number(row["max_points"], "max_points") or 0
    header = ["student", *notebooks, "total", "max_total", "written_to_mark", "not_judged"]
    return _csv_text(
        header,
        (
            [
                student,
                *(points[student, n] if (student, n) in most else "" for n in notebooks),
                sum(points[student, n] for n in notebooks),
                sum(most[student, n] for n in notebooks),
                to_mark[student],
                not_judged[student],
            ]
            for student in students
        ),
    )


def summary(rows: list[dict], written: list[dict]) -> str:
    """One row per exercise and per rubric: how the class did, and its most common mistakes by code."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in rows:
        if row["exercise"]:
            groups[row["notebook"], row["exercise"]].append(row)
    lines = []
    for (notebook, exercise), group in groups.items():
        judged = [row for row in group if row["points"].strip()]
        mistakes = Counter(row["mistake"] for row in judged if row["passed"] != "1" and row["mistake"])
        lines.append(
            [
                notebook,
                exercise,
                len(group),
                len(judged),
                round(sum(float(row["points"]) for row in judged) / len(judged), 2) if judged else "",
                group[0]["max_points"],
                round(sum(row["passed"] == "1" for row in judged) / len(judged), 2) if judged else "",
                "; ".join(f"{code} ({count})" for code, count in mistakes.most_common(3)),
            ]
        )
    by_rubric: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in written:
        by_rubric[row["notebook"], row["rubric"]].append(row)
    for (notebook, rubric), group in by_rubric.items():
        done = [
            v for v in (_number(row.get("points", ""), f"{row['student']} {rubric}") for row in group) if v is not None
        ]
        unanswered = sum(row["problem"].startswith("not answered") for row in group)
        lines.append(
            [
                notebook,
                f"rubric:{rubric}",
                len(group),
                len(done),
                round(sum(done) / len(done), 2) if done else "",
                WRITTEN_POINTS,
                "",
                f"not-answered ({unanswered})" if unanswered else "",
            ]
        )
    header = [
        "notebook",
        "exercise",
        "submissions",
        "judged",
        "mean_points",
        "max_points",
        "share_passed",
        "common_mistakes",
    ]
    return _csv_text(header, lines)


def _per_notebook(rows: list[dict], written: list[dict]) -> tuple[list[str], list[str], dict, dict]:
    """Students, notebooks, each student's points per notebook (exercises judged and written answers marked),
    and each notebook's maximum (every exercise and written answer of it)."""
    students = list(dict.fromkeys(row["student"] for row in rows))
    notebooks = sorted({row["notebook"] for row in rows if row["exercise"]})
    points, most = defaultdict(float), {}
    for row in rows:
        points[row["student"], row["notebook"]] += _number(row["points"], row["exercise"]) or 0
    for row in written:
        points[row["student"], row["notebook"]] += _number(row.get("points", ""), row["rubric"]) or 0
    for notebook in notebooks:  # the most a complete submission earns: one student's rows of that notebook
        first = next(row["student"] for row in rows if row["notebook"] == notebook and row["exercise"])
        most[notebook] = sum(
            _number(row["max_points"], "max_points") or 0
            for row in [*rows, *written]
            if row["student"] == first and row["notebook"] == notebook
        )
    return students, notebooks, points, most


CANVAS_COLUMNS = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]  # Canvas's gradebook CSV, in order


def canvas(rows: list[dict], written: list[dict]) -> str:
    """Canvas's gradebook import CSV: its five identifying columns (the student id as the SIS Login ID), one
    column per notebook (a new assignment of that name on import), and the "Points Possible" row Canvas reads
    after the header."""
    students, notebooks, points, most = _per_notebook(rows, written)
    header = [*CANVAS_COLUMNS, *notebooks]
    possible = ["Points Possible", "", "", "", "", *(most[n] for n in notebooks)]
    return _csv_text(
        header,
        [possible, *([s, "", "", s, "", *(points.get((s, n), "") for n in notebooks)] for s in students)],
    )


MOODLE_COLUMNS = ["username"]  # the user field Moodle's CSV grade import maps the first column to


def moodle(rows: list[dict], written: list[dict]) -> str:
    """Moodle's CSV grade import: the student id in ``username`` (map it to the user field "username"), one
    column per notebook (map each to its grade item, or a new one)."""
    students, notebooks, points, _ = _per_notebook(rows, written)
    return _csv_text(
        [*MOODLE_COLUMNS, *notebooks], ([s, *(points.get((s, n), "") for n in notebooks)] for s in students)
    )


def merge(batches: list, csv_path, entered: dict | None = None) -> None:
    """One gradebook for a course from several ``grade --csv`` batches (quick-graded notebooks, 06 graded in full
    mode): per student, notebook and exercise, the row of the last batch that judged it (one that says
    ``needs full mode`` gives way to one that graded it); per written answer, the last batch's that holds a
    mark, else the last batch's, with the marks ``entered`` in an earlier merge for the same answer (see
    :func:`held`). Written to ``csv_path`` and its written answers, then its gradebook."""
    exercises, answers = {}, {}
    for batch in map(Path, batches):
        rows = _read(batch)
        if not rows or set(COLUMNS) - set(rows[0]):
            raise ValueError(f"--merge {batch}: not a grades file of this version (columns {COLUMNS})")
        for row in rows:
            key = (row["student"], row["notebook"], row["exercise"])
            if row["points"].strip() or key not in exercises or not exercises[key]["points"].strip():
                exercises[key] = row
        for row in _read(written_path(batch)) if written_path(batch).exists() else []:
            key = (row["student"], row["notebook"], row["rubric"])
            if row.get("points", "").strip() or key not in answers or not answers[key].get("points", "").strip():
                answers[key] = row
    for (student, notebook, rubric), row in answers.items():
        if not row.get("points", "").strip():
            row["points"] = (entered or {}).get((student, notebook, rubric, row["answer"]), "")
    write_atomically(Path(csv_path), _csv_text(COLUMNS, ([row[c] for c in COLUMNS] for row in exercises.values())))
    write_atomically(
        written_path(csv_path),
        _csv_text(WRITTEN_COLUMNS, ([row.get(c, "") for c in WRITTEN_COLUMNS] for row in answers.values())),
    )
    gradebook(csv_path)


def gradescope(rows: list[dict], written: list[dict]) -> dict[tuple[str, str], dict]:
    """Per (student, notebook), Gradescope's autograder ``results.json``: the score, and one test per exercise
    (and per marked written answer) with its name, score, max_score, status and output."""
    found: dict[tuple[str, str], dict] = {}
    for row in rows:
        results = found.setdefault((row["student"], row["notebook"]), {"score": 0.0, "output": "", "tests": []})
        earned = _number(row["points"], row["exercise"])
        results["score"] += earned or 0
        if earned is None and row["max_points"] not in ("", "0"):
            continue  # not judged yet (needs full mode): no test until it is graded
        results["tests"].append(
            {
                "name": row["exercise"] or row["notebook"],
                "score": earned or 0.0,
                "max_score": _number(row["max_points"], "max_points") or 0.0,
                "status": "passed" if row["passed"] == "1" else "failed",
                "output": row["message"].lstrip("'"),
            }
        )
    for row in written:
        results = found.setdefault((row["student"], row["notebook"]), {"score": 0.0, "output": "", "tests": []})
        earned = _number(row.get("points", ""), row["rubric"])
        results["score"] += earned or 0
        results["tests"].append(
            {
                "name": f"written answer (rubric:{row['rubric']})",
                "score": earned or 0.0,
                "max_score": _number(row["max_points"], "max_points") or 0.0,
                "status": "passed" if earned is not None and earned > 0 else "failed",
                "output": "not marked yet" if earned is None else "marked by your teacher",
            }
        )
    for (_student, notebook), results in found.items():
        results["output"] = f"{notebook}: {results['score']:g} points (graded by minidape)"
    return found
