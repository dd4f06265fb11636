"""Round 5 of "nothing silently wrong" (#44): the new encodings' edges, spreadsheets' CSVs, compare's endpoints.
Each test failed on the code before it (named in the docstring where the failure is not obvious)."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import minidape as md
from minidape import study
from minidape.__main__ import main
from minidape.study import comparison

TEXT = "It is a truth universally acknowledged, that a single man in possession of a good fortune. " * 60


@pytest.fixture
def corpus_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT)
    return path


def tiny_config(**overrides) -> md.GPTConfig:
    return md.GPTConfig(**{"vocab_size": 32, "n_layer": 1, "n_head": 2, "n_embd": 8, "block_size": 8, **overrides})


# ----------------------------------------------------------------------------- a user's data-dependent bias


class ReturnsWhatItIsTold(md.DataDependentBias):
    """A bias that reads the data, returning `make(zeros (batch, n_head, Tq, Tk))`."""

    make = staticmethod(lambda zeros: zeros)

    def __init__(self, cfg):
        super().__init__()

    def forward(self, x, q, k, first_query=0):
        return self.make(torch.zeros(q.shape[0], q.shape[1], q.shape[2], k.shape[2]))


def with_cell(value):
    def make(zeros):
        zeros[0, 1, -1, 0] = value
        return zeros

    return make


# what the bias returns -> the error it gets, on both paths (before: a traceback deep inside for the list, the
# NumPy array, int64 and the other device; for bool and all -inf the fast path and model.py's form disagreed and
# training went on)
BAD_BIASES = {
    "list": (lambda zeros: zeros.tolist(), TypeError, "returned a list; a bias must be a torch.Tensor"),
    "numpy": (lambda zeros: zeros.numpy(), TypeError, "returned a ndarray; a bias must be a torch.Tensor"),
    "bool": (lambda zeros: zeros.bool(), TypeError, "dtype torch.bool; a bias must be a floating tensor"),
    "int64": (lambda zeros: zeros.long(), TypeError, "dtype torch.int64; a bias must be a floating tensor"),
    "device": (lambda zeros: zeros.to("meta"), ValueError, "returned a bias on meta; the model runs on cpu"),
    "nan": (with_cell(float("nan")), ValueError, "nan at batch row 0, head 1, query 7, key 0"),
    "+inf": (with_cell(float("inf")), ValueError, "inf at batch row 0, head 1, query 7, key 0"),
    "all -inf": (
        lambda zeros: zeros.fill_(float("-inf")),
        ValueError,
        "-inf at every key that query 0 may attend to (batch row 0, head 0)",
    ),
    "shape": (lambda zeros: zeros[:, :1], ValueError, "expected (batch, n_head, Tq, Tk) = (2, 2, 8, 8)"),
}


@pytest.mark.parametrize("fast", [True, False], ids=["fast path", "model.py's form"])
@pytest.mark.parametrize("case", list(BAD_BIASES))
def test_a_data_dependent_bias_gets_the_checks_of_a_position_only_one_on_both_paths(case, fast):
    make, error, message = BAD_BIASES[case]
    name = f"round5_{case.replace(' ', '_').replace('+', 'plus_')}"
    md.register_pe(name)(type(name, (ReturnsWhatItIsTold,), {"make": staticmethod(make)}))
    model = md.GPT(tiny_config(pe=name, fast=fast))
    with pytest.raises(error) as refused:
        model(torch.zeros(2, 8, dtype=torch.long))
    assert f"pe='{name}' " in str(refused.value) and message in str(refused.value), str(refused.value)


def test_a_data_dependent_bias_with_some_minus_inf_keys_still_runs_the_same_on_both_paths():
    """The checks refuse only what is undefined: a hard window (-inf beyond 2 keys back) is a bias."""

    def window(zeros):
        tq, tk = zeros.shape[-2:]
        distance = torch.arange(tq)[:, None] - torch.arange(tk)[None, :]
        return zeros.masked_fill(distance > 2, float("-inf"))

    md.register_pe("round5_window")(type("Window", (ReturnsWhatItIsTold,), {"make": staticmethod(window)}))
    torch.manual_seed(0)
    idx = torch.randint(0, 32, (2, 8))
    fast = md.GPT(tiny_config(pe="round5_window"))
    reference = md.GPT(tiny_config(pe="round5_window", fast=False))
    reference.load_state_dict(fast.state_dict())
    assert torch.allclose(fast(idx)[0], reference(idx)[0], atol=1e-5)


# ----------------------------------------------------------------------------- per-layer specs


def test_a_per_layer_spec_longer_than_the_model_is_refused():
    """Before: `--n-layer 2 --pe rope,none,alibi` trained without ALiBi."""
    with pytest.raises(ValueError, match=r"pe='rope,none,alibi' names 3 encodings for n_layer=2"):
        tiny_config(n_layer=2, pe="rope,none,alibi")
    assert [block.attn.pe for block in md.GPT(tiny_config(n_layer=3, pe="rope,none")).blocks] == [
        "rope",
        "none",
        "rope",
    ]


# ----------------------------------------------------------------------------- compare


def synthetic_runs(monkeypatch, curves: dict[str, dict[int, float]], spread: float = 0.04):
    """Replace training by per-seed perplexities `curve[length] * exp(noise)`: compare's own code does the rest."""
    generator = np.random.default_rng(0)
    noise = {}

    def train_and_evaluate(cfg, corpus, settings, seed, device, **options):
        label = cfg.pe
        key = (label, seed)
        noise.setdefault(key, {length: generator.normal(0, spread) for length in curves[label]})
        perplexity = {length: value * math.exp(noise[key][length]) for length, value in curves[label].items()}
        return {
            "config": {},
            "perplexity": {"last_k": perplexity, "nonoverlap": perplexity},
            "train_seconds": 0.0,
            "eval_seconds": 0.0,
        }

    monkeypatch.setattr(comparison, "train_and_evaluate", train_and_evaluate)


def test_rope_better_near_the_training_length_and_collapsing_at_16x_is_not_no_difference(
    tmp_path, corpus_file, monkeypatch
):
    """The issue's case: RoPE against NoPE beyond the training length +5.6 % [−8.3, +21.6] ("no difference") while
    RoPE's perplexity doubled at 16x. Runs made up (RoPE better at 1x and 2x, far worse at 16x; the beyond mean
    crossing zero); the endpoints, the tests and the verdict are compare's."""
    T = 16
    synthetic_runs(
        monkeypatch,
        {
            "rope": {T: 3.8, 2 * T: 3.3, 4 * T: 3.8, 8 * T: 4.7, 16 * T: 7.5},
            "none": {T: 4.3, 2 * T: 4.5, 4 * T: 4.6, 8 * T: 4.6, 16 * T: 4.7},
        },
    )
    result = study.compare(
        "rope",
        against=("none",),
        seeds=5,
        corpus=str(corpus_file),
        budget="tiny",
        lengths=[T, 2 * T, 4 * T, 8 * T, 16 * T],
        train_length=T,
        out=tmp_path / "out",
        progress=False,
    )
    endpoints = {item["endpoint"]: item for item in result["endpoints"] if item.get("baseline") == "none"}
    beyond, longest = endpoints["beyond"], endpoints["longest"]
    assert beyond["ci95"][0] < 0 < beyond["ci95"][1] and beyond["p_holm"] > 0.05, beyond  # crosses zero
    assert longest["ratio_minus_1"] > 0.5 and longest["p_holm"] < 0.05, longest
    assert longest["units"] == pytest.approx(
        [
            math.log(r / n)
            for r, n in zip(
                result["perplexity"]["rope"]["last_k"][16 * T],
                result["perplexity"]["none"]["last_k"][16 * T],
                strict=True,
            )
        ]
    )
    verdict = result["verdicts"][0]
    assert "no significant difference beyond the training length on average" in verdict, verdict
    assert f"higher (worse) at the longest length, {16 * T}" in verdict, verdict
    assert "better near the training length, worse at the longest" in verdict, verdict
    report = (tmp_path / "out" / "compare.md").read_text()
    assert verdict in report and "rope vs none, at the longest length" in report


def test_compare_reports_what_each_layer_of_a_cycled_spec_got(tmp_path, corpus_file, monkeypatch):
    T = 16
    flat = {T: 4.0, 2 * T: 4.1}
    synthetic_runs(monkeypatch, {"rope,none": flat, "alibi": flat})
    study.compare(
        "rope,none",
        against=("alibi",),
        seeds=2,
        corpus=str(corpus_file),
        budget="tiny",
        n_layer=3,
        train_length=T,
        lengths=[T, 2 * T],
        out=tmp_path / "out",
        progress=False,
    )
    report = (tmp_path / "out" / "compare.md").read_text()
    assert "Encodings per layer: rope,none: layer 0 rope, layer 1 none, layer 2 rope." in report


def test_compare_trains_per_layer_specs_with_layer_options(tmp_path, corpus_file):
    """Before: `KeyError: 'rope@chunk=8'` when compare recorded the sources of a spec's encodings (issue 48's
    hybrids by their strings, and NoPE with the log-length temperature)."""
    result = study.compare(
        "rope@chunk=8,none@temp=llama4",
        against=("none@temp=log_length",),
        seeds=2,
        corpus=str(corpus_file),
        budget="tiny",
        steps=2,
        n_layer=2,
        out=tmp_path / "out",
        progress=False,
    )
    assert set(result["perplexity"]) == {"rope@chunk=8,none@temp=llama4", "none@temp=log_length"}


def test_more_seeds_for_a_compare_whose_first_seeds_are_on_disk(tmp_path, corpus_file, capsys):
    """Before: `KeyError: '64'` after all training (the lengths of runs read back were strings, fresh ones ints)."""
    options = dict(against=("alibi",), corpus=str(corpus_file), budget="tiny", steps=2, out=tmp_path / "out")
    study.compare("rope", seeds=2, progress=False, **options)
    result = study.compare("rope", seeds=3, progress=False, **options)
    assert all(len(seeds) == 3 for seeds in result["perplexity"]["rope"]["last_k"].values())
    assert json.loads((tmp_path / "out" / "compare.json").read_text())["seeds"] == 3


def test_a_rerun_without_keep_checkpoints_leaves_no_old_checkpoint_beside_the_new_run(tmp_path, corpus_file):
    options = dict(against=("alibi",), seeds=2, budget="tiny", steps=2, out=tmp_path / "out", progress=False)
    study.compare("rope", corpus=str(corpus_file), keep_checkpoints=True, **options)
    kept = sorted((tmp_path / "out" / "runs").rglob("checkpoint.pt"))
    assert len(kept) == 4
    corpus_file.write_text(TEXT.upper())  # another text: every run is trained again
    study.compare("rope", corpus=str(corpus_file), rerun=True, **options)
    assert not list((tmp_path / "out" / "runs").rglob("checkpoint.pt")), "the old text's models are still there"


# ----------------------------------------------------------------------------- settings


def test_a_rope_base_infinite_in_float32_is_refused():
    """Before: `--rope-base 1e39` trained with 7 of 8 channel pairs never turning (their frequency 0)."""
    with pytest.raises(ValueError, match=r"rope_base must be at most float32's largest number, 3\.403e\+38"):
        tiny_config(rope_base=1e39)
    tiny_config(rope_base=1e38)  # large, and finite in float32


def test_openmps_list_of_nested_levels_is_a_thread_count(monkeypatch):
    """Before: `OMP_NUM_THREADS=4,2` (valid OpenMP: 4 threads, 2 in each nested region) was refused."""
    from minidape.threads import choose_threads

    monkeypatch.delenv("MINIDAPE_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "4,2")
    assert choose_threads().threads == 4
    monkeypatch.setenv("OMP_NUM_THREADS", "four")
    with pytest.raises(ValueError, match="OMP_NUM_THREADS must be a positive integer"):
        choose_threads()


def test_an_encoder_on_next_byte_prediction_needs_allow_leakage(corpus_file):
    """Before: `train --no-causal` on a text trained and reported perplexities of a model that sees its answers."""
    data = md.load_corpus(str(corpus_file))
    with pytest.raises(
        ValueError, match=r"an encoder \(causal False\) on next-token prediction.*or pass allow_leakage=True"
    ):
        md.train(tiny_config(vocab_size=256, causal=False), data, steps=1, batch_size=2, progress=False)
    with pytest.warns(UserWarning, match=r"an encoder \(causal False\) on next-token prediction"):
        md.train(
            tiny_config(vocab_size=256, causal=False), data, steps=1, batch_size=2, progress=False, allow_leakage=True
        )


def test_an_encoders_perplexity_is_flagged_by_eval(tmp_path, corpus_file, capsys):
    run = tmp_path / "leaky"
    flags = ["--n-layer", "1", "--n-embd", "8", "--n-head", "2", "--block-size", "8", "--no-causal"]
    with pytest.raises(SystemExit):  # refused without --allow-leakage
        main(["train", *flags, "--steps", "1", "--batch-size", "2", "--corpus", str(corpus_file), "--out", str(run)])
    assert "--no-causal" in capsys.readouterr().err
    main(
        [
            "train",
            *flags,
            "--steps",
            "1",
            "--batch-size",
            "2",
            "--corpus",
            str(corpus_file),
            "--out",
            str(run),
            "--allow-leakage",
        ]
    )
    main(["eval", str(run), "--lengths", "8", "16", "--n-windows", "2", "--last-k", "8"])
    assert f"warning: {run} is an encoder (causal=False)" in capsys.readouterr().err


def test_the_leak_refusal_names_the_encoding_when_there_is_no_refiner(corpus_file):
    """Before: "fix the refiner" for a leaking encoding and refiner none."""

    class ReadsTheNextKey(md.DataDependentBias):
        def __init__(self, cfg):
            super().__init__()

        def forward(self, x, q, k, first_query=0):
            nxt = torch.roll(k, -1, dims=2)  # key j+1 read at cell j: the future
            return torch.einsum("bhid,bhjd->bhij", q, nxt) * 0.0 + nxt.sum(-1)[:, :, None, :]

    md.register_pe("round5_leaks")(ReadsTheNextKey)
    with pytest.raises(ValueError, match="reads the future.*; fix the encoding, or pass allow_leakage"):
        md.train(
            tiny_config(vocab_size=256, pe="round5_leaks"),
            md.load_corpus(str(corpus_file)),
            steps=1,
            batch_size=2,
            progress=False,
        )


# ----------------------------------------------------------------------------- the gradebook's CSVs


def graded_batch(folder) -> Path:
    from minidape.classroom import gradebook

    grades = folder / "grades.csv"
    rows = [
        ["ada", "03_rope", "3.1", "2", "2", "True", "", ""],
        ["ada", "03_rope", "3.2", "1", "3", "False", "", ""],
    ]
    grades.write_text(gradebook._csv_text(gradebook.COLUMNS, rows), encoding="utf-8")
    written = [["ada", "03_rope", "3.3 why", "because", "", "1", "2"]]
    gradebook.written_path(grades).write_text(gradebook._csv_text(gradebook.WRITTEN_COLUMNS, written), encoding="utf-8")
    return grades


def test_a_nan_in_the_grades_is_refused_naming_the_line(tmp_path):
    """Before: `nan` totals and exit code 0."""
    from minidape.classroom import gradebook

    grades = graded_batch(tmp_path)
    grades.write_text(grades.read_text().replace("ada,03_rope,3.2,1,", "ada,03_rope,3.2,nan,"))
    with pytest.raises(ValueError, match=r"grades.csv line 3: points 'nan' is not a number"):
        gradebook.gradebook(grades)
    assert not gradebook.sibling(grades, "totals").exists()


@pytest.mark.parametrize("save", ["utf-8-sig", "semicolons"])
def test_a_written_answers_csv_saved_by_a_spreadsheet_is_read(tmp_path, save):
    """Before: `KeyError: 'student'` (the byte-order mark glued to the first column's name; `;` one column)."""
    from minidape.classroom import gradebook

    grades = graded_batch(tmp_path)
    written = gradebook.written_path(grades)
    text = written.read_text()
    if save == "semicolons":  # a spreadsheet where ',' is the decimal comma
        text = text.replace(",", ";").replace(";1;2", ";1,5;2")
    written.write_text(text, encoding="utf-8-sig" if save == "utf-8-sig" else "utf-8")
    gradebook.gradebook(grades)
    totals = gradebook.sibling(grades, "totals").read_text()
    assert ("4.5" if save == "semicolons" else "4") in totals, totals


def test_a_windows_1252_csv_is_refused_naming_the_file(tmp_path):
    from minidape.classroom import gradebook

    grades = graded_batch(tmp_path)
    written = gradebook.written_path(grades)
    written.write_bytes(written.read_text().replace("because", "parce que c'était").encode("cp1252"))
    with pytest.raises(ValueError, match=r"grades-written.csv is not UTF-8 text .*save it .* as 'CSV UTF-8'"):
        gradebook.gradebook(grades)


def test_a_full_disk_under_the_gradebook_names_the_file(tmp_path, monkeypatch):
    from minidape.classroom import gradebook

    grades = graded_batch(tmp_path)

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gradebook.os, "fsync", full)
    with pytest.raises(OSError, match=r"grades-totals.csv not written: No space left on device"):
        gradebook.gradebook(grades)


# ----------------------------------------------------------------------------- NaN weights, broken files


def test_cope_with_a_nan_weight_is_one_clear_error():
    """Before: "index -9223372036854775808 is out of bounds" from CoPE's gather."""
    model = md.GPT(tiny_config(pe="cope"))
    with torch.no_grad():
        model.blocks[0].attn.c_attn.weight[0, 0] = float("nan")
    with pytest.raises(FloatingPointError, match="pe='cope': its positions are NaN"):
        model(torch.zeros(1, 8, dtype=torch.long))


@pytest.mark.parametrize("pe", ["cope", "fox"])
def test_a_checkpoint_with_a_nan_weight_is_refused_naming_the_file_and_tensor(tmp_path, pe):
    """Before: CoPE's out-of-bounds index; FoX evaluated to `n/a` with no reason."""
    from minidape.lab.checkpoints import load_checkpoint, save_checkpoint

    model = md.GPT(tiny_config(pe=pe))
    with torch.no_grad():
        model.blocks[0].mlp.c_fc.weight[1, 1] = float("nan")
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, model, step=1, history=[])
    with pytest.raises(ValueError, match=r"checkpoint.pt: 1 of its weight tensors hold NaN or inf \(first: blocks"):
        load_checkpoint(path)


def test_a_truncated_references_file_is_named(tmp_path):
    from minidape.classroom import grade

    path = tmp_path / "references.json"
    path.write_text('{"quick": {"4.4": {"ratio": 2.5')
    with pytest.raises(ValueError, match=r"references.json is not whole JSON .*run `make notebooks` again"):
        grade.references(path)


def test_eval_on_a_corpus_outside_the_models_vocabulary_names_both(tmp_path, corpus_file, capsys):
    """Before: "tokens must lie in [0, vocab_size=64)", naming neither the checkpoint nor the corpus."""
    digits = tmp_path / "digits.txt"  # bytes 32 and 48-57: within a vocabulary of 64
    digits.write_text("0123456789 " * 200)
    run = tmp_path / "run"
    flags = ["--vocab-size", "64", "--n-layer", "1", "--n-embd", "8", "--n-head", "2", "--block-size", "8"]
    main(["train", *flags, "--steps", "1", "--batch-size", "2", "--corpus", str(digits), "--out", str(run)])
    with pytest.raises(SystemExit) as stopped:
        main(["eval", str(run), "--corpus", str(corpus_file), "--lengths", "8"])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert stopped.value.code == 2
    assert f"{run} reads tokens below vocab_size=64, but corpus {corpus_file}'s validation split" in error, error


def test_a_full_disk_under_handout_says_so(tmp_path, monkeypatch):
    """Before: pip's last line, "Failed to build one or more wheels"."""
    from minidape.classroom import handout

    said = "ERROR: [Errno 28] No space left on device\nerror: Failed to build one or more wheels\n"
    monkeypatch.setattr(handout.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, "", said))
    with pytest.raises(OSError, match="building the wheel failed: no space left on device"):
        handout.build_wheel(tmp_path)


class ReturnsOneColumn(torch.nn.Module):
    """A refiner whose output broadcasts over the keys: (batch, nh, Tq, 1)."""

    row_local = True  # the fast path runs it in query blocks: its own forward, checked there too

    def __init__(self, cfg):
        super().__init__()

    def forward(self, scores, bias, mask):
        return scores[..., :1]


@pytest.mark.parametrize("fast", [True, False], ids=["fast path", "model.py's form"])
def test_a_refiner_returning_another_shape_is_refused_not_broadcast(fast):
    """Before: the (..., 1) scores broadcast over every key and the model trained on them."""
    md.register_refiner("round5_one_column")(ReturnsOneColumn)
    model = md.GPT(tiny_config(pe="alibi", refiner="round5_one_column", fast=fast))
    with pytest.raises(ValueError, match=r"refiner ReturnsOneColumn returned shape \(1, 2, 8, 1\), torch.float32"):
        model(torch.zeros(1, 8, dtype=torch.long))


def test_a_fox_training_step_too_large_for_memory_is_refused_before_it_starts(corpus_file, monkeypatch):
    """Before: FoX's (batch, n_head, T, T) bias was not counted: the allocator's error in the middle of the step."""
    from minidape.lab import memory

    monkeypatch.setattr(memory, "available_memory", lambda device: 2**30)
    cfg = md.GPTConfig(n_layer=1, n_head=4, n_embd=32, block_size=4096, pe="fox")
    with pytest.raises(MemoryError, match=r"a training step of 16 x 4096 tokens \(fox, 1 layers, 4 heads\) needs"):
        md.train(cfg, md.load_corpus("austen"), steps=1, batch_size=16, progress=False)
    assert memory.memory_estimate(cfg, 16, 4096, True, torch.device("cpu")) > 2**30
    assert (
        memory.memory_estimate(md.GPTConfig(**{**vars(cfg), "pe": "alibi"}), 16, 4096, True, torch.device("cpu"))
        < 2**30
    )


def test_a_model_with_a_nan_weight_is_not_evaluated_to_a_silent_nan():
    """Before: FoX with a NaN weight evaluated to NaN ("n/a" in the table) with no reason."""
    model = md.GPT(tiny_config(pe="fox"))
    with torch.no_grad():
        model.blocks[0].mlp.c_fc.weight[1, 1] = float("nan")
    tokens = torch.randint(0, 32, (400,), generator=torch.Generator().manual_seed(0))
    with pytest.warns(UserWarning, match="length 8: perplexity nan: the model's outputs are not finite"):
        md.evaluate.perplexity_by_length(model, tokens, [8], last_k=4, n_windows=2)


def test_training_after_an_evaluation_in_inference_mode_runs():
    """Before: RoPE's fast path kept a table made under `torch.inference_mode` (an evaluation), and every training
    step after it in the process failed ("Inference tensors cannot be saved for backward")."""
    from minidape import fast_encodings

    fast_encodings.pair_order.cache_clear()
    cfg = tiny_config(pe="rope", n_head=2, n_embd=16)
    with torch.inference_mode():
        md.GPT(cfg)(torch.zeros(1, 8, dtype=torch.long))
    _, loss = md.GPT(cfg)(torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 8, dtype=torch.long))
    loss.backward()
