"""The command line answers `--help` and a mistaken flag without loading torch (#44): the property itself (torch is
not in sys.modules after the parser has answered), and every value the parser reads from the source instead of
importing it (`minidape.declared`) equal to the imported one. The time it takes is measured by
benchmarks/bench_cli.py, not here."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import typing

import pytest

import minidape as md
from minidape import declared
from minidape.lab import evaluate, tasks, train
from minidape.model import TEMPERATURES
from minidape.study import budgets, claims, comparison
from minidape.utils import DEVICE_CHOICES

# Each command line below is answered by the parser alone: help, or one line on stderr and exit code 2.
ANSWERED_BY_THE_PARSER = [
    ["--help"],
    *[[command, "--help"] for command in ("demo", "train", "eval", "che", "reproduce", "compare", "grade", "handout")],
    ["train", "--block-size", "1", "--out", "x"],
    ["train", "--pe", "bogus", "--out", "x"],
    ["train", "--refiner", "bogus", "--out", "x"],
    ["train", "--temperature", "hot", "--out", "x"],
    ["train", "--n-layer", "two", "--out", "x"],
    ["train", "--out", "x", "--no-such-flag"],
    ["che", "--task", "bogus"],
    ["eval", "x.pt", "--protocol", "bogus"],
    ["compare", "--pe", "rope", "--budget", "huge"],
    ["reproduce", "--seeds", "many"],
    ["bench", "--pe", "bogus"],
    ["nonsense"],
]

PROBE = """
import sys
from minidape.__main__ import main
answers = []
for argv in {argvs!r}:
    try:
        main(argv)
    except SystemExit as done:
        answers.append(done.code)
print(answers)
loaded = sorted(name for name in sys.modules if name.split(".")[0] == "torch" or name == "minidape.model")
assert not loaded, loaded[:5]
"""


def test_help_and_every_mistaken_flag_answer_without_loading_torch():
    probe = subprocess.run(
        [sys.executable, "-c", PROBE.format(argvs=ANSWERED_BY_THE_PARSER)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    codes = eval(probe.stdout.strip().splitlines()[-1])  # the list printed by the probe
    assert codes == [0] * 9 + [2] * (len(ANSWERED_BY_THE_PARSER) - 9), codes
    errors = [line for line in probe.stderr.splitlines() if ": error: " in line]
    assert len(errors) == len(ANSWERED_BY_THE_PARSER) - 9, probe.stderr[-3000:]
    assert "--block-size 1 is too short for a language model" in probe.stderr
    assert "unknown pe 'bogus'; valid choices: none, learned" in probe.stderr


def test_the_values_read_from_the_source_are_the_imported_ones():
    hints = typing.get_type_hints(md.GPTConfig)
    fields = [(field.name, hints[field.name], field.default) for field in dataclasses.fields(md.GPTConfig)]
    assert declared.config_fields() == fields
    registered_by_the_study = {claims.LEAKY_REFINER}  # only while the study runs
    assert declared.registered_names("pe") == [name for name in md.PE_NAMES if ":" not in name]
    assert declared.registered_names("refiner") == [
        name for name in md.REFINER_NAMES if ":" not in name and name not in registered_by_the_study
    ]
    assert declared.task_names() == tasks.TASK_NAMES
    assert declared.constant("model.py", "TEMPERATURES") == TEMPERATURES
    assert declared.constant("lab/evaluate.py", "PROTOCOLS") == evaluate.PROTOCOLS
    assert declared.constant("lab/train.py", "DEFAULT_SETTINGS") == train.DEFAULT_SETTINGS
    assert declared.constant("utils.py", "DEVICE_CHOICES") == DEVICE_CHOICES
    for name in ("BUDGET_NAMES", "DEFAULT_CORPORA", "DEFAULT_SEEDS"):
        assert declared.constant("study/budgets.py", name) == getattr(budgets, name), name
    for name in ("FLAT_MARGIN", "LEAKY_REFINER", "MODELS"):
        assert declared.constant("study/claims.py", name) == getattr(claims, name), name
    assert declared.constant("study/comparison.py", "DEFAULT_BASELINES") == comparison.DEFAULT_BASELINES
    read = declared.constant("study/budgets.py", "BUDGETS")
    assert list(read) == list(budgets.BUDGETS)
    for name, budget in budgets.BUDGETS.items():  # the fields written out as literals (the help shows them)
        assert read[name] == {key: getattr(budget, key) for key in read[name]}, name
        assert {"n_layer", "n_embd", "n_head", "steps", "batch_size", "lr", "train_lengths"} <= set(read[name])


def run_cli(*argv: str, argv0: str | None = None, code: str = "pass") -> subprocess.CompletedProcess:
    """The CLI in a fresh interpreter; `argv0` as sys.argv[0] (the installed script's path), `code` run first."""
    program = f"import sys; {code}; sys.argv[0] = {argv0!r} or sys.argv[0]; from minidape.__main__ import main; main()"
    return subprocess.run(
        [sys.executable, "-c", program, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def test_the_installed_script_names_itself_and_the_banner_lists_every_command():
    helped = run_cli("--help", argv0="/somewhere/bin/minidape")
    assert helped.stdout.startswith("usage: minidape "), helped.stdout[:200]
    assert "python -m minidape" not in helped.stdout
    from minidape.flags import COMMAND_PARSERS

    banner = helped.stdout.split("\n\n")[1]
    assert all(command in banner for command in COMMAND_PARSERS), banner
    assert "handout" in banner
    refused = run_cli("train", "--out", "x", "--pe", "bogus", argv0="/somewhere/bin/minidape")
    assert refused.returncode == 2 and refused.stderr.startswith("minidape train: error: "), refused.stderr


def test_ches_help_lists_no_flag_the_task_sets_and_che_still_names_them():
    helped = run_cli("che", "--help")
    for flag in ("--block-size", "--vocab-size", "--causal", "--no-causal"):
        assert flag not in helped.stdout, flag
    assert "--n-layer" in helped.stdout and "--task" in helped.stdout
    refused = run_cli("che", "--task", "even_pairs", "--block-size", "8")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "python -m minidape: error: the task sets block_size; drop --block-size"
    ], refused.stderr


@pytest.mark.parametrize("command", ["handout", "grade"])
def test_a_command_missing_its_extra_says_so_in_one_line(command, tmp_path):
    """Without jupytext (a plain `pip install minidape`), handout was the one raw traceback left."""
    argv = [command, str(tmp_path / "out")]
    refused = run_cli(*argv, code="sys.modules['jupytext'] = None")  # `import jupytext` raises ImportError
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert refused.stderr.strip().splitlines() == [refused.stderr.strip()], refused.stderr
    assert "needs jupytext, not installed here: pip install 'minidape[grade]'" in refused.stderr
