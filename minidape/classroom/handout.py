"""The hand-out: what a teacher gives students, and nothing of the teacher's edition.

    python -m minidape handout handout/                  # every notebook
    python -m minidape handout handout/ --notebooks 03 04

writes, from a checkout of minidape:

* ``notebooks/NN_topic.ipynb``: the student edition (cells tagged ``solution`` removed, no outputs);
* ``minidape-<version>-py3-none-any.whl``: the package (with its corpora) as a wheel, built from the sources;
  the teacher's notebooks, their executed outputs and the reference measurements live outside the package and
  are not in it;
* ``README.md``: for students: install, open, run a check, hand in.

Before anything is written, every line a student could copy from a worked solution (:func:`solution_lines`)
is searched for in every file of the hand-out, the wheel's members included; a hand-out that holds one is
refused. The folder is written whole or not at all, and an existing one is never replaced.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # minidape/, above classroom/
ROOT = PACKAGE.parent  # the checkout: notebooks/, pyproject.toml, data/
TEACHER = ROOT / "notebooks"


def is_solution(cell) -> bool:
    return "solution" in cell.metadata.get("tags", [])


def teacher_notebooks(numbers=None) -> list[Path]:
    """The teacher's notebook sources (``notebooks/NN_*.py``), all or those numbered ``numbers`` ("03", ...)."""
    if not (ROOT / "pyproject.toml").is_file() or not TEACHER.is_dir():
        raise FileNotFoundError(
            f"the hand-out is made from a checkout of minidape (notebooks/ and pyproject.toml "
            f"beside {PACKAGE}); {ROOT} is not one"
        )
    found = {path.name[:2]: path for path in sorted(TEACHER.glob("[0-9][0-9]_*.py"))}
    if numbers is None:
        return list(found.values())
    unknown = [number for number in numbers if number not in found]
    if unknown:
        raise ValueError(f"--notebooks: no notebook {', '.join(unknown)}; the notebooks are {', '.join(found)}")
    return [found[number] for number in numbers]


def solution_lines(notebook) -> set[str]:
    """The lines of a notebook's solution cells a student could copy: code (or prose) not already in the cell
    before it or in minidape's library modules (which every student has; the checks in minidape/classroom/exercises/ are
    not exempt), without comments, docstrings, signatures and short generic lines."""
    library = {
        line.split("  #")[0].strip()
        for path in PACKAGE.rglob("*.py")
        if "exercises" not in path.parts
        for line in path.read_text().splitlines()
    }
    lines, previous = set(), None
    for cell in notebook.cells:
        if not is_solution(cell):
            previous = cell
            continue
        given = {line.strip() for line in previous.source.splitlines()} if previous is not None else set()
        for line in cell.source.splitlines():
            line = line.split("  #")[0].strip()
            if (
                len(line) >= 24
                and line not in given
                and not line.startswith(("#", '"""', "def ", "class ", 'r"""'))
                and not line.endswith('"""')
                and line not in library
            ):
                lines.add(line)
    return lines


def copyable_lines(sources) -> set[str]:
    """The solution lines of the notebooks ``sources`` that no student-edition cell of any of them shows anyway
    (a generic line, such as a causal mask, that a worked solution shares with another notebook's text)."""
    import jupytext

    notebooks = [jupytext.read(source) for source in sources]
    shown = {
        line.split("  #")[0].strip()
        for notebook in notebooks
        for cell in notebook.cells
        if not is_solution(cell)
        for line in cell.source.splitlines()
    }
    return set().union(*(solution_lines(notebook) for notebook in notebooks)) - shown


def student_notebook(notebook):
    """The student edition of a teacher's notebook: its solution cells removed and no outputs."""
    import nbformat

    # without jupytext's pairing of the teacher's notebook with its .py: a student's save writes no .py beside it
    edition = nbformat.v4.new_notebook(metadata={k: v for k, v in notebook.metadata.items() if k != "jupytext"})
    for cell in notebook.cells:
        if is_solution(cell):
            continue
        cell = nbformat.from_dict(dict(cell))
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        edition.cells.append(cell)
    return edition


def leaks(folder: Path, lines: set[str]) -> list[str]:
    """Where in ``folder`` (files, and the members of its wheels) a line of ``lines`` appears."""
    found = []

    def search(name: str, text: str) -> None:
        present = {line.split("  #")[0].strip() for line in text.splitlines()} & lines
        found.extend(f"{name}: {line}" for line in sorted(present))

    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        if path.suffix == ".whl":
            with zipfile.ZipFile(path) as wheel:
                for member in wheel.namelist():
                    search(f"{path.name}/{member}", wheel.read(member).decode("utf-8", errors="replace"))
        elif path.suffix == ".ipynb":  # JSON: its cells' text and outputs, not the escaped file
            search(str(path.relative_to(folder)), "\n".join(_notebook_text(json.loads(path.read_text()))))
        else:
            search(str(path.relative_to(folder)), path.read_text(encoding="utf-8", errors="replace"))
    return found


def _notebook_text(node) -> list[str]:
    """Every string in a notebook's JSON (cell sources, outputs, metadata), lists of lines joined."""
    if isinstance(node, str):
        return [node]
    if isinstance(node, list) and all(isinstance(item, str) for item in node):
        return ["".join(node)]
    items = node.values() if isinstance(node, dict) else node if isinstance(node, list) else []
    return [text for item in items for text in _notebook_text(item)]


def build_wheel(into: Path) -> Path:
    """The package as a wheel, built from a copy of its sources (nothing written into the checkout)."""
    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch) / "source"
        source.mkdir()
        for name in ("pyproject.toml", "README.md", "LICENSE"):
            shutil.copy(ROOT / name, source / name)
        for folder in ("minidape", "data"):
            shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
        built = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "-q",
                str(source),
                "-w",
                str(into),
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if built.returncode != 0:  # pip's last line is "Failed to build one or more wheels": find the cause
            if "No space left on device" in built.stderr:
                raise OSError(
                    f"building the wheel failed: no space left on device (it is built in {scratch} and written "
                    f"to {into}); free some space, or set TMPDIR to a folder on a disk with room"
                )
            cause = [line for line in built.stderr.splitlines() if "error" in line.lower()][:1]
            said = cause or built.stderr.strip().splitlines()[-1:] or [f"pip exited with {built.returncode}"]
            raise OSError(f"building the wheel failed: {said[0]}")
    return next(into.glob("minidape-*.whl"))


STUDENT_README = """\
# {course}: the notebooks

You have, in this folder:

- `notebooks/`: the notebooks of the exercises ({names});
- `{wheel}`: the `minidape` package they use.

## Install (once)

With Python 3.10 or newer:

```bash
python -m venv .venv
.venv/bin/pip install "torch==2.13.0" "{wheel}[notebooks]"
```

(On Windows: `.venv\\Scripts\\pip`. For a GPU build of torch, install torch first as pytorch.org says.)

## Work

```bash
.venv/bin/jupyter lab notebooks/
```

Run a notebook from the top. Every exercise is a cell to fill in (it says `exercises.todo()` until you do),
followed by a check cell, `exercises.check("name", ...)`: run it after your answer and it says *passed*,
*failed* (with what is wrong and a hint) or *not done yet*, with your points. The checks draw new inputs every
time, so a right answer passes every time. A cell tagged `prediction` holds a prediction: write it **before**
you run the experiment it predicts, and do not change it afterwards (the grader reads it from that cell). A
cell that starts with **Your answer** is a written answer: replace its text with yours.

Set `MINIDAPE_QUICK=1` before starting Jupyter for a quick run (fewer training steps, the same code) while
you work; the experiments' numbers mean something only in the full run.

## Hand in

Hand in each notebook as its `.ipynb` file with its name unchanged (`03_train_and_extrapolate.ipynb`), saved
after a run from top to bottom. Keep the check cells as they are and your answers in the cells above them:
the grader replaces every check cell with the teacher's, so an answer written inside a check cell is lost.
"""


def handout(out, numbers=None, course: str = "minidape") -> Path:
    """Write the hand-out of the teacher's notebooks ``numbers`` (all when None) to the new folder ``out``."""
    import jupytext
    import nbformat

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(
            f"{out} already exists and is not an empty folder: give a new folder for the "
            f"hand-out (an earlier one is never replaced)"
        )
    if not out.parent.resolve().is_dir():
        raise FileNotFoundError(f"{out}: the folder {out.parent} does not exist")
    sources = teacher_notebooks(numbers)
    partial = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent.resolve()))
    try:
        (partial / "notebooks").mkdir()
        for source in sources:
            nbformat.write(student_notebook(jupytext.read(source)), partial / "notebooks" / f"{source.stem}.ipynb")
        wheel = build_wheel(partial)
        (partial / "README.md").write_text(
            STUDENT_README.format(course=course, wheel=wheel.name, names=", ".join(source.stem for source in sources))
        )
        found = leaks(partial, copyable_lines(teacher_notebooks()))
        if found:
            raise RuntimeError(f"the hand-out would hold lines of worked solutions: {found[:3]}")
        if out.exists():
            out.rmdir()  # empty, checked above
        partial.rename(out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return out
