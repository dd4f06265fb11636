"""The grader: crafted notebooks that pass, raise, loop forever or delete their folder, and the CLI's errors.

Grading the real notebooks (student edition: 0 passed; worked solutions: every exercise passed) runs in
`make test-notebooks`, which executes both editions anyway and sets MINIDAPE_EXPECT_EXERCISES; here one
cheap real notebook (02, no training) is graded in both editions to show the whole path.
"""
import csv
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from minidape import exercises
from minidape.grade import exercise_names, grade, grade_notebook

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ANSWER = ("lambda name, n: {'reverse_string': n, 'duplicate_string': 2 * n, 'compute_sqrt': (n + 1) // 2, "
          "'binary_multiplication': n, 'parity_check': 1}[name]")


def notebook(path, *sources):
    nb = new_notebook(cells=[new_code_cell("from minidape import exercises"), *map(new_code_cell, sources)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


@pytest.fixture(autouse=True)
def kernel_sees_this_checkout(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv(exercises.EXPECT, raising=False)


def test_exercise_names_come_from_the_check_calls():
    nb = new_notebook(cells=[new_code_cell('exercises.check("running_mean", f)\nexercises.check( "alibi_bias", g)'),
                             new_code_cell('exercises.check("not_an_exercise", h)  # ignored'),
                             new_code_cell("exercises.check('running_mean', f)")])
    assert exercise_names(nb) == ["running_mean", "alibi_bias"]


def test_bad_submissions_cost_only_their_own_grade(tmp_path, capsys):
    folder = tmp_path / "submissions"
    folder.mkdir()
    good = notebook(folder / "a_good.ipynb", f'exercises.check("output_length", {ANSWER})',
                    'exercises.check("running_mean", None)')
    raises = notebook(folder / "b_raises.ipynb", 'raise RuntimeError("oops")',
                      f'exercises.check("output_length", {ANSWER})')
    loops = notebook(folder / "c_loops.ipynb", f'exercises.check("output_length", {ANSWER})',
                     "while True:\n    pass", f'exercises.check("masked_accuracy", None)')
    deletes = notebook(folder / "d_deletes.ipynb",
                       "import os, shutil\nfor name in os.listdir('.'):\n    os.remove(name)",
                       f'exercises.check("output_length", {ANSWER})')
    out = tmp_path / "grades.csv"
    grades = grade([folder], csv_path=out, timeout=30)

    by_name = {Path(g.notebook).name: g for g in grades}
    assert by_name["a_good.ipynb"].exercises == {"output_length": True, "running_mean": False}
    assert by_name["b_raises.ipynb"].exercises == {"output_length": True}
    assert "RuntimeError" in by_name["b_raises.ipynb"].problem
    assert by_name["c_loops.ipynb"].exercises == {"output_length": True, "masked_accuracy": False}
    assert "time limit" in by_name["c_loops.ipynb"].problem
    assert by_name["d_deletes.ipynb"].exercises == {"output_length": True}
    assert all(path.exists() for path in (good, raises, loops, deletes))      # graded in scratch copies
    with open(out) as file:
        rows = list(csv.DictReader(file))
    assert [(Path(r["notebook"]).name, r["exercise"], r["passed"]) for r in rows] == [
        ("a_good.ipynb", "output_length", "1"), ("a_good.ipynb", "running_mean", "0"),
        ("b_raises.ipynb", "output_length", "1"),
        ("c_loops.ipynb", "output_length", "1"), ("c_loops.ipynb", "masked_accuracy", "0"),
        ("d_deletes.ipynb", "output_length", "1")]
    table = capsys.readouterr().out
    assert "a_good.ipynb" in table and " 1 / 2" in table


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "minidape", "grade", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("args, message", [
    (["missing.ipynb"], "no such notebook or folder: missing.ipynb"),
    (["README.md"], "is not a notebook"),
    (["notebooks", "--timeout", "0"], "argument --timeout: must be a number > 0"),
    (["notebooks", "--csv", "no/such/folder/g.csv"], "does not exist"),
])
def test_cli_mistakes_are_one_line_and_exit_code_2(args, message):
    result = run_cli(*args)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def student_edition(source, folder):
    """What `make student` does for one notebook: jupytext, then nbconvert's tag and output preprocessors."""
    full = folder / f"{source.stem}.ipynb"
    subprocess.run([BIN / "jupytext", "--quiet", "--to", "ipynb", "-o", full, source], check=True)
    subprocess.run([BIN / "jupyter-nbconvert", "--to", "notebook", "--log-level", "WARN",
                    "--TagRemovePreprocessor.enabled=True", "--TagRemovePreprocessor.remove_cell_tags=solution",
                    "--ClearOutputPreprocessor.enabled=True",
                    "--output-dir", folder / "student", full], check=True)
    return full, folder / "student" / full.name


def test_a_real_notebook_full_edition_passes_every_exercise_and_the_student_edition_none(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIDAPE_FAST", "1")
    full, student = student_edition(ROOT / "notebooks" / "02_kerple_cpd_kernels.py", tmp_path)
    names = [exercise.name for exercise in exercises.exercises_of("02")]
    solution_cells = [cell for cell in nbformat.read(full, 4).cells if "solution" in cell.metadata.get("tags", [])]
    assert solution_cells and not any("solution" in cell.metadata.get("tags", [])
                                      for cell in nbformat.read(student, 4).cells)
    assert grade_notebook(full, timeout=300).exercises == {name: True for name in names}
    assert grade_notebook(student, timeout=300).exercises == {name: False for name in names}
