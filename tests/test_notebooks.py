"""Every notebook source notebooks/NN_topic.py has its executed twin NN_topic.ipynb with the same code.

The .py (jupytext py:percent) is the source; the committed .ipynb is the same notebook executed in full mode
(`make notebooks`). Running the notebooks themselves is `make test-notebooks` (nbval, fast mode).
"""
from pathlib import Path

import jupytext
import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
SOURCES = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py"))
EXECUTED = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def code_cells(notebook):
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


@pytest.mark.parametrize("source", SOURCES, ids=lambda path: path.stem)
def test_executed_notebook_has_the_source_code(source):
    executed_path = source.with_suffix(".ipynb")
    assert executed_path.exists(), f"{executed_path.name} is missing: run `make notebooks` to execute {source.name}"
    expected = [cell.source for cell in code_cells(jupytext.read(source))]
    executed = nbformat.read(executed_path, as_version=4)
    actual = [cell.source for cell in code_cells(executed)]
    assert len(actual) == len(expected), (f"{executed_path.name} has {len(actual)} code cells, {source.name} has "
                                          f"{len(expected)}: re-run `make notebooks`")
    for number, (want, got) in enumerate(zip(expected, actual), start=1):
        assert got == want, f"code cell {number} of {executed_path.name} differs from {source.name}: re-run `make notebooks`"
    # executed top to bottom, without errors
    counts = [cell.get("execution_count") for cell in code_cells(executed)]
    assert counts == list(range(1, len(counts) + 1)), f"{executed_path.name} was not executed in order: {counts}"
    errors = [output for cell in code_cells(executed) for output in cell.outputs if output.output_type == "error"]
    assert not errors, f"{executed_path.name} holds an error output: {errors[0].ename}: {errors[0].evalue}"


@pytest.mark.parametrize("executed", EXECUTED, ids=lambda path: path.stem)
def test_every_executed_notebook_has_a_source(executed):
    assert executed.with_suffix(".py").exists(), f"{executed.name} has no source {executed.with_suffix('.py').name}"
