"""Grading time of one class: 30 submissions of notebook 02 (15 worked solutions handed in as a student's, 15
handed-out stubs), quick mode, `--jobs 2`, graded by each checkout named, in turns, in one run.

    python benchmarks/bench_grading.py /path/to/checkout-before /path/to/checkout-after [--rounds 1]
    python benchmarks/bench_grading.py /path/to/checkout --hog

With ``--hog``: one worked submission graded alone, then beside a classmate whose notebook ends with six busy
processes (`--jobs 2`): its points and seconds (the grader's own per-submission time) both times.

Each checkout is imported first on PYTHONPATH (this venv's Python); the times are wall clock of the whole
`python -m minidape grade` command (start-up, every worker, the CSV)."""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def make_class(checkout: Path, folder: Path) -> None:
    """15 worked and 15 student-edition notebooks of 02, one folder per student."""
    source = checkout / "notebooks" / "02_kerple_cpd_kernels.py"
    full = folder / "full.ipynb"
    subprocess.run([BIN / "jupytext", "--quiet", "--to", "ipynb", "-o", full, source], check=True)
    notebook = json.loads(full.read_text())
    worked = {
        **notebook,
        "cells": [
            {**c, "metadata": {**c["metadata"], "tags": [t for t in c["metadata"].get("tags", []) if t != "solution"]}}
            for c in notebook["cells"]
        ],
    }
    stubs = {**notebook, "cells": [c for c in notebook["cells"] if "solution" not in c["metadata"].get("tags", [])]}
    for number in range(30):
        student = folder / "class" / f"student{number:02d}"
        student.mkdir(parents=True)
        (student / "02_kerple_cpd_kernels.ipynb").write_text(json.dumps(worked if number % 2 == 0 else stubs))


HOG = "import os\nfor _ in range(6):\n    if os.fork() == 0:\n        while True:\n            pass\n"


def grade(checkout: Path, folder: Path) -> tuple[float, str]:
    env = {**os.environ, "PYTHONPATH": str(checkout), "MINIDAPE_QUICK": "1", "OMP_NUM_THREADS": "1"}
    start = time.monotonic()
    printed = subprocess.run(
        [sys.executable, "-m", "minidape", "grade", str(folder), "--jobs", "2", "--timeout", "300"],
        env=env,
        check=True,
        cwd=checkout,
        capture_output=True,
        text=True,
    ).stdout
    return time.monotonic() - start, printed


def beside_a_hog(checkout: Path, tmp: Path) -> None:
    make_class(checkout, tmp)
    honest = tmp / "class" / "student00" / "02_kerple_cpd_kernels.ipynb"
    hog = json.loads(honest.read_text())
    hog["cells"].append({"cell_type": "code", "metadata": {}, "source": HOG, "outputs": [], "execution_count": None})
    for name, notebooks in (
        ("alone", {"honest": honest.read_text()}),
        ("beside a hog", {"honest": honest.read_text(), "hog": json.dumps(hog)}),
    ):
        folder = tmp / name.replace(" ", "_")
        for student, text in notebooks.items():
            (folder / student).mkdir(parents=True)
            (folder / student / honest.name).write_text(text)
        _, printed = grade(checkout, folder)
        line = next(line for line in printed.splitlines() if line.startswith("graded honest"))
        print(f"{name}: {line} (load {os.getloadavg()[0]:.1f})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkouts", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--hog", action="store_true")
    args = parser.parse_args()
    with open("/proc/cpuinfo") as info:
        cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    print(f"CPU: {cpu}; load before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        if args.hog:
            beside_a_hog(args.checkouts[-1].resolve(), Path(tmp))
            return
        make_class(args.checkouts[-1], Path(tmp))
        for _ in range(args.rounds):
            for checkout in args.checkouts:
                seconds, _ = grade(checkout.resolve(), Path(tmp) / "class")
                print(f"{checkout}: {seconds:.0f} s (load {os.getloadavg()[0]:.1f})", flush=True)


if __name__ == "__main__":
    main()
