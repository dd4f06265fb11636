"""Every notebook source notebooks/NN_topic.py has its executed twin NN_topic.ipynb with the same code.

The .py (jupytext py:percent) is the source; the committed .ipynb is the same notebook executed in full mode
(`make notebooks`). Running the notebooks themselves is `make test-notebooks` (nbval, quick mode).
"""

import ast
import re
import subprocess
from pathlib import Path

import jupytext
import nbformat
import pytest

from minidape import exercises
from minidape.classroom.grade import checked, exercise_names

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
    assert len(actual) == len(expected), (
        f"{executed_path.name} has {len(actual)} code cells, {source.name} has {len(expected)}: re-run `make notebooks`"
    )
    for number, (want, got) in enumerate(zip(expected, actual), start=1):
        assert got == want, (
            f"code cell {number} of {executed_path.name} differs from {source.name}: re-run `make notebooks`"
        )
    # executed top to bottom, without errors; the Colab cell first (it installs minidape where it is missing) may not
    # have run: `make pair` adds it to an executed notebook, and `make notebooks` runs it as cell 1
    counts = [
        cell.get("execution_count") for cell in code_cells(executed) if "colab" not in cell.metadata.get("tags", [])
    ]
    first = 2 if counts and counts[0] == 2 else 1
    assert counts == list(range(first, first + len(counts))), (
        f"{executed_path.name} was not executed in order: {counts}"
    )
    errors = [output for cell in code_cells(executed) for output in cell.outputs if output.output_type == "error"]
    assert not errors, f"{executed_path.name} holds an error output: {errors[0].ename}: {errors[0].evalue}"


@pytest.mark.parametrize("executed", EXECUTED, ids=lambda path: path.stem)
def test_every_executed_notebook_has_a_source(executed):
    assert executed.with_suffix(".py").exists(), f"{executed.name} has no source {executed.with_suffix('.py').name}"


# ------------------------------------------------------------------------ exercises, editions, device


def names_defined(source):
    """Top-level names a cell's code binds (functions, classes, assignments)."""
    tree = ast.parse(source)
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
    return names


def is_solution(cell):
    return "solution" in cell.metadata.get("tags", [])


@pytest.mark.parametrize("source", SOURCES, ids=lambda path: path.stem)
def test_every_exercise_of_the_notebook_is_checked_in_it(source):
    notebook = jupytext.read(source)
    number = source.name[:2]
    expected = [exercise.name for exercise in exercises.exercises_of(number)]
    assert len(expected) >= 3, f"notebook {number} has {len(expected)} exercises in minidape/classroom/exercises/"
    assert exercise_names(notebook) == expected, f"{source.name} checks {exercise_names(notebook)}, not {expected}"
    last = code_cells(notebook)[-1].source
    assert f'exercises.summary("{number}")' in last, f"{source.name} must end with exercises.summary(\"{number}\")"


def names_used(source):
    return {node.id for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Name)}


@pytest.mark.parametrize("source", SOURCES, ids=lambda path: path.stem)
def test_every_solution_replaces_a_stub_defined_before_it(source):
    """The student edition drops the solution cells: whatever they define for later cells must exist there as a
    stub (a helper used only inside its solution need not)."""
    defined, solutions = set(), 0
    cells = code_cells(jupytext.read(source))
    for number, cell in enumerate(cells):
        if is_solution(cell):
            solutions += 1
            used_later = set().union(*(names_used(c.source) for c in cells[number + 1 :] if not is_solution(c)))
            missing = (names_defined(cell.source) - defined) & used_later
            assert not missing, f"{source.name}: solution cell defines {missing} with no stub before it"
        else:
            defined |= names_defined(cell.source)
            assert "NBVAL_CHECK_OUTPUT" not in cell.source or "exercises." not in cell.source, (
                f"{source.name}: a checked output cell runs an exercise check, whose output differs between editions"
            )
    assert solutions >= 3, f"{source.name} has {solutions} solution cells"


@pytest.mark.parametrize("source", SOURCES, ids=lambda path: path.stem)
def test_a_device_cell_comes_first_and_the_cost_is_stated(source):
    notebook = jupytext.read(source)
    cells = code_cells(notebook)[:3]
    device = [cell.source for cell in cells if "DEVICE = notebook.device()" in cell.source]  # CUDA, MPS, CPU
    assert device, f"{source.name}: no DEVICE cell (DEVICE = notebook.device()) among its first code cells"
    assert "print(" in device[0], f"{source.name}: the DEVICE cell must show the device"
    first = next(cell for cell in notebook.cells if "colab" not in cell.metadata.get("tags", []))  # after Colab's
    assert "**Cost" in first.source, f"{source.name}: the first cell must state what it trains and how long"


# ------------------------------------------------------------------------ no answer before its question


def student_edition(notebook):
    """What `make student` keeps: every cell but the ones tagged `solution`."""
    return [cell for cell in notebook.cells if not is_solution(cell)]


def distinctive_lines(solution, stub):
    """The lines of a solution cell a student could copy: code (or prose) not already in the stub before it,
    without comments, docstrings, signatures and short generic lines."""
    given = {line.strip() for line in stub.source.splitlines()} if stub is not None else set()
    lines = set()
    for line in solution.source.splitlines():
        line = line.split("  #")[0].strip()
        if (
            len(line) >= 24
            and line not in given
            and not line.startswith(("#", '"""', "def ", "class ", "r\"\"\""))
            and not line.endswith('"""')
        ):
            lines.add(line)
    return lines


@pytest.mark.parametrize("source", SOURCES, ids=lambda path: path.stem)
def test_the_student_edition_reveals_no_solution(source):
    """No line of a worked solution (code or worked answer) appears in any cell the student edition keeps."""
    notebook = jupytext.read(source)
    kept = "\n".join(cell.source for cell in student_edition(notebook))
    kept_lines = {line.split("  #")[0].strip() for line in kept.splitlines()}
    previous = None
    for cell in notebook.cells:
        if is_solution(cell):
            leaked = sorted(line for line in distinctive_lines(cell, previous) if line in kept_lines)
            assert not leaked, f"{source.name}: the student edition holds lines of a solution: {leaked}"
        else:
            previous = cell


@pytest.mark.parametrize("source", SOURCES, ids=lambda path: path.stem)
def test_predictions_are_recorded_as_literals_before_their_check(source):
    """A prediction cell (tag `prediction`) holds only literal assignments, and comes before the check that grades
    it, so a prediction is a number or a choice written down, not computed from the run."""
    notebook = jupytext.read(source)
    predictions = [cell for cell in code_cells(notebook) if "prediction" in cell.metadata.get("tags", [])]
    assert predictions, f"{source.name} has no prediction cell (tag `prediction`)"
    for cell in predictions:
        for node in ast.parse(cell.source).body:
            assert isinstance(node, ast.Assign), f"{source.name}: a prediction cell may only assign: {cell.source}"
            ast.literal_eval(node.value)  # raises on anything but a literal
    cells = code_cells(notebook)
    experiments = [e.name for e in exercises.exercises_of(source.name[:2]) if e.kind == "experiment"]
    first_prediction = min(cells.index(cell) for cell in predictions)
    last_check = max(i for i, cell in enumerate(cells) for name in experiments if f'check("{name}"' in cell.source)
    assert first_prediction < last_check, f"{source.name}: the prediction comes after its experiment's check"
    # a cell whose output shows an experiment's result (tag `reveals-prediction`, emptied in the student book)
    # comes after the notebook's first prediction: a student predicts before the result is on the page
    revealing = [i for i, cell in enumerate(cells) if "reveals-prediction" in cell.metadata.get("tags", [])]
    assert revealing, f"{source.name} has no cell tagged `reveals-prediction` (the output its prediction asks for)"
    early = [cells[i].source.splitlines()[0] for i in revealing if i < first_prediction]
    assert not early, f"{source.name}: a cell showing a predicted result comes before the prediction: {early}"


@pytest.mark.parametrize("source", SOURCES, ids=lambda path: path.stem)
def test_written_answer_cells_name_a_rubric_of_the_teachers_guide(source):
    guide = (NOTEBOOKS.parent / "docs" / "teaching.md").read_text()
    written = [cell for cell in jupytext.read(source).cells if "written" in cell.metadata.get("tags", [])]
    assert written, f"{source.name} has no written-answer cell (tag `written`)"
    for cell in written:
        assert cell.cell_type == "markdown", f"{source.name}: a written answer is a markdown cell"
        rubrics = [tag[len("rubric:") :] for tag in cell.metadata["tags"] if tag.startswith("rubric:")]
        assert len(rubrics) == 1, f"{source.name}: a written cell needs one `rubric:<id>` tag, has {rubrics}"
        assert f"`rubric:{rubrics[0]}`" in guide, f"docs/teaching.md has no rubric `rubric:{rubrics[0]}`"


# ------------------------------------------------------------------------ lint: mistakes a reader would trip on
# Each rule is a function returning what it finds, run on every notebook source (any future notebook included)
# and on a small notebook that makes the mistake, so that each rule is seen to fail.

REPO = NOTEBOOKS.parent
FILE_NAME = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.(?:md|py|ipynb|json|txt|csv|png|pt|gz|toml))\b")
MATH = re.compile(r"\$\$.+?\$\$|\$[^$\n]{8,}?\$", re.DOTALL)


def markdown_in_code(notebook):
    """Code cells holding a markdown-looking comment block: a heading (`# ## ...`) or a bare `#` line, what a
    missing `# %% [markdown]` marker leaves behind."""
    return [
        line
        for cell in code_cells(notebook)
        for line in cell.source.splitlines()
        if re.match(r"#\s?#{1,6}\s", line) or line.strip() == "#"
    ]


def missing_files(notebook):
    """File names a cell mentions that exist nowhere: not in the repository, and not in minidape's source (the
    files its commands write, the authors' files it cites)."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout.split()
    known = set(tracked) | {Path(path).name for path in tracked}
    package = "\n".join(path.read_text() for path in (REPO / "minidape").rglob("*.py"))
    return [
        name
        for cell in notebook.cells
        for name in FILE_NAME.findall(cell.source)
        if name not in known and Path(name).name not in known and name not in package
    ]


def answers_after_checks(notebook):
    """In the student edition, a derive exercise's answer stated after its check: maths or a "closed form" in the
    markdown right after the check cell (before a heading starts the next topic); and anywhere, a formula of a
    worked answer (an equation or inequality in $...$)."""
    kept = student_edition(notebook)
    derive = {e.name for e in exercises.EXERCISES.values() if e.kind == "derive"}
    found = []
    for index, cell in enumerate(kept):
        if cell.cell_type != "code" or not set(checked(cell.source)) & derive:
            continue
        for after in kept[index + 1 :]:
            if after.cell_type != "markdown" or re.match(r"#+ ", after.source):
                break
            found += [f"after {checked(cell.source)}: {text[:60]}" for text in re.findall(r"\$[^$]+\$", after.source)]
            found += [f"after {checked(cell.source)}: closed form"] if "closed form" in after.source.lower() else []
    worked = {
        span
        for cell in notebook.cells
        if is_solution(cell) and cell.cell_type == "markdown"
        for span in MATH.findall(cell.source)
        if re.search(r"=|\\[lg]e\b|\\approx", span)
    }  # a statement
    found += [
        f"a worked answer's formula: {span[:60]}"
        for cell in kept
        for span in MATH.findall(cell.source)
        if span in worked
    ]
    return found


LINT = {
    "markdown in a code cell": markdown_in_code,
    "a file that does not exist": missing_files,
    "an answer after its check": answers_after_checks,
}


@pytest.mark.parametrize("rule", LINT)
@pytest.mark.parametrize("source", SOURCES, ids=lambda path: path.stem)
def test_the_notebook_passes_the_lint(source, rule):
    assert LINT[rule](jupytext.read(source)) == [], f"{source.name}: {rule}"


LINTED_MISTAKES = '''# %% [markdown]
# ### Exercise (derive)

# %%
def square_quadratic_form(x, c):
    exercises.todo()

# %% tags=["solution"]
def square_quadratic_form(x, c):
    return 2 * (c @ x).item() ** 2

# %%
exercises.check("square_quadratic_form", square_quadratic_form)

# %% [markdown]
# The closed form is $$c^T K c = 2 (\\sum_i c_i x_i)^2$$, see DESIGN.md.

# %% [markdown] tags=["solution"]
# **Worked answer.** It is $2(\\sum_i c_i x_i)^2 \\ge 0$.

# %%
plt.show()
#
# ## 4. A heading that lost its marker
#
# and the text that follows it: $2(\\sum_i c_i x_i)^2 \\ge 0$
'''


def test_each_lint_rule_finds_its_mistake():
    notebook = jupytext.reads(LINTED_MISTAKES, fmt="py:percent")
    assert markdown_in_code(notebook) == ["#", "# ## 4. A heading that lost its marker", "#"]
    assert missing_files(notebook) == ["DESIGN.md"]
    found = answers_after_checks(notebook)
    assert len([f for f in found if f.startswith("after")]) == 2  # the display math, "closed form"
    assert found[-1] == "a worked answer's formula: $2(\\sum_i c_i x_i)^2 \\ge 0$"
