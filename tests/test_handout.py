"""The hand-out (`python -m minidape handout OUT/`, `make handout`): no line of a worked solution anywhere in it,
the wheel included; installed into a fresh venv far from the checkout, every student notebook runs top to bottom.

Nothing is downloaded: the fresh venv gets the wheel with `pip install --no-deps`, and the packages already on
disk (torch, Jupyter: this interpreter's site-packages) through a .pth file, which does not run their .pth files,
so this checkout's editable minidape stays out of it (the test asserts where minidape is imported from).
"""

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import nbformat
import pytest

from minidape.classroom import handout

RUNNER = """
import sys
import nbformat
from nbclient import NotebookClient
for path in sys.argv[1:]:
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": "."}}).execute()
    nbformat.write(notebook, path)
    print("ran", path, flush=True)
"""


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


def test_the_handout_installs_in_a_fresh_venv_and_every_student_notebook_runs(made, tmp_path):
    fresh = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(fresh)], check=True, timeout=120)
    python = fresh / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (wheel,) = made.glob("minidape-*.whl")
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", site, str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr[-2000:]
    Path(site, "on_disk.pth").write_text(sysconfig.get_path("purelib") + "\n")  # torch, jupyter, ... (not minidape)
    work = tmp_path / "class"
    shutil.copytree(made / "notebooks", work / "notebooks")  # a student's copy, far from the checkout
    env = {
        "PATH": f"{fresh / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(tmp_path),
        "JUPYTER_PATH": str(tmp_path / "jupyter"),
        "JUPYTER_DATA_DIR": str(tmp_path / "jupyter"),
        "MINIDAPE_QUICK": "1",
        "MINIDAPE_EXPECT_EXERCISES": "none",
        "OMP_NUM_THREADS": "1",
        "LANG": "C.UTF-8",
    }
    where = subprocess.run(
        [python, "-c", "import minidape; print(minidape.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert where.stdout.strip().startswith(site), where.stdout + where.stderr
    notebooks = [str(path) for path in sorted(work.glob("notebooks/*.ipynb"))]
    ran = subprocess.run(
        [python, "-c", RUNNER, *notebooks],
        cwd=work / "notebooks",
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert ran.returncode == 0, (ran.stdout + ran.stderr)[-3000:]
    assert ran.stdout.count("ran ") == len(notebooks)
    for path in notebooks:  # each ran top to bottom: its last cell, the summary, printed the verdicts
        last = nbformat.read(path, as_version=4).cells[-1]
        assert "exercises passed" in "".join(o.get("text", "") for o in last.outputs), path
