"""The notebooks the web book is made of (docs/book/build.py), without building it: what the student edition
removes and empties, on a fixture notebook holding every kind of cell and on the real notebooks; the Colab first
cell (docs/book/colab_cell.py) and the jupytext pairing (docs/book/pair.py) of every notebook. The browser test of
the built book is tests/test_book.py (`make test-book`)."""

import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jupytext
import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "book"))
import build as book  # noqa: E402  (docs/book/build.py)
import pair  # noqa: E402  (docs/book/pair.py)

SOURCES = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
COLAB_CELL = (ROOT / "docs" / "book" / "colab_cell.py").read_text()


def printed(text):
    return new_output("stream", name="stdout", text=text)


def cell(kind, source, tags=(), outputs=()):
    made = new_code_cell(source, outputs=list(outputs)) if kind == "code" else new_markdown_cell(source)
    made.metadata["tags"] = list(tags)
    return made


@pytest.fixture
def teachers():
    """A teacher's executed notebook with one cell of each kind the editions treat differently."""
    figure = new_output("display_data", data={"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"})
    notebook = new_notebook(
        cells=[
            cell("code", COLAB_CELL.split("\n", 1)[1], ["colab"]),
            cell("markdown", "# 99 · A fixture\n\nThe prose."),
            cell("code", "def f(x):\n    return exercises.todo()"),
            cell("code", "def f(x):\n    return 2 * x  # the worked solution", ["solution"], [printed("solved\n")]),
            cell("markdown", "**Worked answer.** The derivation, step by step.", ["solution"]),
            cell("code", "guess = 4.4", ["prediction"], [printed("guess recorded\n")]),
            cell("code", "measured = experiment()", ["reveals-prediction"], [printed("measured 4.44\n"), figure]),
            cell("code", 'exercises.check("f", f)', outputs=[printed("✓ exercise 99·f (implement): passed\n")]),
            cell("code", 'ok = check("g", g)', outputs=[printed("✓ exercise 99·g (derive): passed\n")]),
            cell("code", 'exercises.summary("99")', outputs=[printed("notebook 99: 2 of 2 exercises passed\n")]),
            cell("code", "# exercises.check( is only named here\nplot()", outputs=[figure]),
            cell(
                "code",
                "train()",
                outputs=[new_output("display_data", data={book.WIDGET: {"model_id": "1"}, "text/plain": "100%"})],
            ),
        ],
        metadata={
            "jupytext": {"formats": "ipynb,py:percent"},
            "kernelspec": {"name": "python3", "display_name": "Python 3"},
            "widgets": {"application/vnd.jupyter.widget-state+json": {"state": {}}},
        },
    )
    nbformat.validate(notebook)
    return notebook


def test_the_student_edition_drops_solutions_and_empties_what_answers_a_question(teachers):
    student = book.student_notebook(teachers)
    sources = [c.source for c in student.cells]
    assert not [c for c in student.cells if "solution" in book.tags(c)] and len(sources) == len(teachers.cells) - 2
    assert "**Worked answer.**" not in "".join(sources) and "2 * x" not in "".join(sources)
    outputs = {c.source.splitlines()[0]: c.outputs for c in student.cells if c.cell_type == "code"}
    for emptied in ("guess = 4.4", "measured = experiment()", 'exercises.check("f", f)', 'ok = check("g", g)',
                    'exercises.summary("99")'):  # fmt: skip
        assert outputs[emptied] == [], emptied
    assert outputs["# exercises.check( is only named here"], "a cell only naming check keeps its figure"
    assert teachers.cells[6].outputs, "the teacher's notebook itself is left as it was"


def test_the_teachers_pages_fold_every_solution_and_the_colab_cell_stays_off_the_page(teachers):
    page = book.page_notebook(teachers, "teacher")
    assert "remove-cell" in book.tags(page.cells[0])
    assert "hide-cell" in book.tags(page.cells[3]) and page.cells[3].outputs  # folded, output and all
    wrapped = page.cells[4].source
    assert (
        wrapped.startswith(":::{worked-solution}\n") and wrapped.endswith("\n:::") and "**Worked answer.**" in wrapped
    )
    assert page.cells[-1].outputs[0]["data"] == {"text/plain": "100%"} and "widgets" not in page.metadata
    student_page = book.page_notebook(book.student_notebook(teachers), "student")
    assert not any("hide-cell" in book.tags(c) or "worked-solution" in c.source for c in student_page.cells)
    fenced = cell("markdown", "::::{note}\ninside\n::::", ["solution"])
    assert book.page_notebook(new_notebook(cells=[fenced]), "teacher").cells[0].source.startswith(":::::{worked")


def test_each_editions_download_is_unpaired_and_installs_what_the_teacher_names(teachers):
    notebooks = {"99_fixture": teachers}
    wheel = "/srv/wheels/minidape-0.1.0-py3-none-any.whl"
    for edition in book.EDITIONS:
        (made,) = book.edition_notebooks(edition, notebooks, install_from=wheel).values()
        assert "jupytext" not in made.metadata and f'MINIDAPE_SOURCE = "{wheel}"' in made.cells[0].source
        assert any("solution" in book.tags(c) for c in made.cells) == (edition == "teacher")
    (unchanged,) = book.edition_notebooks("student", notebooks).values()
    assert 'MINIDAPE_SOURCE = "minidape"' in unchanged.cells[0].source
    with pytest.raises(ValueError, match="without quotes"):
        book.edition_notebooks("student", notebooks, install_from='x"; import os')
    with pytest.raises(ValueError, match="valid editions are teacher, student"):
        book.edition_notebooks("students", notebooks)


@pytest.fixture(scope="module")
def real_notebooks():
    return book.teacher_notebooks()


@pytest.mark.parametrize("stem", [source.stem for source in SOURCES])
def test_the_real_student_editions_keep_outputs_but_none_that_answers(stem, real_notebooks):
    teachers = real_notebooks[stem]
    student = book.student_notebook(teachers)
    assert not [c for c in student.cells if "solution" in book.tags(c)]
    answering = [  # the convention of the notebooks: check and summary cells call exercises.check / .summary
        c
        for c in student.cells
        if c.cell_type == "code"
        and (
            {"prediction", "reveals-prediction"} & set(book.tags(c))
            or re.search(r"^[^#]*exercises\.(check|summary)\(", c.source, re.M)
        )
    ]
    assert len(answering) >= 4 and all(c.outputs == [] for c in answering)  # checks, summary, predictions
    assert sum(bool(c.outputs) for c in student.cells if c.cell_type == "code") >= 3  # the rest keeps its outputs
    shown = "".join(str(output) for c in student.cells if c.cell_type == "code" for output in c.outputs)
    assert not re.search(r"exercise \d\d·|exercises passed", shown)  # no verdict printed anywhere else


# ---------------------------------------------------------------------------------- the Colab cell and pairing


@pytest.mark.parametrize("source", SOURCES, ids=lambda path: path.stem)
def test_every_notebook_opens_with_the_colab_cell_and_is_paired_in_both_files(source):
    text = source.read_text()
    assert text.split(pair.HEADER_END, 1)[1].startswith(COLAB_CELL), f"{source.name}: `make pair` adds the cell"
    assert pair.with_colab_cell(text, source.name) == text
    for path in (source, source.with_suffix(".ipynb")):
        notebook = jupytext.read(path)
        assert notebook.metadata["jupytext"]["formats"] == "ipynb,py:percent", f"{path.name}: not paired"
        assert book.tags(notebook.cells[0]) == ["colab"] and notebook.cells[0].source == COLAB_CELL.split("\n", 1)[
            1
        ].rstrip("\n")


def test_pairing_replaces_an_older_colab_cell_and_refuses_a_file_without_header():
    header = "# ---\n# jupyter:\n#   jupytext: {}\n# ---\n\n"
    older = header + '# %% tags=["colab"]\nMINIDAPE_SOURCE = "old"\n\n# %% [markdown]\n# # Title\n'
    assert pair.with_colab_cell(older, "x.py") == header + COLAB_CELL + "\n# %% [markdown]\n# # Title\n"
    with pytest.raises(ValueError, match="x.py: no jupytext header"):
        pair.with_colab_cell("# %%\nprint(1)\n", "x.py")


def test_make_pair_gives_an_unpaired_executed_notebook_its_colab_cell_and_keeps_its_outputs(tmp_path):
    """`make pair` (docs/book/pair.py) on a notebook as it was before: the .py and the .ipynb become the committed
    ones, every output kept (the Colab cell's id aside, which jupytext draws, and its execution record where the
    committed notebook was executed with it)."""
    source = SOURCES[0]
    text = source.read_text().replace("#     formats: ipynb,py:percent\n", "")
    (tmp_path / source.name).write_text(text.replace(COLAB_CELL + "\n", ""))
    executed = nbformat.read(source.with_suffix(".ipynb"), as_version=4)
    del executed.cells[0], executed.metadata["jupytext"]
    nbformat.write(executed, tmp_path / f"{source.stem}.ipynb")
    pair.main(tmp_path)
    assert (tmp_path / source.name).read_text() == source.read_text()
    paired = nbformat.read(tmp_path / f"{source.stem}.ipynb", as_version=4)
    committed = nbformat.read(source.with_suffix(".ipynb"), as_version=4)
    paired.cells[0].id = committed.cells[0].id
    paired.cells[0].metadata = committed.cells[0].metadata
    paired.cells[0].execution_count = committed.cells[0].execution_count
    assert paired == committed


def test_jupytext_sync_keeps_the_paired_files_as_they_are(tmp_path):
    """`jupytext --sync` from either side, on a copy of a notebook: neither file changes (the .py is the .ipynb's
    source). jupytext's command line in this process: a process of its own takes seconds to start."""
    from jupytext.cli import jupytext as jupytext_command

    source = SOURCES[0]
    for path in (source, source.with_suffix(".ipynb")):
        shutil.copy(path, tmp_path / path.name)
    for newer in (".py", ".ipynb"):
        copy = tmp_path / f"{source.stem}{newer}"
        os.utime(copy)  # the file jupytext takes as the source
        jupytext_command(["--sync", "--quiet", str(copy)])
        assert (tmp_path / source.name).read_text() == source.read_text()
        assert nbformat.read(tmp_path / f"{source.stem}.ipynb", as_version=4) == nbformat.read(
            source.with_suffix(".ipynb"), as_version=4
        )


def run_colab_cell(monkeypatch, installed: set[str], quick: bool = False):
    """Run the Colab cell where only ``installed`` is importable; the pip commands it would run."""
    commands = []
    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: found(name) if name in installed else None)
    monkeypatch.setattr(
        subprocess, "run", lambda command, **k: commands.append(command) or subprocess.CompletedProcess(command, 0)
    )
    monkeypatch.setenv("MINIDAPE_QUICK", "0")  # restored after the test, whatever the cell sets
    exec(COLAB_CELL.replace("QUICK_MODE = False", f"QUICK_MODE = {quick}"), {})
    return commands


def test_the_colab_cell_installs_minidape_only_where_missing_and_keeps_torch(monkeypatch):
    assert run_colab_cell(monkeypatch, {"minidape", "torch"}) == [] and os.environ["MINIDAPE_QUICK"] == "0"
    (command,) = run_colab_cell(monkeypatch, {"torch"}, quick=True)
    assert command[-2:] == ["minidape", f"torch=={importlib.metadata.version('torch')}"]  # the installed torch
    assert os.environ["MINIDAPE_QUICK"] == "1"
    (command,) = run_colab_cell(monkeypatch, set())
    assert command[-1] == "minidape"  # no torch yet: minidape's own requirement brings one


def test_the_handouts_student_edition_is_unpaired():
    """The teacher's notebooks are paired with their .py; the hand-out's are not (a student's save makes no .py)."""
    from minidape.classroom import handout

    teachers = jupytext.read(SOURCES[0])
    assert teachers.metadata["jupytext"]["formats"] == "ipynb,py:percent"
    assert "jupytext" not in handout.student_notebook(teachers).metadata
    assert handout.student_notebook(teachers).metadata["kernelspec"] == teachers.metadata["kernelspec"]
