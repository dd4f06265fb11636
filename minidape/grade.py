"""Grade students' notebooks: run each one in a clean kernel and count the exercises whose check passed.

    python -m minidape grade submissions/*.ipynb --csv grades.csv --timeout 900

Each notebook runs in its own scratch folder (a copy of the notebook alone) with a fresh kernel, under a time
limit for the whole notebook, and with errors allowed (a cell that raises does not stop the cells after it).
A notebook that loops forever, raises, or deletes the files around it therefore costs only its own grade.

The exercises of a notebook are the names it passes to ``exercises.check("name", ...)``; their verdicts come
from the log that :func:`minidape.exercises.check` appends to (``MINIDAPE_GRADE_LOG``), kept outside the
scratch folder. An exercise whose check never ran (time limit, an earlier error that left its answer
undefined) counts as not passed.
"""
from __future__ import annotations

import csv
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from .exercises import EXERCISES, GRADE_LOG, PASSED

CHECK_CALL = re.compile(r"""exercises\.check\(\s*["'](\w+)["']""")


@dataclass
class Grade:
    notebook: str
    exercises: dict[str, bool] = field(default_factory=dict)   # name -> passed, in the notebook's order
    problem: str = ""                                         # what stopped or broke the run, if anything

    @property
    def passed(self) -> int:
        return sum(self.exercises.values())


def notebook_paths(paths) -> list[Path]:
    """The notebooks named: files as given, folders as their ``*.ipynb``. Errors name a missing path."""
    found = []
    for path in map(Path, paths):
        if path.is_dir():
            found += sorted(p for p in path.glob("*.ipynb") if not p.name.startswith("."))
        elif path.is_file() and path.suffix == ".ipynb":
            found.append(path)
        elif path.exists():
            raise ValueError(f"{path} is not a notebook (.ipynb) or a folder of notebooks")
        else:
            raise FileNotFoundError(f"no such notebook or folder: {path}")
    if not found:
        raise ValueError(f"no notebooks (.ipynb) in {', '.join(map(str, paths))}")
    return found


def exercise_names(notebook) -> list[str]:
    """The exercises a notebook checks, in order of first appearance in its code cells."""
    names = []
    for cell in notebook.cells:
        if cell.cell_type == "code":
            names += [name for name in CHECK_CALL.findall(cell.source) if name in EXERCISES and name not in names]
    return names


def _run(notebook, folder: Path, log: Path, timeout: float) -> str:
    """Execute ``notebook`` in ``folder``; return what went wrong ("" if every cell ran without an error)."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    deadline = time.monotonic() + timeout
    client = NotebookClient(notebook, kernel_name="python3", allow_errors=True, interrupt_on_timeout=False,
                            timeout_func=lambda cell: max(1, int(deadline - time.monotonic())),
                            resources={"metadata": {"path": str(folder)}})
    try:
        client.execute(env={**os.environ, GRADE_LOG: str(log)}, cwd=str(folder))
    except CellTimeoutError:
        return f"stopped at the time limit of {timeout:g} s"
    except DeadKernelError as error:
        return f"the kernel died: {str(error).splitlines()[0]}"
    errors = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.get("outputs", [])
              if output.get("output_type") == "error"]
    return f"{len(errors)} cell(s) raised, first {errors[0]['ename']}" if errors else ""


def grade_notebook(path: str | os.PathLike, timeout: float = 600) -> Grade:
    """Run one notebook in a scratch copy with a fresh kernel; the verdict of each of its exercises."""
    path = Path(path)
    notebook = nbformat.read(path, as_version=4)
    grade = Grade(str(path), {name: False for name in exercise_names(notebook)})
    # Two folders: the notebook's (it may delete whatever it finds there) and the verdicts' log, apart.
    with tempfile.TemporaryDirectory(prefix="minidape-grade-", ignore_cleanup_errors=True) as scratch, \
            tempfile.TemporaryDirectory(prefix="minidape-verdicts-", ignore_cleanup_errors=True) as verdicts_folder:
        folder, log = Path(scratch), Path(verdicts_folder) / "verdicts.jsonl"
        shutil.copy(path, folder / path.name)
        try:
            grade.problem = _run(notebook, folder, log, timeout)
        except Exception as error:      # a notebook the kernel cannot even start on: its grade only
            grade.problem = f"could not run: {type(error).__name__}: {error}"
        verdicts = {}
        if log.exists():
            for line in log.read_text().splitlines():
                try:
                    entry = json.loads(line)
                    verdicts[entry["exercise"]] = entry["status"] == PASSED
                except (ValueError, KeyError, TypeError):
                    continue                # a damaged line counts for nothing
    for name in grade.exercises:
        grade.exercises[name] = verdicts.get(name, False)
    return grade


def table(grades: list[Grade]) -> str:
    width = max(len("notebook"), *(len(grade.notebook) for grade in grades))
    lines = [f"{'notebook':<{width}}  passed  problem", f"{'-' * width}  ------  -------"]
    for grade in grades:
        lines.append(f"{grade.notebook:<{width}}  {grade.passed:>2} / {len(grade.exercises):<2} {grade.problem or '-'}")
    return "\n".join(lines)


def write_csv(grades: list[Grade], path: str | os.PathLike) -> None:
    """``notebook,exercise,passed`` (passed is 1 or 0), one row per exercise; written whole or not at all."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.partial")
    with open(partial, "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["notebook", "exercise", "passed"])
        for grade in grades:
            for name, ok in grade.exercises.items():
                writer.writerow([grade.notebook, name, int(ok)])
    os.replace(partial, path)


def check_csv_path(path: str | os.PathLike) -> None:
    """Refuse a CSV path that cannot be written, before any notebook runs."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"--csv {path} is a folder; give a file name")
    if not path.parent.resolve().is_dir():
        raise FileNotFoundError(f"--csv {path}: the folder {path.parent} does not exist")
    if not os.access(path.parent.resolve(), os.W_OK):
        raise ValueError(f"--csv {path}: the folder {path.parent} is not writable")


def grade(paths, csv_path: str | os.PathLike | None = None, timeout: float = 600) -> list[Grade]:
    """Grade every notebook named (files or folders), print the table, and write the CSV if asked."""
    if not timeout > 0:
        raise ValueError(f"--timeout must be > 0 seconds; got {timeout}")
    if csv_path is not None:
        check_csv_path(csv_path)
    grades = []
    for path in notebook_paths(paths):
        print(f"grading {path} ...", flush=True)
        grades.append(grade_notebook(path, timeout))
    print(table(grades))
    if csv_path is not None:
        write_csv(grades, csv_path)
        print(f"wrote {csv_path}")
    return grades
