"""The command line: help of each command, a train -> eval round trip, resume, the demo, bad input."""
import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

import minidape as md
from minidape import __main__ as cli
from minidape.train import load_checkpoint

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
    return subprocess.run([sys.executable, "-m", "minidape", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


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
    assert all(flag in train_help for flag in ("--corpus", "--steps", "--out", "--resume", "--device"))
    parsed = cli.build_parser().parse_args(["train", "--no-causal", "--dropout", "0.25", "--pe", "t5", "--out", "x"])
    assert (parsed.causal, parsed.dropout, parsed.pe) == (False, 0.25, "t5")  # typed from the dataclass
    assert all(flag in help_text(capsys, "eval") for flag in ("--lengths", "--protocol", "--last-k", "--corpus"))
    assert all(flag in help_text(capsys, "demo") for flag in ("--corpus", "--out", "--steps"))


def test_train_then_eval_round_trip(tmp_path, corpus_file):
    trained = run_cli("train", *TINY_FLAGS, "--pe", "kerple_log", "--refiner", "dape", "--refiner-width", "8",
                      "--corpus", str(corpus_file), "--steps", "4", "--batch-size", "4",
                      "--out", "run", cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    run = tmp_path / "run"
    assert "kerple_log+dape: step 4" in trained.stdout
    history = json.loads((run / "history.json").read_text())
    assert history[0]["step"] == 0 and history[-1]["step"] == 4
    model, checkpoint = load_checkpoint(run)
    assert dataclasses.asdict(model.cfg) == dataclasses.asdict(md.GPTConfig(
        n_layer=1, n_head=2, n_embd=32, block_size=16, pe="kerple_log", refiner="dape", refiner_width=8))
    assert checkpoint["corpus"] == str(corpus_file) and checkpoint["step"] == 4

    evaluated = run_cli("eval", "run", "--lengths", "16", "64", "--n-windows", "2", "--last-k", "8", "--device", "cpu",
                        cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert sorted(os.listdir(run)) == ["checkpoint.pt", "extrapolation.png", "history.json", "results.json",
                                       "results.md"]
    expected = md.evaluate.perplexity_by_length(model, md.load_corpus(corpus_file, "val"), [16, 64], last_k=8,
                                                n_windows=2)
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
    cli.main(["eval", str(tmp_path / "alibi" / "checkpoint.pt"), str(tmp_path / "other"), "--lengths", "32",
              "--protocol", "nonoverlap", "--n-tokens", "500", "--out", str(tmp_path / "both")])
    names = json.loads((tmp_path / "both" / "results.json").read_text())["results"]
    assert set(names) == {"alibi", "alibi (other)"}  # same kind of model: told apart by run directory


def test_demo_writes_its_table_and_plot(tmp_path, monkeypatch, capsys):
    # the demo's real budget is its own business; here every code path runs on a token budget
    tiny = dataclasses.replace(cli.FAST_BUDGET, n_layer=1, n_embd=16, n_head=2, steps=2, batch_size=2,
                               eval_lengths=(128, 256), eval_windows=1)
    monkeypatch.setattr(cli, "FAST_BUDGET", tiny)
    monkeypatch.setenv("MINIDAPE_FAST", "1")
    cli.main(["demo", "--out", str(tmp_path), "--device", "cpu"])
    printed = capsys.readouterr().out
    names = [name for name, _ in cli.DEMO_MODELS]
    assert names == ["NoPE", "RoPE", "ALiBi", "Kerple-log", "FIRE", "DAPE-Kerple", "conv-Kerple"]
    results = json.loads((tmp_path / "results.json").read_text())["results"]
    assert list(results) == names and all(set(curve) == {"128", "256"} for curve in results.values())
    table = (tmp_path / "results.md").read_text()
    for name in names:
        row = re.search(rf"^\| {re.escape(name)} \| (.+) \|$", table, re.MULTILINE).group(1)
        numbers = [float(cell.strip("* ")) for cell in row.split("|")]
        assert numbers == pytest.approx([results[name]["128"], results[name]["256"]], abs=0.006)
        assert f"| {name} |" in printed
    assert (tmp_path / "extrapolation.png").stat().st_size > 1000
    for name in names:
        assert (tmp_path / name / "checkpoint.pt").exists()


@pytest.mark.parametrize("argv, message", [
    (["train", "--pe", "bogus", "--out", "x"], "invalid choice: 'bogus'"),
    (["train", "--refiner", "mlp", "--out", "x"], "choose from"),
    (["eval", "run", "--protocol", "sliding"], "invalid choice: 'sliding'"),
    (["train", "--steps", "2"], "the following arguments are required: --out"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_bad_flags_are_named(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_bad_values_are_one_line_errors(tmp_path, capsys):
    cases = [(["train", *TINY_FLAGS, "--corpus", "nope", "--out", str(tmp_path / "a")],
              "error: unknown corpus 'nope': valid corpora are austen, latex, python"),
             (["eval", str(tmp_path / "missing.pt")], "error: no checkpoint at"),
             (["train", *TINY_FLAGS, "--steps", "0", "--out", str(tmp_path / "b")], "error: steps must be")]
    for argv, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            cli.main(argv)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
