"""The command line: help of each command, a train -> eval round trip, resume, the demo, bad input."""

import dataclasses
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

import minidape as md
from minidape import __main__ as cli
from minidape import study
from minidape.lab.checkpoints import CHECKPOINT_NAME, load_checkpoint, read_checkpoint
from minidape.study import demo

REPO = Path(__file__).resolve().parent.parent
TINY_FLAGS = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "16", "--device", "cpu"]


@pytest.fixture(autouse=True)
def no_figures_left():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    """A small .txt corpus, so the subprocesses read little."""
    path = tmp_path_factory.mktemp("corpus") / "books.txt"
    path.write_bytes(bytes(md.load_corpus("austen", "train")[:30_000].tolist()))
    return path


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "minidape", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def error_lines(stderr: str) -> list[str]:
    """The lines the CLI itself wrote to stderr (the progress bar writes there too)."""
    assert "Traceback" not in stderr
    return [line for line in stderr.splitlines() if line.startswith("python -m minidape")]


def failing(capsys, argv: list[str]) -> tuple[int, list[str]]:
    """Run a command line that must stop: its exit code and the lines the CLI wrote to stderr."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    return exit_info.value.code, error_lines(capsys.readouterr().err)


def help_text(capsys, *command: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*command, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_help_of_every_command(capsys):
    assert all(name in help_text(capsys) for name in ("demo", "train", "eval"))
    train_help = help_text(capsys, "train")
    for field in dataclasses.fields(md.GPTConfig):  # every GPTConfig field is a flag
        assert f"--{field.name.replace('_', '-')}" in train_help
    assert all(
        flag in train_help
        for flag in ("--corpus", "--steps", "--out", "--resume", "--overwrite", "--device", "--import")
    )
    parsed = cli.build_parser().parse_args(["train", "--no-causal", "--dropout", "0.25", "--pe", "t5", "--out", "x"])
    assert (parsed.causal, parsed.dropout, parsed.pe) == (False, 0.25, "t5")  # typed from the dataclass
    assert all(flag in help_text(capsys, "eval") for flag in ("--lengths", "--protocol", "--last-k", "--corpus"))
    assert all(flag in help_text(capsys, "demo") for flag in ("--corpus", "--out", "--steps"))


def test_train_then_eval_round_trip(tmp_path, corpus_file):
    trained = run_cli(
        "train",
        *TINY_FLAGS,
        "--pe",
        "kerple_log",
        "--refiner",
        "dape",
        "--refiner-width",
        "8",
        "--corpus",
        str(corpus_file),
        "--steps",
        "4",
        "--batch-size",
        "4",
        "--out",
        "run",
        cwd=tmp_path,
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    run = tmp_path / "run"
    assert "kerple_log+dape: step 4" in trained.stdout
    history = json.loads((run / "history.json").read_text())
    assert history[0]["step"] == 0 and history[-1]["step"] == 4
    model, checkpoint = load_checkpoint(run)
    assert dataclasses.asdict(model.cfg) == dataclasses.asdict(
        md.GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, pe="kerple_log", refiner="dape", refiner_width=8)
    )
    assert checkpoint["corpus"] == md.data.corpus_identity(corpus_file) and checkpoint["step"] == 4
    assert checkpoint["corpus"]["path"] == str(corpus_file.resolve())

    evaluated = run_cli(
        "eval", "run", "--lengths", "16", "64", "--n-windows", "2", "--last-k", "8", "--device", "cpu", cwd=tmp_path
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert sorted(os.listdir(run)) == [
        "checkpoint.pt",
        "extrapolation.png",
        "history.json",
        "results.json",
        "results.md",
    ]
    expected = md.evaluate.perplexity_by_length(
        model, md.load_corpus(corpus_file, "val"), [16, 64], last_k=8, n_windows=2
    )
    saved = json.loads((run / "results.json").read_text())
    assert saved["results"]["kerple_log+dape"] == pytest.approx({"16": expected[16], "64": expected[64]}, rel=1e-5)
    row = f"| kerple_log+dape | **{expected[16]:.2f}** | **{expected[64]:.2f}** |"
    assert row in (run / "results.md").read_text() and row in evaluated.stdout
    assert "| model | 16 (train) | 64 |" in evaluated.stdout


def test_resume_and_eval_of_two_runs_in_process(tmp_path, corpus_file, capsys):
    common = [*TINY_FLAGS, "--corpus", str(corpus_file), "--batch-size", "2", "--checkpoint-every", "2"]
    cli.main(["train", *common, "--pe", "alibi", "--steps", "2", "--out", str(tmp_path / "alibi")])
    cli.main(["train", *common, "--pe", "alibi", "--steps", "5", "--out", str(tmp_path / "alibi"), "--resume"])
    history = json.loads((tmp_path / "alibi" / "history.json").read_text())
    assert history[0]["step"] == 0 and history[-1]["step"] == 5
    assert load_checkpoint(tmp_path / "alibi")[1]["step"] == 5
    cli.main(["train", *common, "--pe", "alibi", "--steps", "2", "--out", str(tmp_path / "other")])
    capsys.readouterr()
    cli.main(
        [
            "eval",
            str(tmp_path / "alibi" / "checkpoint.pt"),
            str(tmp_path / "other"),
            "--lengths",
            "32",
            "--protocol",
            "nonoverlap",
            "--n-tokens",
            "500",
            "--out",
            str(tmp_path / "both"),
        ]
    )
    names = json.loads((tmp_path / "both" / "results.json").read_text())["results"]
    assert set(names) == {"alibi (alibi)", "alibi (other)"}  # same kind of model: told apart by run directory


def test_demo_writes_its_table_and_plot(tmp_path, monkeypatch, capsys, figures_keep_the_rules):
    # the demo's real budget is its own business; here every code path runs on a token budget
    tiny = dataclasses.replace(
        demo.QUICK_BUDGET, n_layer=1, n_embd=16, n_head=2, steps=2, batch_size=2, eval_factors=(1, 2), eval_windows=1
    )
    monkeypatch.setattr(demo, "QUICK_BUDGET", tiny)
    monkeypatch.setenv("MINIDAPE_QUICK", "1")
    cli.main(["demo", "--out", str(tmp_path), "--device", "cpu"])
    printed = capsys.readouterr().out
    names = list(demo.DEMO_MODELS)
    assert names == ["NoPE", "RoPE", "ALiBi", "Kerple-log", "FIRE", "DAPE-Kerple", "DAPE1x3-Kerple"]
    for name in names:  # the study's model of that name, at the demo's size
        config = read_checkpoint(tmp_path / name)["config"]
        assert {key: config[key] for key in study.MODELS[name]} == study.MODELS[name] and config["n_layer"] == 1
    results = json.loads((tmp_path / "results.json").read_text())["results"]
    assert list(results) == names and all(set(curve) == {"128", "256"} for curve in results.values())
    table = (tmp_path / "results.md").read_text()
    for name in names:
        row = re.search(rf"^\| {re.escape(name)} \| (.+) \|$", table, re.MULTILINE).group(1)
        numbers = [float(cell.strip("* ")) for cell in row.split("|")]
        assert numbers == pytest.approx([results[name]["128"], results[name]["256"]], abs=0.006)
        assert f"| {name} |" in printed
    assert (tmp_path / "extrapolation.png").stat().st_size > 1000
    assert len(figures_keep_the_rules) == 1  # the plot was drawn, and checked
    for name in names:
        assert (tmp_path / name / "checkpoint.pt").exists()


def write_files(folder: Path) -> dict[str, Path]:
    """Files a user might pass: a bias of their own, a broken one, a non-Python file, a file that is no
    checkpoint."""
    files = {
        "bias": folder / "window_bias.py",
        "broken": folder / "broken.py",
        "text": folder / "notes.txt",
        "not_checkpoint": folder / "weights.pt",
    }
    files["bias"].write_text(USER_BIAS)
    files["class_bias"] = folder / "gauss.py"
    files["class_bias"].write_text(CLASS_BIAS)
    files["broken"].write_text("import minidape as md\n\ndef oops(:\n")
    files["text"].write_text("not python")
    files["not_checkpoint"].write_bytes(b"not a checkpoint")
    return files


USER_BIAS = textwrap.dedent('''
    """A user's bias: a learnable linear distance penalty per head."""
    import torch
    import minidape as md


    @md.register_pe("window_bias")
    class WindowBias(md.AdditiveBias):
        def __init__(self, cfg):
            super().__init__()
            self.slope = torch.nn.Parameter(torch.full((cfg.n_head, 1, 1), 0.5))

        def forward(self, q_pos, k_pos):
            distance = (q_pos[:, None] - k_pos[None, :]).abs().float()
            return -self.slope * distance                      # (n_head, Tq, Tk)
''')


CLASS_BIAS = textwrap.dedent('''
    """A user's bias that does not register itself: used as gauss.py:Gauss."""
    import torch
    import minidape as md


    class Gauss(md.AdditiveBias):
        def __init__(self, cfg):
            super().__init__()
            self.width = torch.nn.Parameter(torch.full((cfg.n_head, 1, 1), 4.0))

        def forward(self, q_pos, k_pos):
            distance = (q_pos[:, None] - k_pos[None, :]).float()
            return -(distance / self.width) ** 2                 # (n_head, Tq, Tk)
''')


@pytest.fixture(scope="module")
def user_files(tmp_path_factory):
    return write_files(tmp_path_factory.mktemp("user"))


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, corpus_file):
    """A tiny run trained in-process, for the commands that need a checkpoint."""
    out = tmp_path_factory.mktemp("trained") / "run"
    cli.main(
        ["train", *TINY_FLAGS, "--corpus", str(corpus_file), "--steps", "2", "--batch-size", "2", "--out", str(out)]
    )
    return out


def bad_command_lines(tmp: Path, run: Path, files: dict, corpus: Path) -> list[tuple[list[str], str]]:
    """(argv, a fragment of the message) for the mistakes users make with each command."""
    train = ["train", *TINY_FLAGS, "--corpus", str(corpus), "--steps", "2"]
    che = [
        "che",
        "--task",
        "even_pairs",
        "--n-layer",
        "1",
        "--n-embd",
        "16",
        "--n-head",
        "2",
        "--steps",
        "1",
        "--out",
        str(tmp / "che"),
    ]
    return [
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        ([], "the following arguments are required: command"),
        (["train", "--pe", "bogus", "--out", "x"], "argument --pe: unknown pe 'bogus'; valid choices: none, learned"),
        (["train", "--refiner", "mlp", "--out", "x"], "argument --refiner: unknown refiner 'mlp'; valid choices: none"),
        (["train", "--pe", f"{files['class_bias']}:Nothing", "--out", "x"], "defines no 'Nothing'"),
        (
            ["train", "--refiner", f"{files['class_bias']}:Gauss", "--out", "x"],
            "is a positional encoding, not a refiner",
        ),
        (["reproduce", "--import", f"{files['class_bias']}:Gauss", "--seeds", "1"], "seeds must be an integer >= 2"),
        (["train", "--steps", "2"], "the following arguments are required: --out"),
        ([*train, "--out", str(tmp / "a"), "--steps", "0"], "argument --steps: must be a positive integer, got '0'"),
        ([*train, "--out", str(tmp / "a"), "--lr", "-1"], "argument --lr: must be a number > 0, got '-1'"),
        ([*train, "--out", str(tmp / "a"), "--n-layer", "two"], "invalid int value: 'two'"),
        ([*train, "--out", str(tmp / "a"), "--frobnicate"], "unrecognized arguments: --frobnicate"),
        (
            ["train", *TINY_FLAGS, "--corpus", "nope", "--out", str(tmp / "a")],
            "unknown corpus 'nope': valid corpora are austen, latex, python",
        ),
        ([*train, "--out", str(files["text"])], "is a file, not a folder"),
        ([*train, "--out", str(files["text"] / "run")], "cannot be created"),
        ([*train, "--out", str(run)], "already holds a checkpoint; pass resume=True to continue it or overwrite"),
        ([*train, "--out", str(run), "--resume", "--overwrite"], "argument --overwrite: not allowed with argument"),
        ([*train, "--out", str(tmp / "empty"), "--resume"], "no checkpoint at"),
        ([*train, "--out", str(run), "--resume", "--n-embd", "64"], "differs from the checkpoint's in: n_embd"),
        ([*train, "--out", str(tmp / "a"), "--import", str(tmp / "missing.py")], "missing.py': no such file"),
        ([*train, "--out", str(tmp / "a"), "--import", str(files["text"])], "needs a Python file ending in .py"),
        ([*train, "--out", str(tmp / "a"), "--import", str(files["broken"])], "failed at line 3: SyntaxError"),
        (["eval", str(tmp / "missing.pt")], "no checkpoint at"),
        (["eval", str(files["not_checkpoint"])], "the file is truncated or corrupt"),
        (["eval", str(run), "--lengths", "16", "0"], "argument --lengths: must be a positive integer, got '0'"),
        (["eval", str(run), "--protocol", "sliding"], "argument --protocol: invalid choice: 'sliding'"),
        (["eval", str(run), "--lengths", "100000", "--corpus", str(corpus)], "windows of 100001 tokens"),
        (["eval", str(run), "--device", "tpu"], "unknown device 'tpu'"),
        (["demo", "--steps", "0"], "argument --steps: must be a positive integer, got '0'"),
        (["demo", "--corpus", "nope", "--out", str(tmp / "demo")], "unknown corpus 'nope'"),
        (["che", "--task", "sorting"], "argument --task: invalid choice: 'sorting'"),
        ([*che, "--vocab-size", "4"], "the task sets vocab_size; drop --vocab-size"),
        ([*che, "--steps", "0"], "argument --steps: must be a positive integer, got '0'"),
        ([*che, "--max-test-length", "5", "--length-step", "10"], "--length-step 10 exceeds --max-test-length 5"),
        (
            [
                "che",
                "--task",
                "duplicate_string",
                "--pe",
                "alibi",
                "--random-positions",
                "200",
                "--steps",
                "1",
                "--out",
                str(tmp / "che"),
            ],
            "--random-positions=200 is shorter than the longest test sequence",
        ),
        (
            [*train, "--out", str(tmp / "a"), "--threads", "-3"],
            "argument --threads: must be a positive integer, got '-3'",
        ),
        (["eval", str(run), "--threads", "two"], "argument --threads: must be a positive integer, got 'two'"),
        (["bench", "--threads", "0"], "argument --threads: must be a positive integer, got '0'"),
        (["bench", "--pe", "bogus"], "argument --pe: unknown pe 'bogus'"),
        (["bench", "--import", str(tmp / "missing.py")], "no such file"),
    ]


def test_every_user_mistake_is_one_line_and_exit_code_2(tmp_path, capsys, trained_run, user_files, corpus_file):
    (tmp_path / "empty").mkdir()
    for argv, message in bad_command_lines(tmp_path, trained_run, user_files, corpus_file):
        code, lines = failing(capsys, argv)
        assert code == 2 and len(lines) == 1 and message in lines[0], (argv, lines)
    assert sorted(os.listdir(tmp_path)) == ["empty"]  # no mistake left anything on disk
    assert load_checkpoint(trained_run)[1]["step"] == 2  # nor touched the run


def test_overwrite_replaces_a_run_and_resume_continues_it(tmp_path, corpus_file, capsys):
    common = ["train", *TINY_FLAGS, "--corpus", str(corpus_file), "--batch-size", "2", "--out", str(tmp_path)]
    cli.main([*common, "--steps", "2", "--pe", "alibi"])
    cli.main([*common, "--steps", "3", "--pe", "rope", "--overwrite"])
    assert load_checkpoint(tmp_path)[0].cfg.pe == "rope"
    cli.main([*common, "--steps", "4", "--resume"])
    checkpoint = load_checkpoint(tmp_path)[1]
    assert checkpoint["step"] == 4 and checkpoint["config"]["pe"] == "rope"


def test_an_interrupted_run_says_how_to_resume_in_one_line(tmp_path, corpus_file, capsys, monkeypatch):
    train_module = sys.modules["minidape.lab.train"]
    draw = train_module.get_batch
    calls = []

    def interrupt_at_step_3(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return draw(*args, **kwargs)

    monkeypatch.setattr(train_module, "get_batch", interrupt_at_step_3)
    code, err = failing(
        capsys,
        [
            "train",
            *TINY_FLAGS,
            "--corpus",
            str(corpus_file),
            "--steps",
            "6",
            "--batch-size",
            "2",
            "--checkpoint-every",
            "2",
            "--out",
            str(tmp_path),
        ],
    )
    assert code == 130 and len(err) == 1
    assert "interrupted at step 3" in err[0] and "holds step 2" in err[0] and "--resume" in err[0]
    monkeypatch.undo()
    cli.main(
        [
            "train",
            *TINY_FLAGS,
            "--corpus",
            str(corpus_file),
            "--steps",
            "6",
            "--batch-size",
            "2",
            "--out",
            str(tmp_path),
            "--resume",
        ]
    )
    assert load_checkpoint(tmp_path)[1]["step"] == 6


def test_a_non_finite_loss_is_one_line_naming_the_step(tmp_path, corpus_file, capsys, monkeypatch):
    train_module = sys.modules["minidape.lab.train"]

    class NaNFromStep2(md.GPT):
        calls = 0

        def forward(self, idx, targets=None):
            logits, loss = super().forward(idx, targets)
            NaNFromStep2.calls += self.training  # training steps only, not the validation passes
            return logits, loss * float("nan") if NaNFromStep2.calls > 2 else loss

    monkeypatch.setattr(train_module, "GPT", NaNFromStep2)
    code, err = failing(
        capsys,
        [
            "train",
            *TINY_FLAGS,
            "--corpus",
            str(corpus_file),
            "--steps",
            "6",
            "--batch-size",
            "2",
            "--eval-every",
            "100",
            "--out",
            str(tmp_path),
        ],
    )
    assert code == 2 and len(err) == 1
    assert "stopped at step 2: non-finite loss nan" in err[0] and "learning rate" in err[0]
    assert not (tmp_path / CHECKPOINT_NAME).exists()


def test_eval_refuses_a_corpus_file_changed_since_training(tmp_path, corpus_file, capsys):
    corpus = tmp_path / "books.txt"
    corpus.write_bytes(corpus_file.read_bytes())
    cli.main(
        [
            "train",
            *TINY_FLAGS,
            "--corpus",
            str(corpus),
            "--steps",
            "1",
            "--batch-size",
            "2",
            "--out",
            str(tmp_path / "run"),
        ]
    )
    corpus.write_bytes(corpus_file.read_bytes()[:-100])
    code, err = failing(capsys, ["eval", str(tmp_path / "run"), "--lengths", "16", "--n-windows", "1"])
    assert code == 2 and "but the run was trained on" in err[0] and str(corpus) in err[0]
    assert not (tmp_path / "run" / "results.json").exists()
    cli.main(["eval", str(tmp_path / "run"), "--lengths", "16", "--n-windows", "1", "--corpus", str(corpus)])
    assert (tmp_path / "run" / "results.json").exists()  # a corpus named explicitly is the user's choice


def test_a_users_bias_through_train_eval_che_and_bench(tmp_path, corpus_file, user_files, capsys):
    """`--import` loads the registration in every command; a checkpoint that needs it says so."""
    bias = str(user_files["bias"])
    run = tmp_path / "run"
    cli.main(
        [
            "train",
            "--import",
            bias,
            *TINY_FLAGS,
            "--pe",
            "window_bias",
            "--refiner",
            "dape",
            "--refiner-width",
            "8",
            "--corpus",
            str(corpus_file),
            "--steps",
            "2",
            "--batch-size",
            "2",
            "--out",
            str(run),
        ]
    )
    assert read_checkpoint(run)["sources"] == {"pe": str(user_files["bias"].resolve())}

    # a fresh process, where nothing registered window_bias
    forgot = run_cli("eval", str(run), "--lengths", "16", "--n-windows", "1", cwd=tmp_path)
    assert forgot.returncode == 2 and len(error_lines(forgot.stderr)) == 1
    assert f"uses pe 'window_bias', which is not registered here; it was registered by {bias}" in forgot.stderr
    assert f"--import {bias}" in forgot.stderr
    capsys.readouterr()
    cli.main(["eval", "--import", bias, str(run), "--lengths", "16", "32", "--n-windows", "1"])
    assert "| window_bias+dape |" in capsys.readouterr().out

    cli.main(
        [
            "che",
            "--import",
            bias,
            "--task",
            "parity_check",
            "--pe",
            "window_bias",
            "--n-layer",
            "1",
            "--n-embd",
            "16",
            "--n-head",
            "2",
            "--steps",
            "2",
            "--batch-size",
            "2",
            "--max-train-length",
            "5",
            "--max-test-length",
            "10",
            "--length-step",
            "5",
            "--eval-samples",
            "2",
            "--out",
            str(tmp_path / "che"),
        ]
    )
    assert json.loads((tmp_path / "che" / "results.json").read_text())["config"]["pe"] == "window_bias"
    # --pe window_bias is accepted and handed on: the benchmark's own check of --rounds is what speaks
    benched = run_cli("bench", "--import", bias, "--pe", "window_bias", "--rounds", "0", cwd=tmp_path)
    assert benched.returncode == 2 and "--rounds" in benched.stderr and "window_bias" not in benched.stderr


def test_the_file_class_form_in_train_eval_compare_and_reproduce(tmp_path, corpus_file, user_files, capsys):
    """`--pe FILE.py:ClassName` in train (as in compare), `--import FILE.py:ClassName` in every command."""
    gauss = f"{user_files['class_bias']}:Gauss"
    run = tmp_path / "run"
    cli.main(
        [
            "train",
            *TINY_FLAGS,
            "--pe",
            gauss,
            "--corpus",
            str(corpus_file),
            "--steps",
            "2",
            "--batch-size",
            "2",
            "--out",
            str(run),
        ]
    )
    assert read_checkpoint(run)["config"]["pe"] == "gauss:Gauss"
    forgot = run_cli("eval", str(run), "--lengths", "16", "--n-windows", "1", cwd=tmp_path)  # a fresh process
    assert forgot.returncode == 2 and f"--import {user_files['class_bias'].resolve()}:Gauss" in forgot.stderr
    evaluated = run_cli("eval", "--import", gauss, str(run), "--lengths", "16", "32", "--n-windows", "1", cwd=tmp_path)
    assert evaluated.returncode == 0 and "| gauss:Gauss |" in evaluated.stdout
    parsed = cli.build_parser().parse_args(["compare", "--pe", f"{gauss}+conv:5", "--against", "alibi"])
    assert study.parse_model(parsed.pe) == (
        "gauss:Gauss+conv:k=5",
        {"pe": "gauss:Gauss", "refiner": "conv", "refiner_kernel": 5},
    )


def test_compare_help_names_every_knob_with_its_default(capsys):
    text = " ".join(help_text(capsys, "compare").split())
    options = text.partition("options:")[2]
    for flag in (
        "--against",
        "--seeds",
        "--corpus",
        "--budget",
        "--steps",
        "--batch-size",
        "--lr",
        "--n-layer",
        "--n-embd",
        "--n-head",
        "--train-length",
        "--lengths",
        "--margin",
    ):
        assert re.search(rf" {flag} [A-Z_ .\[\]{{}},]*[a-z][^-]*?\(default", options), flag
    assert all(f" {flag} " in options for flag in ("--pe", "--rerun", "--keep-checkpoints"))
    for name in (*md.PE_NAMES, "dape", "conv", "FILE.py:ClassName", "kerple_log+conv:5", "w=matched", "small"):
        assert name in text
