"""Every notebook as Colab runs it (`make test-colab`): the student edition a page of the book offers, in a folder
outside the checkout, on a kernel of a fresh virtual environment that holds what Colab has before a notebook runs
(torch and Jupyter's kernel) and no minidape. The notebook's first cell installs minidape from the built wheel
(the teacher's `make book MINIDAPE_SOURCE=...`) without touching that torch, and is switched to quick mode there,
as a student would switch it.

`make test` leaves this file out: it installs torch into a new venv and runs the eight notebooks (minutes).
"""

import importlib.metadata
import json
import subprocess
import sys
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
