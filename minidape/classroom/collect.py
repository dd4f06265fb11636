"""What was handed in: the submissions in the files and folders the teacher names (one per student and
notebook, links and other non-regular files refused unread), and a submission file's cells."""

from __future__ import annotations

import json
import os
import re
import stat
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

TEACHER = Path(__file__).resolve().parents[2] / "notebooks"
# Caps checked before the grader parses anything of a submission, so its own memory stays bounded whatever a
# notebook holds: the file (outputs and figures included), each cell's source (a student's code cell is a few
# kB; a 5-million-element literal parsed whole took the grader to 5 GB), each written answer.
MAX_SUBMISSION_BYTES = 32_000_000
MAX_CELL_SOURCE = 200_000  # characters
MAX_WRITTEN = 20_000  # characters


def too_large(size: int, limit: int, unit: str = "MB") -> str:
    """The row's words for a part over its cap: ``too large: 10.5 MB, limit 32 MB``."""
    scale = 1e6 if unit == "MB" else 1
    return f"too large: {size / scale:.3g} {unit}, limit {limit / scale:g} {unit}"


class NotANotebook(ValueError):
    """A submission file that cannot be read as a notebook; the message says why, in words."""


@dataclass
class Row:
    exercise: str
    points: float
    max_points: float
    status: str  # exercises.PASSED, PARTLY, FAILED, NOT_DONE or NEEDS_FULL
    message: str
    code: str = ""  # the mistake's stable code (exercises.Wrong.code), "" when none


@dataclass
class Written:
    """A written answer for the teacher to mark with its rubric (``docs/teaching.md``)."""

    rubric: str
    answer: str
    problem: str = ""


@dataclass
class Submission:
    student: str
    path: Path
    notebook: str = ""  # the teacher notebook's stem, or the file name when unknown
    rows: list[Row] = field(default_factory=list)
    problem: str = ""  # what stopped or broke the run, if anything
    cells: list[dict] = field(default_factory=list)  # executed, with outputs (for --feedback)
    written: list[Written] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def points(self) -> float:
        return sum(row.points for row in self.rows)

    @property
    def max_points(self) -> float:
        return sum(row.max_points for row in self.rows)


def printable(text: str) -> str:
    """``text`` without control and format characters (a newline in a folder name cannot forge an output line)."""
    return "".join(ch for ch in str(text) if not unicodedata.category(ch).startswith("C"))


def submissions(paths) -> list[Submission]:
    """The submissions named: a file is one (student: its name without .ipynb); a folder holds files (the same)
    and one folder per student (student: the folder's name) with that student's notebooks. Student ids keep no
    control characters. In a folder, a symbolic link or anything but a regular file is never followed nor read:
    it gets a row saying so. Of several files of one notebook (by their ``NN_`` names) in one student's folder, the
    one named exactly like the teacher's notebook is graded, else the newest; the others get a row saying which was."""
    found = []
    for path in map(Path, paths):
        if path.exists() and not (path.is_file() or path.is_dir()):  # a path you name may be a link
            found.append(_refused(printable(path.stem), path))
        elif path.is_file() and path.suffix == ".ipynb":
            found.append(Submission(printable(path.stem), path))
        elif path.is_dir():
            for entry in sorted(path.iterdir()):
                if entry.name.startswith("."):
                    continue
                student = printable(entry.stem if entry.suffix == ".ipynb" else entry.name)
                if entry.is_symlink() or not (entry.is_file() or entry.is_dir()):
                    found.append(_refused(student, entry))
                elif entry.is_file() and entry.suffix == ".ipynb":
                    found.append(Submission(student, entry))
                elif entry.is_dir():
                    found += _folder(student, entry)
        elif path.exists():
            raise ValueError(f"{path} is not a notebook (.ipynb) or a folder of notebooks")
        else:
            raise FileNotFoundError(f"no such notebook or folder: {path}")
    if not found:
        raise ValueError(f"no notebooks (.ipynb) in {', '.join(map(str, paths))}")
    return found


def _not_graded(message: str) -> Row:
    """The row of a file not graded: no points, the reason. The checks (`exercises`) are imported here, not at the
    top: they load torch, and the command line reads what was handed in before (a missing path answers at once)."""
    from .exercises import FAILED

    return Row("", 0, 0, FAILED, message)


def _refused(student: str, path: Path) -> Submission:
    what = "a symbolic link" if path.is_symlink() else "not a regular file"
    message = f"refused: {printable(path.name)} is {what}; hand in the notebook file itself"
    return Submission(student, path, printable(path.name), [_not_graded(message)], message)


def _folder(student: str, folder: Path) -> list[Submission]:
    """One student's notebooks, found without following links, one per notebook (see :func:`submissions`)."""
    files, refused = [], []
    for top, folders, names in os.walk(folder):  # never enters a linked folder
        folders[:] = sorted(f for f in folders if not f.startswith("."))
        for name in sorted(names):
            entry = Path(top) / name
            if name.startswith(".") or not name.endswith(".ipynb"):
                continue
            (refused if entry.is_symlink() or not entry.is_file() else files).append(entry)
    by_notebook: dict[str, list[Path]] = {}
    for entry in files:
        match = re.match(r"(\d\d)_", entry.name)
        by_notebook.setdefault(match.group(1) if match else str(entry), []).append(entry)
    found = [_refused(student, entry) for entry in refused]
    for number, entries in by_notebook.items():
        canonical = [e for e in entries if e.stem in {p.stem for p in TEACHER.glob(f"{number}_*.py")}]
        chosen = (canonical or sorted(entries, key=lambda e: (e.stat().st_mtime, str(e))))[-1]
        found.append(Submission(student, chosen))
        for other in entries:
            if other != chosen:
                message = (
                    f"not graded: {len(entries)} files of notebook {number} from this student; graded "
                    f"{printable(chosen.relative_to(folder))} (the one named like the teacher's notebook, else "
                    f"the newest)"
                )
                found.append(Submission(student, other, printable(other.name), [_not_graded(message)], message))
    return found or [
        Submission(
            student,
            folder,
            printable(folder.name),
            [_not_graded(f"no notebook (.ipynb) in {printable(folder)}")],
        )
    ]


def read_cells(path: Path) -> list[dict]:
    """A submission's cells (``cell_type``, ``source``, ``tags``), or :class:`NotANotebook` saying what is wrong."""
    try:  # never through a link (one put in its place since it was found), never a pipe or a device
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise NotANotebook("the file is gone (deleted before it was graded)") from None
    except OSError as error:
        raise NotANotebook(f"the file cannot be read: {error.strerror}") from None
    with os.fdopen(descriptor, "rb") as file:
        status = os.fstat(file.fileno())
        if not stat.S_ISREG(status.st_mode):
            raise NotANotebook("refused: not a regular file")
        if any(os.path.samestat(status, os.stat(p)) for p in TEACHER.iterdir()):
            raise NotANotebook("refused: this is a file of the teacher's edition, not a student's work")
        raw = file.read(MAX_SUBMISSION_BYTES + 1)  # never more: a file that grows meanwhile is still capped
    if len(raw) > MAX_SUBMISSION_BYTES:
        raise NotANotebook(f"refused, {too_large(max(status.st_size, len(raw)), MAX_SUBMISSION_BYTES)}")
    if not raw.strip():
        raise NotANotebook("the file is empty")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise NotANotebook("the file is binary, not a notebook (not UTF-8 text)") from None
    try:
        content = json.loads(text)
    except ValueError as error:
        raise NotANotebook(f"the file is not a notebook: invalid JSON ({error})") from None
    if not isinstance(content, dict) or not isinstance(content.get("cells"), list):
        keys = (", ".join(map(str, content)) or "no keys") if isinstance(content, dict) else type(content).__name__
        raise NotANotebook(f"the file is JSON but not a notebook: no list of cells (found: {keys})")
    cells = []
    for number, cell in enumerate(content["cells"], 1):
        source = cell.get("source") if isinstance(cell, dict) else None
        if isinstance(source, list) and all(isinstance(line, str) for line in source):
            source = "".join(source)
        if not isinstance(source, str) or cell.get("cell_type") not in ("code", "markdown", "raw"):
            raise NotANotebook(f"the file is not a valid notebook: cell {number} has no cell_type or source")
        if len(source) > MAX_CELL_SOURCE:
            raise NotANotebook(f"refused, cell {number} is {too_large(len(source), MAX_CELL_SOURCE, 'characters')}")
        tags = (cell.get("metadata") or {}).get("tags") if isinstance(cell.get("metadata"), dict) else None
        tags = [tag for tag in tags if isinstance(tag, str)] if isinstance(tags, list) else []
        count = cell.get("execution_count") if cell["cell_type"] == "code" else None
        cells.append(
            {
                "cell_type": cell["cell_type"],
                "source": source,
                "tags": tags,
                "execution_count": count if type(count) is int and count > 0 else None,
            }
        )
    return cells
