"""Every notebook as Colab runs it (`make test-colab`): the student edition a page of the book offers, in a folder
outside the checkout, on a kernel of a fresh virtual environment that holds what Colab has before a notebook runs
(torch and Jupyter's kernel) and no minidape. The notebook's first cell installs minidape from the built wheel
(the teacher's `make book MINIDAPE_SOURCE=...`) without touching that torch, and is switched to quick mode there,
as a student would switch it.

And the same for a hand-out (`make handout`): its wheel installed into a fresh venv far from the checkout, every
student notebook of it run top to bottom. Nothing is downloaded there: the fresh venv gets the wheel with
`pip install --no-deps`, and the packages already on disk (torch, Jupyter: this interpreter's site-packages) through
a .pth file, which does not run their .pth files, so this checkout's editable minidape stays out of it (the test
asserts where minidape is imported from).

`make test` leaves this file out: each test installs into a new venv and runs the eight notebooks (minutes).
"""

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from minidape.classroom import handout

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "book"))
import build as book  # noqa: E402  (docs/book/build.py)

TORCH = f"torch=={importlib.metadata.version('torch')}"  # this one: pip has it at hand, as Colab has its own


def run(command, **options):
    done = subprocess.run(command, capture_output=True, text=True, **options)
    assert done.returncode == 0, f"{command[:4]}: {(done.stdout + done.stderr)[-2000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def colab(tmp_path_factory):
    """A fresh venv with torch and ipykernel only, a Jupyter kernel on it, and the wheel built from this checkout."""
    where = tmp_path_factory.mktemp("colab")
    wheel = handout.build_wheel(where)
    fresh = where / "venv"
    run([sys.executable, "-m", "venv", str(fresh)], timeout=300)
    python = fresh / "bin" / "python"
    run([python, "-m", "pip", "install", "-q", TORCH, "ipykernel"], timeout=1200)
    kernels = where / "jupyter" / "kernels" / "colab"
    kernels.mkdir(parents=True)
    argv = [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (kernels / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "colab", "language": "python"}))
    return {"where": where, "wheel": wheel, "python": python}


def installed(python) -> dict[str, str]:
    listed = run([python, "-m", "pip", "list", "--format", "json"], timeout=300)
    return {package["name"].lower(): package["version"] for package in json.loads(listed)}


def torch_file_time(python) -> str:
    return run([python, "-c", "import os, torch; print(os.stat(torch.__file__).st_mtime_ns)"], timeout=300)


def test_every_student_notebook_installs_minidape_and_runs_in_quick_mode(colab, monkeypatch):
    python, where = colab["python"], colab["where"]
    before, torch_written = installed(python), torch_file_time(python)
    assert "minidape" not in before and before["torch"] == TORCH.split("==")[1]
    notebooks = book.edition_notebooks("student", book.teacher_notebooks(), install_from=str(colab["wheel"]))
    work = where / "class"  # a student's folder, far from the checkout
    work.mkdir()
    monkeypatch.setenv("JUPYTER_PATH", str(where / "jupyter"))
    for variable in ("MINIDAPE_QUICK", "MINIDAPE_FAST", "PYTHONPATH"):  # quick mode comes from the first cell alone
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("MINIDAPE_EXPECT_EXERCISES", "none")  # the student edition: every check "not done yet"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    for stem, notebook in notebooks.items():
        first = notebook.cells[0]
        assert "QUICK_MODE = False" in first.source
        first.source = first.source.replace("QUICK_MODE = False", "QUICK_MODE = True")  # as the student switches it
        notebook.cells.insert(
            1, nbformat.v4.new_code_cell("import minidape, os; print(minidape.__file__, os.environ['MINIDAPE_QUICK'])")
        )
        NotebookClient(
            notebook, timeout=900, kernel_name="colab", resources={"metadata": {"path": str(work)}}
        ).execute()
        nbformat.write(notebook, work / f"{stem}.ipynb")
        where_from, quick = "".join(notebook.cells[1].outputs[0]["text"]).split()
        assert where_from.startswith(str(where / "venv")) and quick == "1", (stem, where_from, quick)
        summary = "".join(o.get("text", "") for o in notebook.cells[-1].outputs)
        assert "0 of" in summary and "exercises passed" in summary, (stem, summary)
    after = installed(python)
    assert after["minidape"] == importlib.metadata.version("minidape")
    assert after["torch"] == before["torch"] and torch_file_time(python) == torch_written  # the torch it found, kept


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
