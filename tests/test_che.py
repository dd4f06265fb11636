"""CHE training and testing of encoders (through md.train), the accuracy table and plot, the `che` command."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import minidape as md
from minidape import che, tasks
from minidape.lab.train import step_seed

REPO = Path(__file__).resolve().parent.parent


def tiny_config(**overrides):
    return md.GPTConfig(**{"n_layer": 1, "n_embd": 16, "n_head": 2, "pe": "alibi", **overrides})


@pytest.mark.parametrize(
    "name, block_size",
    [("duplicate_string", 120), ("modular_arithmetic", 40), ("compute_sqrt", 60), ("bucket_sort", 80)],
)
def test_task_config(name, block_size):
    cfg = che.task_config(name, md.GPTConfig(pe="kerple_log", refiner="dape", causal=True, vocab_size=256))
    task = tasks.get_task(name)
    assert (cfg.causal, cfg.vocab_size, cfg.block_size) == (False, task.model_vocab_size, block_size)
    assert (cfg.pe, cfg.refiner) == ("kerple_log", "dape")
    model = md.GPT(cfg)  # the classifier is its own layer, as in the benchmark
    assert not cfg.tie_embeddings and model.lm_head.weight is not model.wte.weight


def test_short_training_run_beats_chance():
    # Inputs of length 1..6 keep it short; parity of up to 6 bits is far from trivial for chance (50%).
    model, history, results = che.train_task(
        "parity_check",
        md.GPTConfig(n_layer=2, n_embd=32, n_head=2, pe="rope"),
        steps=600,
        lr=3e-3,
        max_train_length=6,
        test_lengths=range(2, 7),
        eval_samples=256,
        progress=False,
    )
    assert results["mean_within_train"] > 0.6 and not model.training
    assert history[-1]["loss"] < history[0]["loss"] - 0.1


def test_train_task_history_and_results():
    lengths = [3, 7, 8, 12, 20]
    model, history, results = che.train_task(
        "modular_arithmetic",
        tiny_config(),
        steps=20,
        batch_size=4,
        max_train_length=9,
        test_lengths=lengths,
        eval_samples=8,
        log_every=5,
        progress=False,
    )
    assert [entry["step"] for entry in history] == [0, 5, 10, 15, 20]  # the last after the last update
    # One length per step from U{1..9}, made odd as the task needs.
    assert all(entry["length"] in (1, 3, 5, 7, 9) for entry in history)
    curve = results["accuracy"]
    assert list(curve) == [3, 7, 11, 19]  # 8 -> 7 and 12 -> 11, 20 -> 19; duplicates merged
    assert all(0.0 <= acc <= 1.0 for acc in curve.values())
    assert results["mean_within_train"] == pytest.approx((curve[3] + curve[7]) / 2)
    assert results["mean_beyond_train"] == pytest.approx((curve[11] + curve[19]) / 2)
    assert results["chance"] == pytest.approx(0.2) and results["steps"] == 20
    assert results["parameters"] == sum(p.numel() for p in model.parameters())
    assert model.cfg.causal is False and model.cfg.vocab_size == tasks.get_task("modular_arithmetic").model_vocab_size


def test_train_task_is_seeded():
    def run(seed):
        _, history, results = che.train_task(
            "reverse_string",
            tiny_config(),
            steps=6,
            batch_size=4,
            test_lengths=[5, 50],
            eval_samples=4,
            seed=seed,
            progress=False,
        )
        return [(entry["length"], entry["loss"]) for entry in history], results["accuracy"]

    assert run(3) == run(3)
    assert run(3)[0] != run(4)[0]


def test_evaluate_task_batches_agree_and_reach_length_500():
    task = tasks.get_task("stack_manipulation")
    torch.manual_seed(0)
    model = md.GPT(che.task_config(task, tiny_config(pe="kerple_log")))
    whole = che.evaluate_task(model, task, [30, 500], samples=6)
    split = che.evaluate_task(model, task, [30, 500], samples=6, batch_tokens=1)
    # Other batch shapes may round differently: a near tie may flip an answer token or two, no more.
    assert set(whole) == set(split) == {30, 500} and whole == pytest.approx(split, abs=0.02)


def test_evaluate_task_counts_correct_answers():
    """A model that always answers class 0 scores the share of 0 answers among the scored positions."""
    task = tasks.get_task("reverse_string")
    torch.manual_seed(0)
    model = md.GPT(che.task_config(task, tiny_config()))
    with torch.no_grad():
        model.lm_head.weight.zero_()
        model.lm_head.weight[0] = 1.0  # every position then favours class 0
        model.ln_f.bias.fill_(1.0)
        model.ln_f.weight.zero_()
    curve = che.evaluate_task(model, task, [11], samples=16, seed=5)
    _, targets = task.sample(16, 11, torch.Generator().manual_seed(step_seed(5, 0, 11)))
    assert curve[11] == pytest.approx((targets == 0).float().mean().item())


def test_random_positions_are_drawn_at_test_time_too():
    task = tasks.get_task("reverse_string")
    model = md.GPT(che.task_config(task, tiny_config(random_positions=256, dropout=0.5))).eval()
    with che._test_positions(model):
        positions = model.positions(60, "cpu")
        assert not torch.equal(positions, torch.arange(60)) and positions.max() < 256
        assert not any(module.training for module in model.modules() if module is not model)  # no dropout
    assert not model.training and torch.equal(model.positions(60, "cpu"), torch.arange(60))
    first = che.evaluate_task(model, task, [20, 80], samples=4, seed=1)
    assert first == che.evaluate_task(model, task, [20, 80], samples=4, seed=1)


def test_train_task_bad_inputs():
    with pytest.raises(ValueError, match="unknown task 'sorting'.*bucket_sort"):
        che.train_task("sorting", tiny_config(), steps=1)
    with pytest.raises(TypeError, match="task must be"):
        che.train_task(3, tiny_config(), steps=1)
    with pytest.raises(ValueError, match="steps must be an integer >= 1, got 0"):
        che.train_task("even_pairs", tiny_config(), steps=0)
    with pytest.raises(ValueError, match="lr must be a number > 0"):
        che.train_task("even_pairs", tiny_config(), steps=1, lr=0.0)
    with pytest.raises(ValueError, match="max_train_length=2 is below the shortest binary_addition input"):
        che.train_task("binary_addition", tiny_config(), steps=1, max_train_length=2)
    with pytest.raises(ValueError, match="test_lengths must be a non-empty"):
        che.train_task("even_pairs", tiny_config(), steps=1, test_lengths=[])
    with pytest.raises(ValueError, match=r"test_lengths must .*\[0\]"):
        che.train_task("even_pairs", tiny_config(), steps=1, test_lengths=[0, 5])
    with pytest.raises(ValueError, match="no length solve_equation can generate"):
        che.train_task("solve_equation", tiny_config(), steps=1, test_lengths=[1, 2])
    with pytest.raises(ValueError, match="random_positions=128 is shorter than the longest test sequence"):
        che.train_task("duplicate_string", tiny_config(random_positions=128), steps=1, test_lengths=[50])
    with pytest.raises(ValueError, match="pe='learned' has 80 positions"):
        che.train_task("reverse_string", tiny_config(pe="learned"), steps=1, test_lengths=[41])
    decoder = md.GPT(md.GPTConfig(n_layer=1, n_embd=16, n_head=2, vocab_size=8))
    with pytest.raises(ValueError, match="causal=False and vocab_size >= 3"):
        che.train_task("even_pairs", decoder, steps=1)
    with pytest.raises(TypeError, match="GPTConfig"):
        che.evaluate_task(torch.nn.Linear(2, 2), "even_pairs", [5])


# --------------------------------------------------------------------------------------- table, plot, CLI


def test_accuracy_table_means_per_bin():
    curves = {
        "a": {10: 1.0, 40: 0.8, 50: 0.6, 90: 0.4, 150: 0.2},
        "b": {"10": 0.5, "40": 0.5, "50": 0.5, "90": 0.5, "150": 0.5},
    }  # JSON keys work too
    table = che.accuracy_table({"a": {"accuracy": curves["a"]}, "b": curves["b"]}, train_length=40)
    lines = table.strip().splitlines()
    assert lines[0] == "| model | 1–40 (train) | 41–100 | 101–150 | mean 41–150 |"
    assert lines[2] == "| a | 90.0 | 50.0 | 20.0 | 40.0 |"
    assert lines[3] == "| b | 50.0 | 50.0 | 50.0 | **50.0** |"
    with pytest.raises(ValueError, match="results is empty"):
        che.accuracy_table({})


def test_plot_accuracy_writes_the_figure(tmp_path):
    path = tmp_path / "plots" / "accuracy.png"
    fig = md.plots.plot_accuracy(
        {"alibi": {10: 1.0, 50: 0.5}, "kerple": {10: 0.9, 50: 0.7}}, train_length=40, chance=0.5, path=path
    )
    ax = fig.axes[0]
    assert path.stat().st_size > 0 and sorted(p.name for p in path.parent.iterdir()) == ["accuracy.png"]
    assert [line.get_label() for line in ax.get_lines()][:2] == ["alibi", "kerple"]
    assert list(ax.get_lines()[1].get_ydata()) == [90.0, 70.0]


def run_cli(*args, cwd=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "minidape", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


def test_che_cli_round_trip(tmp_path):
    out = tmp_path / "run"
    done = run_cli(
        "che",
        "--task",
        "bucket_sort",
        "--pe",
        "kerple_log",
        "--refiner",
        "conv",
        "--n-layer",
        "1",
        "--n-embd",
        "16",
        "--n-head",
        "2",
        "--steps",
        "4",
        "--batch-size",
        "4",
        "--max-train-length",
        "10",
        "--max-test-length",
        "20",
        "--length-step",
        "5",
        "--eval-samples",
        "4",
        "--out",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    assert "| model | 1–10 (train) | 11–20 | mean 11–20 |" in done.stdout and "| kerple_log+conv |" in done.stdout
    assert sorted(p.name for p in out.iterdir()) == ["accuracy.png", "results.json", "results.md"]
    results = json.loads((out / "results.json").read_text())
    accuracy = results["accuracy"]
    assert results["task"] == "bucket_sort" and list(accuracy) == ["5", "10", "15", "20"]
    assert results["mean_beyond_train"] == pytest.approx((accuracy["15"] + accuracy["20"]) / 2)
    assert results["config"]["refiner"] == "conv" and results["config"]["causal"] is False
    assert [entry["step"] for entry in results["history"]] == [0, 1, 2, 3, 4] and results["steps"] == 4
    assert "| kerple_log+conv |" in (out / "results.md").read_text()
