"""The hand-out (`python -m minidape handout OUT/`, `make handout`): no line of a worked solution anywhere in it,
the wheel included. That the hand-out's wheel installs into a fresh venv far from the checkout and runs every
student notebook top to bottom is tests/test_colab.py's (`make test-colab`: minutes, so outside `make test`)."""

import zipfile

import nbformat
import pytest

from minidape.classroom import handout


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    return handout.handout(tmp_path_factory.mktemp("given") / "handout")


def all_solution_lines():
    return handout.copyable_lines(handout.teacher_notebooks())


def test_the_handout_holds_no_solution_line_and_no_teacher_file(made):
    lines = all_solution_lines()
    assert len(lines) > 50  # the search has something to find
    assert handout.leaks(made, lines) == []
    (wheel,) = made.glob("minidape-*.whl")
    members = zipfile.ZipFile(wheel).namelist()
    assert "minidape/classroom/exercises/framework.py" in members
    assert any(m.startswith("minidape/corpora/") for m in members)
    assert not [m for m in members if m.endswith(".ipynb") or m.startswith("notebooks/")]
    # the teacher's measurements do ship: a student's quick run judges its predictions against them, as the grader
    assert {"minidape/classroom/references.json", "minidape/classroom/reference_runs.json"} <= set(members)
    notebooks = sorted(made.glob("notebooks/*.ipynb"))
    assert [p.stem for p in notebooks] == [p.stem for p in handout.teacher_notebooks()]
    for path in notebooks:
        cells = nbformat.read(path, as_version=4).cells
        assert not [c for c in cells if "solution" in c.metadata.get("tags", [])]
        assert not [c for c in cells if c.cell_type == "code" and c.outputs]  # no executed teacher output
    readme = (made / "README.md").read_text()
    assert wheel.name in readme and "exercises.check" in readme and "Hand in" in readme


def test_the_leak_search_finds_a_solution_line_in_a_wheel_and_a_notebook(tmp_path, made):
    """The search the hand-out and the test rely on: a solution line planted in a wheel member, or in a
    student notebook, is found."""
    line = sorted(all_solution_lines())[0]
    with zipfile.ZipFile(tmp_path / "planted.whl", "w") as wheel:
        wheel.writestr("minidape/extra.py", f"x = 1\n    {line}  # planted\n")
    assert handout.leaks(tmp_path, {line}) == [f"planted.whl/minidape/extra.py: {line}"]
    notebook = nbformat.read(next(made.glob("notebooks/*.ipynb")), as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell(line))
    nbformat.write(notebook, tmp_path / "leaky.ipynb")
    assert any(found.startswith("leaky.ipynb") for found in handout.leaks(tmp_path, {line}))


def test_an_existing_folder_is_never_replaced_and_bad_choices_are_named(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="never replaced"):
        handout.handout(tmp_path / "out")
    assert (tmp_path / "out" / "mine.txt").read_text() == "keep"
    with pytest.raises(ValueError, match="no notebook 99"):
        handout.handout(tmp_path / "new", numbers=["99"])
    assert not (tmp_path / "new").exists() and [p.name for p in tmp_path.iterdir()] == ["out"]
