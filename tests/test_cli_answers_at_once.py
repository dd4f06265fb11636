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

COMMANDS = ("demo", "train", "eval", "che", "bench", "reproduce", "compare", "grade", "handout")
# Each command line below is answered by the parser alone: help, or one line on stderr and exit code 2.
ANSWERED_BY_THE_PARSER = [
    ["--help"],
    *[[command, "--help"] for command in COMMANDS],
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
    ["bench", "--repeats", "0"],
    ["nonsense"],
]
HELPS = sum("--help" in argv for argv in ANSWERED_BY_THE_PARSER)

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


def probe(argvs: list[list[str]]) -> tuple[list, list[str]]:
    """Each command line run by the CLI in one fresh interpreter, which fails if torch was loaded: the exit codes,
    and the error lines on stderr."""
    probed = subprocess.run(
        [sys.executable, "-c", PROBE.format(argvs=argvs)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert probed.returncode == 0, probed.stderr[-3000:]
    errors = [line for line in probed.stderr.splitlines() if ": error: " in line]
    return eval(probed.stdout.strip().splitlines()[-1]), errors  # the list printed by the probe


def test_help_and_every_mistaken_flag_answer_without_loading_torch():
    codes, errors = probe(ANSWERED_BY_THE_PARSER)
    assert codes == [0] * HELPS + [2] * (len(ANSWERED_BY_THE_PARSER) - HELPS), codes
    assert len(errors) == len(ANSWERED_BY_THE_PARSER) - HELPS, errors
    probe_stderr = "\n".join(errors)
    assert "--block-size 1 is too short for a language model" in probe_stderr
    assert "unknown pe 'bogus'; valid choices: none, learned" in probe_stderr
    assert "argument --repeats: must be a positive integer, got '0'" in probe_stderr


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


# Configs GPTConfig refuses, given as flags: the command line, and the GPTConfig fields it gives.
REFUSED_CONFIGS = [
    (["train", "--out", "x", "--n-layer", "2", "--pe", "rope,none,alibi"], dict(n_layer=2, pe="rope,none,alibi")),
    (["train", "--out", "x", "--pe", "rope@window=64"], dict(pe="rope@window=64")),
    (["train", "--out", "x", "--pe", "rope,learned"], dict(pe="rope,learned")),
    (["train", "--out", "x", "--n-embd", "100", "--n-head", "3"], dict(n_embd=100, n_head=3)),
    (["train", "--out", "x", "--rope-base", "1e39"], dict(rope_base=1e39)),
    (["train", "--out", "x", "--fox-gate-init", "2"], dict(fox_gate_init="2")),
    (
        ["che", "--task", "even_pairs", "--pe", "stick_breaking", "--refiner", "dape"],
        dict(pe="stick_breaking", refiner="dape"),
    ),
    (["che", "--task", "even_pairs", "--attention-extras", "bogus"], dict(attention_extras="bogus")),
]


def test_a_config_gptconfig_refuses_is_refused_with_its_message_before_torch_loads():
    """#44: a per-layer spec longer than the model, an unknown '@' option and the fields that do not go together were
    refused only once torch had loaded (20-90 s on a cold start)."""
    codes, errors = probe([argv for argv, _ in REFUSED_CONFIGS])
    assert codes == [2] * len(REFUSED_CONFIGS), codes
    from minidape.flags import flags_named  # GPTConfig's words, with the flags' names as the command line gives them

    for (argv, fields), error in zip(REFUSED_CONFIGS, errors, strict=True):
        with pytest.raises(ValueError) as refused, flags_named():
            md.GPTConfig(**fields)
        assert error == f"python -m minidape: error: {' '.join(str(refused.value).split())} (see --help)", argv
    assert errors[0].startswith("python -m minidape: error: --pe='rope,none,alibi' names 3 encodings for --n-layer=2")
    assert "unknown layer option 'window=64'" in errors[1] and "sliding=W, chunk=W" in errors[1]


def outcome(config, fields: dict):
    try:
        config(**fields)
    except (TypeError, ValueError) as err:
        return type(err).__name__, str(err)
    return None


def test_gptconfigs_checks_run_without_torch_refuse_and_accept_what_gptconfig_does():
    """declared runs model.py's own configuration code without torch; each registered encoding in single, per-layer
    and windowed specs, with refiners, widths, temperatures and random positions: the same verdict, the same words."""
    shadow = declared._config_code()["GPTConfig"]
    assert shadow is not md.GPTConfig
    variations = [
        {},
        dict(refiner="dape"),
        dict(refiner="conv", refiner_kernel=4),
        dict(n_embd=12, n_head=4),
        dict(n_embd=99, n_head=3),
        dict(random_positions=256),
        dict(causal=False),
        dict(temperature="log_length", block_size=1),
        dict(fox_gate_init="alibi", attention_extras="pro"),
        dict(rope_scale=0.5, cope_positions=1),
    ]
    checked = refused = 0
    for name in declared.registered_names("pe"):
        for pe in (name, f"{name},none", f"{name},none,alibi", f"{name}@sliding=8", f"{name}@temp=llama4@qk_norm"):
            for fields in variations:
                fields = dict(n_layer=2, pe=pe, **fields)
                expected = outcome(md.GPTConfig, fields)
                assert outcome(shadow, fields) == expected, fields
                checked += 1
                refused += expected is not None
    assert 0.2 < refused / checked < 0.9, (refused, checked)  # both verdicts are exercised
