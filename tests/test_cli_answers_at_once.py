"""The command line answers `--help` and a mistaken flag without loading torch (#44): the property itself (torch is
not in sys.modules after the parser has answered), and every value the parser reads from the source instead of
importing it (`minidape.declared`) equal to the imported one. The time it takes is measured by
benchmarks/bench_cli.py, not here."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest

import minidape as md
from minidape import declared
from minidape.lab import evaluate, tasks, train
from minidape.model import TEMPERATURES
from minidape.study import budgets, claims, comparison
from minidape.utils import DEVICE_CHOICES

ROOT = Path(__file__).resolve().parents[1]
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


def probe(argvs: list[list[str]], **variables: str) -> tuple[list, list[str]]:
    """Each command line run by the CLI in one fresh interpreter (with these environment `variables`), which fails
    if torch was loaded: the exit codes, and the error lines on stderr."""
    probed = subprocess.run(
        [sys.executable, "-c", PROBE.format(argvs=argvs)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1", **variables},
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
    (tmp_path / "submitted.ipynb").write_text("{}")  # grade checks the paths it is given first
    argv = [command, str(tmp_path / ("out" if command == "handout" else "submitted.ipynb"))]
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
    # GPTConfig's words, with the flags' names as the command line gives them
    from minidape.early_checks import flags_named

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
    shadow = declared.code_without_torch("model.py")["GPTConfig"]
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


# compare's models, bench's --bias-table off CUDA, grade's files, a study's seeds, a device's name, a corpus or a
# checkpoint that is not there, refused before torch loads (#44: each loaded torch first, ~3 s warm and far more
# cold): the command line, and what its one line must say (the bad value, the valid choices); {missing} is a path
# under the test's folder that is not there.
REFUSED_BY_THE_COMMANDS_RULES = [
    (["compare", "--pe", "rope,none,alibi", "--n-layer", "2"], ["--pe 'rope,none,alibi'", "3 encodings for n_layer=2"]),
    (["compare", "--pe", "ropex"], ["--pe: unknown pe 'ropex'; valid choices: none, learned"]),
    (["compare", "--pe", "kerple_log+bogus"], ["unknown refiner 'bogus'", "valid choices: none, dape"]),
    (
        ["compare", "--pe", "rope", "--against", "alibi", "kerple_log+dape:q=3"],
        ["--against: bad refiner option 'q=3'", "valid: K or k=K"],
    ),
    (["compare", "--pe", "rope", "--against", "alibi+conv:4"], ["--against 'alibi+conv:4'", "odd integer", "got 4"]),
    (["compare", "--pe", "rope@window=3"], ["unknown layer option 'window=3'", "sliding=W, chunk=W"]),
    (["compare", "--pe", "rope,none,alibi,fire,t5"], ["5 encodings for n_layer=2", "CUDA's refuses it too"]),
    (["compare", "--pe", "rope", "--lengths", "100", "200"], ["training length 128", "got [100, 200]"]),
    (["bench", "--bias-table", "--device", "cpu"], ["--bias-table", "CUDA only; got --device cpu", "--device cuda"]),
    (["grade", "{missing}/notebook.ipynb"], ["no such notebook or folder: {missing}/notebook.ipynb"]),
    (["grade", "/etc/hostname"], ["/etc/hostname is not a notebook (.ipynb) or a folder of notebooks"]),
    (["grade", "--gradebook", "{missing}/grades.csv"], ["--gradebook {missing}/grades.csv: no such grades file"]),
    (["grade", "--merge", "{missing}/a.csv", "--csv", "{missing}/x.csv"], ["--merge {missing}/a.csv: no such"]),
    (["compare", "--pe", "rope", "--seeds", "1"], ["seeds must be an integer >= 2", "got 1"]),
    (["compare", "--pe", "rope", "--margin", "150"], ["margin must be a fraction between 0 and 1", "got 1.5"]),
    (["compare", "--pe", "rope", "--against", "rope"], ["at least one baseline other than rope; got ['rope']"]),
    (["compare", "--pe", "rope", "--against", "alibi", "rope", "--run", "10"], ["--run 10", "valid runs are 0 to 9"]),
    (["reproduce", "--seeds", "1"], ["seeds must be an integer >= 2", "got 1"]),
    (["train", "--out", "{missing}/out", "--device", "gpu"], ["unknown device 'gpu'; valid choices: auto, cpu"]),
    (["reproduce", "--corpus", "austen", "{missing}.txt"], ["corpus file '{missing}.txt' does not exist", "austen"]),
    (["demo", "--corpus", "shakespeare"], ["unknown corpus 'shakespeare': valid corpora are austen, latex, python"]),
    (["eval", "{missing}/run"], ["no checkpoint at {missing}/run"]),
    (["train", "--out", "{missing}/run", "--resume"], ["no checkpoint at {missing}/run/checkpoint.pt"]),
    (["train", "--out", "{missing}/out", "--warmup", "-1"], ["--warmup must be an integer >= 0, got -1"]),
    (["train", "--out", "{missing}/out", "--grad-clip", "-1"], ["--grad-clip must be a number >= 0.0, got -1.0"]),
    (["grade", str(ROOT / "notebooks"), "--csv", "{missing}/g.csv"], ["--csv {missing}/g.csv: the folder {missing}"]),
    (["grade", str(ROOT / "notebooks"), "--feedback", str(ROOT / "README.md")], ["README.md is a file"]),
    (["reproduce", "--corpus", "austen", "austen"], ["each once; got ['austen', 'austen']"]),
]


def test_compares_bench_and_grades_mistakes_are_refused_before_torch_loads(tmp_path):
    missing = tmp_path / "missing"  # never made: where older code went on, it wrote here, not outside the test
    cases = [
        ([arg.format(missing=missing) for arg in argv], [word.format(missing=missing) for word in words])
        for argv, words in REFUSED_BY_THE_COMMANDS_RULES
    ]
    codes, errors = probe([argv for argv, _ in cases])
    assert codes == [2] * len(cases), codes
    assert len(errors) == len(cases), errors
    for (argv, words), error in zip(cases, errors, strict=True):
        assert all(word in error for word in words), (argv, error)


@pytest.mark.parametrize(
    "variable, value, words",
    [
        ("MINIDAPE_QUICK", "yes", "MINIDAPE_QUICK='yes' is not a quick-mode setting; valid values: 1"),
        ("MINIDAPE_THREADS", "4,2", "MINIDAPE_THREADS must be a positive integer (CPU threads); got '4,2'"),
        ("MINIDAPE_NATIVE", "yes", "MINIDAPE_NATIVE='yes' is not a setting of the compiled cell MLP; valid values: 1"),
    ],
)
def test_a_bad_value_of_minidapes_variables_is_refused_before_torch_loads(variable, value, words):
    codes, errors = probe([["compare", "--pe", "rope", "--against", "rope"]], **{variable: value})
    assert codes == [2] and len(errors) == 1 and words in errors[0], errors


def refused_before_loading(argv: list[str], monkeypatch) -> bool:
    """Whether the parser's rules refuse `argv` as in a fresh interpreter (this one has loaded the model, which
    leaves every check of compare's models to compare itself)."""
    from minidape.early_checks import refuse_before_loading
    from minidape.flags import build_parser

    monkeypatch.delitem(sys.modules, "minidape.model")
    parser = build_parser()
    try:
        refuse_before_loading(parser.parse_args(argv), parser)
    except SystemExit as refused:
        assert refused.code == 2
        return True
    return False


@pytest.mark.parametrize(
    "argv, refused",
    [
        (["compare", "--pe", "rope,none,alibi", "--device", "cpu"], True),  # the CPU's budget: 2 layers
        (["compare", "--pe", "rope,none,alibi", "--device", "cuda"], False),  # CUDA's: 4 layers, the spec cycled
        (["compare", "--pe", "rope,none,alibi"], False),  # auto: compare decides once the device is known
        (["compare", "--pe", "rope,none,alibi", "--device", "cuda", "--n-layer", "2"], True),
        (["compare", "--pe", "my_bias.py:MyBias", "--against", "bogus"], False),  # the file may register bogus
        (["compare", "--pe", "rope", "--against", "bogus", "kerple_log+my_refiner.py:Mine"], False),
        (["bench", "--bias-table", "--device", "cuda:1"], False),
        (["bench", "--bias-table"], False),  # auto: the benchmark refuses it where no CUDA is found
        (["bench", "--device", "cpu"], False),
    ],
)
def test_what_depends_on_the_device_or_a_users_file_is_left_to_the_command(argv, refused, monkeypatch, capsys):
    assert refused_before_loading(argv, monkeypatch) == refused, capsys.readouterr().err


COMPARE_CODE_WITHOUT_TORCH = """
import json, sys, types
from minidape import declared
shadow = declared.code_without_torch("study/comparison.py")
assert not [name for name in sys.modules if name.split(".")[0] == "torch"]
import torch
from minidape.study import budgets, comparison

def outcome(function, *args, **kwargs):
    try:
        return repr(function(*args, **kwargs))
    except (TypeError, ValueError, OSError) as err:
        return f"{type(err).__name__}: {err}"

def outcomes(code, device, spec, knobs):
    found = [outcome(code["parse_model"], spec), outcome(code["study_budget"], "default", device, **knobs)]
    if not any(text.startswith(("TypeError", "ValueError")) for text in found):
        settings = code["study_budget"]("default", device, **knobs)
        found.append(outcome(code["lm_config"], settings, settings.train_lengths[0], code["parse_model"](spec)[1]))
    return found

real = {name: getattr(comparison, name) for name in ("parse_model", "study_budget")} | {"lm_config": budgets.lm_config}
from minidape.lab import checkpoints, data, train
from minidape.study import runs
from minidape import utils
for module, function, given in CHECKS:
    imported = sys.modules[f"minidape.{module.removesuffix('.py').replace('/', '.')}"]
    for value in given:  # an argument, or a dict of keyword arguments
        arguments = ((), value) if isinstance(value, dict) else ((value,), {})
        expected = outcome(getattr(imported, function), *arguments[0], **arguments[1])
        shadowed = outcome(declared.code_without_torch(module)[function], *arguments[0], **arguments[1])
        assert shadowed == expected, (function, value)
for spec in SPECS:
    expected = outcome(comparison.compared_models, spec, ["rope"])
    assert outcome(shadow["compared_models"], spec, ["rope"]) == expected, spec
specs = [*SPECS, *(spec.format(pe=pe) for pe in PES for spec in FORMS)]
results = [0, 0]
for spec in specs:
    for knobs in KNOBS:
        for device in ("cpu", "cuda"):
            expected = outcomes(real, torch.device(device), spec, knobs)
            assert outcomes(shadow, types.SimpleNamespace(type=device), spec, knobs) == expected, (spec, knobs, device)
            results[any(found.startswith(("TypeError", "ValueError")) for found in expected)] += 1
print(json.dumps(results))
"""


def test_the_checks_run_without_torch_refuse_and_accept_what_the_imported_ones_do():
    """The checks the parser runs before torch loads are the package's own functions, run by
    `declared.code_without_torch`: compare's (for every registered encoding in every form of the model syntax, study
    labels and mistakes, with knobs of the budget, on both devices' budgets), a device's name, a corpus's and a
    checkpoint's file, seeds and margin: the same result or the same words as the imported ones. In a fresh
    interpreter (4 s: torch loads), whose registries hold no name another test registered."""
    forms = ["{pe}", "{pe}+dape", "{pe}+conv:5", "{pe}+conv:k=4", "{pe}+dape:w=matched", "{pe}+conv:w=matched"]
    forms += ["{pe}+dape:w=0", "{pe}+dape:q=1", "{pe}+bogus", "{pe},none,alibi", "{pe}@sliding=8", "{pe}@window=8"]
    specs = [*claims.MODELS, "", "bogus", "rope+", "rope+conv:3:w=16", "rope,bogus"]
    knobs = [{}, {"n_layer": 3}, {"n_embd": 100, "n_head": 3}, {"lengths": [100, 200]}, {"lengths": [64, 128, 512]}]
    settings = dict(lr=1e-3, min_lr=None, weight_decay=0.1, grad_clip=1.0, optimizer=None, metrics=None, steps=10)
    train_mistakes = [("steps", 10), ("steps", 0), ("lr", 0), ("lr", True), ("min_lr", -1.0), ("grad_clip", "1")]
    train_mistakes += [("optimizer", "sgd"), ("optimizer", "adamw"), ("metrics", 3), ("seed", -1), ("warmup", 1.5)]
    checks = [
        ("utils.py", "device_kind", ["cpu", "cuda:1", "auto", "mps", "gpu", "cuda0"]),
        ("lab/data.py", "corpus_file", ["austen", "/no/such.txt", "/no/such", "shakespeare", "/etc", "/dev/null"]),
        ("lab/data.py", "corpus_file", ["tests/files/gauss_bias.py", "~no_such_user_here/a.txt", 3]),
        ("lab/checkpoints.py", "checkpoint_file", ["/no/such.pt", "/etc", "tests", "tests/test_package.py"]),
        ("study/runs.py", "check_seeds", [1, 2, True, "3", 5]),
        ("study/comparison.py", "check_margin", [0.1, 0, 1.5, 0.999]),
        ("lab/train.py", "check_arguments", [dict(settings, **{name: value}) for name, value in train_mistakes]),
    ]
    given = f"SPECS, PES, FORMS, KNOBS = {specs!r}, {declared.registered_names('pe')!r}, {forms!r}, {knobs!r}\n"
    given += f"CHECKS = {checks!r}\n"
    program = given + COMPARE_CODE_WITHOUT_TORCH
    checked = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert checked.returncode == 0, checked.stderr[-3000:]
    accepted, refused = json.loads(checked.stdout.strip().splitlines()[-1])
    assert accepted > 100 and refused > 100, (accepted, refused)  # both verdicts are exercised
