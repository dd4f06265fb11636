"""Every command line of README.md and docs/teaching.md is run, with a tiny budget where it trains, or is mapped to
the test that runs it (#44): a line added to either file and mapped nowhere fails `test_every_command_line_of_the_
docs_is_run_or_mapped` with its text. Command lines: each line of a ```bash block, and each `inline` span that
starts with a program (make, python, pip, ...). Also the claims of the README kept by a test: the skip reasons
that `make test` prints, and the demo's reproducibility at one thread count."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest
import torch

import minidape as md
from minidape.__main__ import main

REPO = Path(__file__).resolve().parent.parent
DOCS = ("README.md", "docs/teaching.md")
PROGRAMS = ("make", "python", "pip", "conda", "torchrun", "jupyter", "minidape", "MINIDAPE_QUICK=1")


def command_lines(text: str) -> list[str]:
    """The command lines of a markdown text, in order, each once (a trailing `# comment` cut off)."""
    found, fence = [], None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = None if fence is not None else stripped[3:]
        elif fence == "bash" and stripped and not stripped.startswith("#"):
            found.append(re.split(r"\s+#\s", stripped, maxsplit=1)[0].strip())
        elif fence is None:
            found += [span for span in re.findall(r"`([^`]+)`", line) if span.split(" ", 1)[0] in PROGRAMS]
    return [line for line in dict.fromkeys(found) if " " in line]


# Each command line -> how it is run here: RUN (below, with a tiny budget), HELP (a command named in prose: its
# --help), or the test that runs it ("tests/FILE.py::test_name", which must exist), or NOT_RUN with the reason.
RUN, HELP = "run here with a tiny budget", "its --help"
MAPPED = {
    "make demo": "tests/test_cli.py::test_demo_writes_its_table_and_plot",
    "make test": "the suite itself (the lead runs it from a fresh clone; CI's .ci/run)",
    "make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu": "NOT_RUN: installs torch from PyTorch's index",
    "make test TORCH=torch": "NOT_RUN: installs the index's torch build, then the suite",
    "conda env create -f environment.yml": "NOT_RUN: needs conda and the network",
    "python -m minidape reproduce": (
        "tests/test_study.py::test_reproduce_tiny_end_to_end_resumes_and_refuses_other_settings"
    ),
    "python -m minidape compare": HELP,
    "python -m minidape compare --pe tests/files/gauss_bias.py:GaussianDecay --against alibi kerple_log": RUN,
    "python -m minidape compare --pe fox --against ALiBi Kerple-log DAPE-FoX --seeds 3": RUN,
    'python -m minidape compare --pe PaTH --against iRoPE RNoPE-SWA FoX "FoX (ALiBi init)" ALiBi Stick-breaking '
    "--n-layer 4 --seeds 5 --lengths 128 256 512 1024": RUN,
    "python -m minidape compare --pe none@temp=log_length --against none --n-layer 4 --seeds 5": RUN,
    "python -m minidape train --pe alibi --refiner dape --corpus austen --steps 2000 --out runs/alibi-dape": RUN,
    "python -m minidape eval runs/alibi-dape/checkpoint.pt --lengths 128 256 512 1024 2048": RUN,
    "python -m minidape train --import tests/files/cauchy_bias.py --pe cauchy --out runs/cauchy": RUN,
    "python -m minidape che --task reverse_string --pe kerple_log --refiner dape --steps 2000": RUN,
    "python -m minidape bench": "tests/test_bench.py::test_timing_round_in_a_fresh_process_reports_every_case",
    "python -m minidape bench --threads": "tests/test_threads.py",
    "torchrun --nproc_per_node=2 -m minidape train --pe rope --out runs/rope-ddp": (
        "tests/test_train.py::test_ddp_two_cpu_processes_under_torchrun"
    ),
    "make lab": "NOT_RUN: starts JupyterLab, an interactive server",
    "make student": "tests/test_notebooks.py::test_the_student_edition_reveals_no_solution",
    "make handout": "tests/test_handout.py::test_the_handout_holds_no_solution_line_and_no_teacher_file",
    "python -m minidape handout OUT/ --notebooks 03 04": (
        "tests/test_colab.py::test_the_handout_installs_in_a_fresh_venv_and_every_student_notebook_runs"
    ),
    "pip install -e '.[grade]'": "NOT_RUN: an install (the grade extra: tests/test_package.py)",
    "make notebooks": "NOT_RUN: re-executes every notebook in full mode (hours; the lead runs it)",
    "make lint": "part of make test (ruff check and ruff format --check)",
    "make test-gpu": "tests/test_gpu.py",
    "make test-gpu TORCH=torch": "tests/test_gpu.py",
    "python -m minidape bench --device cuda": "tests/test_gpu.py",
    "python -m minidape handout": HELP,
    "make test-notebooks": "part of make test (nbval, both editions)",
    'make handout HANDOUT="03 04"': (
        "tests/test_handout.py::test_the_handout_holds_no_solution_line_and_no_teacher_file"
    ),
    "MINIDAPE_QUICK=1 python -m minidape grade student_work/ --csv grades.csv --feedback feedback/ --jobs N": (
        "tests/test_grade_own_bias.py::test_an_honest_submission_earns_6_5_on_the_graders_own_measurement"
    ),
    "MINIDAPE_QUICK=1 python -m minidape grade student_work/ --csv grades.csv --feedback feedback/": (
        "tests/test_grade_own_bias.py::test_an_honest_submission_earns_6_5_on_the_graders_own_measurement"
    ),
    "python -m minidape grade --merge grades.csv grades-06.csv --csv course.csv": (
        "tests/test_gradebook.py::test_a_class_of_30_graded_quick_and_06_in_full_makes_one_gradebook"
    ),
    "python -m minidape grade --gradebook grades.csv": (
        "tests/test_gradebook.py::test_totals_summary_and_written_marks_folded_in_without_grading"
    ),
    "make book": "tests/test_book.py::test_every_page_loads_everything_from_the_site_itself_without_an_error",
    "make book BOOK_REPOSITORY=https://github.com/you/course BOOK_BRANCH=gh-pages "
    "MINIDAPE_SOURCE=https://you.github.io/course/minidape-0.1.0-py3-none-any.whl": (
        "tests/test_book.py::test_each_page_offers_its_editions_notebook_and_opens_it_in_colab"
    ),
    "make test-book": "tests/test_book.py",
    "make test-colab": "tests/test_colab.py::test_every_student_notebook_installs_minidape_and_runs_in_quick_mode",
    "make test-hostile": "tests/test_grade_hostile.py",
    "make pair": (
        "tests/test_book_editions.py::test_make_pair_gives_an_unpaired_executed_notebook_its_colab_cell_and_keeps_its_outputs"
    ),
    "python -m minidape compare --pe kerple_log+dape --against kerple_log --out study --list-runs > runs.txt": (
        "tests/test_study.py::test_the_readme_slurm_array_through_two_workers_gives_the_single_process_report"
    ),
    "sbatch --array=1-$(wc -l < runs.txt) --wrap 'sed -n \"${SLURM_ARRAY_TASK_ID}p\" runs.txt | sh'": (
        "tests/test_study.py::test_the_readme_slurm_array_through_two_workers_gives_the_single_process_report"
    ),
    "python -m minidape compare --pe kerple_log+dape --against kerple_log --out study --report": (
        "tests/test_study.py::test_the_readme_slurm_array_through_two_workers_gives_the_single_process_report"
    ),
}


def test_every_command_line_of_the_docs_is_run_or_mapped():
    lines = {line: doc for doc in DOCS for line in command_lines((REPO / doc).read_text())}
    unmapped = [f"{doc}: {line}" for line, doc in lines.items() if line not in MAPPED]
    assert not unmapped, "command lines of the docs that no test runs (map them in MAPPED):\n" + "\n".join(unmapped)
    gone = [line for line in MAPPED if line not in lines]
    assert not gone, f"mapped lines no longer in the docs (drop them from MAPPED): {gone}"
    for line, how in MAPPED.items():  # a test named must exist
        if how.startswith("tests/"):
            path, _, name = how.partition("::")
            assert (REPO / path).is_file(), (line, how)
            assert not name or f"def {name}(" in (REPO / path).read_text(), (line, how)


# The flags that make a run tiny, per command; values given in the docs for these flags are replaced.
TINY = {
    "train": {
        "--steps": "2",
        "--n-layer": "1",
        "--n-embd": "16",
        "--n-head": "2",
        "--block-size": "16",
        "--batch-size": "2",
        "--eval-every": "1",
    },
    "eval": {"--n-windows": "2", "--last-k": "16"},
    "che": {
        "--steps": "2",
        "--n-layer": "1",
        "--n-embd": "16",
        "--n-head": "2",
        "--batch-size": "2",
        "--max-train-length": "5",
        "--max-test-length": "10",
        "--length-step": "5",
        "--eval-samples": "2",
    },
    "compare": {"--budget": "tiny", "--steps": "2", "--seeds": "2", "--lengths": "16 32"},
}


def tiny(line: str) -> list[str]:
    """The command line's arguments (after `python -m minidape`), its budget flags set to TINY's values (a flag's
    values are the words up to the next flag: --lengths takes several)."""
    argv = shlex.split(line)[3:]
    settings = TINY[argv[0]]
    kept, skipping = [], False
    for word in argv:
        if word.startswith("--"):
            skipping = word in settings
        if not skipping:
            kept.append(word)
    return kept + [item for flag, value in settings.items() for item in (flag, *value.split())]


def test_the_docs_command_lines_that_train_run_as_written_with_a_tiny_budget(tmp_path, monkeypatch, capsys):
    """In the docs' order (eval reads the checkpoint the train line above it wrote), in a folder holding the
    repository's example files."""
    shutil.copytree(REPO / "tests" / "files", tmp_path / "tests" / "files")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MINIDAPE_THREADS", "1")
    lines = [line for doc in DOCS for line in command_lines((REPO / doc).read_text()) if MAPPED.get(line) == RUN]
    assert len(lines) == 8
    for line in lines:
        main(tiny(line))
    assert (tmp_path / "runs" / "alibi-dape" / "results.md").is_file()
    assert (tmp_path / "runs" / "cauchy" / "checkpoint.pt").is_file()
    assert len(list((tmp_path / "runs" / "compare").glob("*/compare.md"))) == 4
    for line in [line for line in MAPPED if MAPPED[line] == HELP]:
        with pytest.raises(SystemExit) as helped:
            main([*shlex.split(line)[3:], "--help"])
        assert helped.value.code == 0


def test_make_test_prints_the_reason_of_each_skip():
    """README: `make test` skips tests/test_gpu.py where there is no GPU and prints the reason."""
    recipe = (REPO / "Makefile").read_text().split("\ntest-unit:", 1)[1].split("\n\n", 1)[0]
    assert re.search(r"pytest .*-rs\b", recipe), recipe


def test_a_run_is_bit_identical_when_repeated_at_one_thread_count():
    """README: the demo run again on one machine with the same number of threads gives the same table. The same
    code path at a tiny size: training and evaluation twice."""

    def run() -> dict:
        cfg = md.GPTConfig(n_layer=1, n_embd=16, n_head=2, block_size=16, pe="kerple_log", refiner="dape")
        model, _ = md.train(cfg, md.load_corpus("austen"), steps=3, batch_size=2, seed=0, progress=False)
        return md.evaluate.perplexity_by_length(model, md.load_corpus("austen", "val"), [16, 32], last_k=8, n_windows=2)

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert run() == run()
    finally:
        torch.set_num_threads(threads)
