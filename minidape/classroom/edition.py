"""The teacher's edition as the grader reads it: each notebook's roster of exercises, its check cells (found in the
syntax tree: a call, not a mention), the prediction variables they pass, and how a submission's cells are matched to
a notebook and given back the teacher's check cells (``restore``). The grader (``grade``) runs what this
describes."""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path

from . import exercises
from .collect import TEACHER

# ------------------------------------------------------------------------------ the teacher's edition


@dataclass
class Edition:
    """One notebook of the teacher's edition: its cells, and which of them check which exercise."""

    stem: str  # "02_kerple_cpd_kernels"
    number: str  # "02"
    cells: list[dict]  # {"cell_type", "source", "tags"}
    roster: list[exercises.Exercise]
    checks: dict[str, int] = field(default_factory=dict)  # exercise name -> index of its check cell
    # experiment name -> {the checker's parameter: the prediction variable the check cell passes to it}
    predictions: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def rubrics(self) -> list[str]:
        """The rubric ids of its written-answer cells, in order."""
        return [rubric for cell in self.cells if "written" in cell["tags"] for rubric in _rubrics(cell)]


def _rubrics(cell: dict) -> list[str]:
    return [tag.removeprefix("rubric:") for tag in cell.get("tags", ()) if tag.startswith("rubric:")]


def check_calls(source: str) -> list[ast.Call]:
    """The calls ``check("name", ...)`` (or ``exercises.check(name="name", ...)``) in a cell's code, found in its
    syntax tree: a call, not a mention in a comment or a string. A cell that does not parse calls nothing."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call) and _checked_name(node) is not None]


def _checked_name(call: ast.Call) -> str | None:
    """The exercise name a ``check`` call names as a string literal (by position or as ``name=``)."""
    function = call.func
    if not (
        (isinstance(function, ast.Attribute) and function.attr == "check")
        or (isinstance(function, ast.Name) and function.id == "check")
    ):
        return None
    named = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "name"), None)
    return named.value if isinstance(named, ast.Constant) and isinstance(named.value, str) else None


def checked(source: str) -> list[str]:
    """The exercise names a cell's code checks, in order."""
    return [_checked_name(call) for call in check_calls(source)]


def exercise_names(notebook) -> list[str]:
    """The exercises a notebook's code cells check (solution cells aside), in order of first appearance."""
    names = []
    for cell in notebook.cells:
        if cell.cell_type == "code" and "solution" not in cell.metadata.get("tags", []):
            names += [n for n in checked(cell.source) if n in exercises.EXERCISES and n not in names]
    return names


def editions(folder: Path = TEACHER) -> dict[str, Edition]:
    """The teacher's notebooks by number; an error if one's check cells disagree with the exercises' registry."""
    import jupytext

    if not folder.is_dir():
        raise FileNotFoundError(f"the teacher's edition {folder} is not there: grade from a checkout of minidape")
    found = {}
    for path in sorted(folder.glob("[0-9][0-9]_*.py")):
        notebook = jupytext.read(path)
        cells = [
            {"cell_type": c.cell_type, "source": c.source, "tags": list(c.metadata.get("tags", []))}
            for c in notebook.cells
        ]
        edition = Edition(path.stem, path.name[:2], cells, exercises.exercises_of(path.name[:2]))
        for name in exercise_names(notebook):
            edition.checks[name] = next(
                i
                for i, c in enumerate(notebook.cells)
                if c.cell_type == "code" and "solution" not in c.metadata.get("tags", []) and name in checked(c.source)
            )
        if list(edition.checks) != [e.name for e in edition.roster]:
            raise RuntimeError(
                f"{path}: its check cells ({list(edition.checks)}) differ from the registered "
                f"exercises of {edition.number} ({[e.name for e in edition.roster]})"
            )
        predicted = set(
            literal_assignments([c for c in cells if "prediction" in c["tags"] and "solution" not in c["tags"]])
        )
        for name, index in edition.checks.items():
            edition.predictions[name] = {
                parameter: variable
                for parameter, variable in _names_passed_to_check(cells[index]["source"], name).items()
                if variable in predicted
            }
        found[edition.number] = edition
    return found


def _names_passed_to_check(source: str, name: str) -> dict[str, str | None]:
    """The variables passed to ``exercises.check("name", ...)`` in ``source``, by the checker's parameter they
    bind to (by position or by keyword)."""
    parameters = list(inspect.signature(exercises.EXERCISES[name].checker).parameters)
    for call in check_calls(source):
        if _checked_name(call) == name:
            passed = dict(zip(parameters, call.args[1:]))  # args[0] is the name, unless given as name=
            passed.update({k.arg: k.value for k in call.keywords if k.arg not in (None, "name")})
            return {parameter: value.id if isinstance(value, ast.Name) else None for parameter, value in passed.items()}
    return {}


def literal_assignments(cells: list[dict]) -> dict:
    """What the cells assign to plain names with literal values (``x = 4.4``, ``x = {"a": True}``), in order:
    a later cell's value wins. Anything else in them (a computed value, a syntax error) is left out."""
    found = {}
    for cell in cells:
        try:
            tree = ast.parse(cell["source"])
        except (SyntaxError, ValueError):
            continue
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                try:
                    found[node.targets[0].id] = ast.literal_eval(node.value)
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    found.pop(node.targets[0].id, None)
    return found


def _same(source: str) -> str:
    return "\n".join(line.rstrip() for line in source.strip().splitlines())


def identify(path: Path, cells: list[dict] | None, known: dict[str, Edition]) -> Edition | None:
    """Which teacher notebook a submission is: ``NN_`` in its file name, else the one whose cells it holds
    most (at least three, unchanged)."""
    match = re.match(r"(\d\d)_", path.name)
    if match and match.group(1) in known:
        return known[match.group(1)]
    if not cells:
        return None
    theirs = {_same(c["source"]) for c in cells if c["source"].strip()}
    counts = {
        number: sum(_same(c["source"]) in theirs for c in edition.cells if c["source"].strip())
        for number, edition in known.items()
    }
    best = max(counts, key=counts.get, default=None)
    return known[best] if best is not None and counts[best] >= 3 else None


def defined_in_check_cells(edition: Edition, cells: list[dict]) -> dict[str, list[str]]:
    """Per exercise, the names a submission's own check cells define that the teacher's check cell of that
    exercise passes: an answer written inside a check cell, which :func:`restore` drops with the cell."""
    lost: dict[str, list[str]] = {}
    for cell in cells:
        names = set(checked(cell["source"])) & set(edition.checks) if cell["cell_type"] == "code" else set()
        if not names:
            continue
        defined = _defined(cell["source"])
        for name in names:
            used = set(_names_passed_to_check(edition.cells[edition.checks[name]]["source"], name).values())
            lost.setdefault(name, []).extend(sorted(defined & used))
    return lost


def _defined(source: str) -> set[str]:
    """The names a cell's top level binds (functions, classes, assignments)."""
    tree = ast.parse(source)
    names = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    return names | {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def in_execution_order(cells: list[dict]) -> list[dict]:
    """The cells as the student ran them, where the notebook's execution counts show it: when every code cell
    that holds code has a count and no two share one, the code cells take their slots in the order of their
    counts (a definition saved below its check but run before it stays before it); otherwise as saved. Other
    cells keep their places."""
    code = [i for i, c in enumerate(cells) if c["cell_type"] == "code" and c["source"].strip()]
    counts = [cells[i].get("execution_count") for i in code]
    if not code or None in counts or len(set(counts)) < len(counts):
        return cells
    ordered = list(cells)
    for slot, index in zip(code, sorted(code, key=lambda i: cells[i]["execution_count"])):
        ordered[slot] = cells[index]
    return ordered


def restore(edition: Edition, cells: list[dict]) -> list[dict]:
    """The submission with its check cells replaced by the teacher's (see the module doc, step 2). Each
    restored check cell carries ``"checks": name``."""
    names = set(edition.checks)
    kept = [c for c in cells if not (c["cell_type"] == "code" and set(checked(c["source"])) & names)]
    check_cells = set(edition.checks.values())
    # Anchors: the teacher's other cells, matched in order to the submission's unchanged ones.
    position, matched = 0, {}
    for index, cell in enumerate(edition.cells):
        if index in check_cells or "solution" in cell["tags"] or not cell["source"].strip():
            continue
        for at in range(position, len(kept)):
            if _same(kept[at]["source"]) == _same(cell["source"]):
                matched[index], position = at, at + 1
                break
    before: dict[int, list[dict]] = {}
    for name, index in sorted(edition.checks.items(), key=lambda item: item[1]):
        after = [matched[i] for i in sorted(matched) if i > index]
        at = after[0] if after else len(kept)
        before.setdefault(at, []).append(
            {"cell_type": "code", "source": edition.cells[index]["source"], "checks": name}
        )
    restored = []
    for at in range(len(kept) + 1):
        restored += before.get(at, [])
        if at < len(kept):
            restored.append(dict(kept[at]))
    return restored
