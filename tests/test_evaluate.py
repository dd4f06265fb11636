"""Evaluation protocols and per-position loss against plain computations; extrapolation plots and tables."""

import math
import os

import matplotlib.pyplot as plt
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import minidape as md
from minidape.lab.data import fixed_windows


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def tokens():
    return md.load_corpus("austen", "val")[:6000]


def tiny_model(**overrides) -> md.GPT:
    """A fixed, untrained model: a known function of its input, good enough to check the bookkeeping."""
    torch.manual_seed(0)
    return md.GPT(
        md.GPTConfig(**{"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 16, "pe": "alibi", **overrides})
    ).eval()


def losses_of(model, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Plain per-token cross-entropy of one forward pass: `(B, T)`."""
    with torch.no_grad():
        logits, _ = model(inputs.long())
    return F.cross_entropy(logits.transpose(1, 2), targets.long(), reduction="none")


def last_k_by_hand(model, tokens, lengths, last_k, n_windows, seed):
    """The last_k protocol written out: windows ending at the same drawn positions, their last k scored."""
    scored = min(last_k, min(lengths))
    ends = md.evaluate.scored_ends(len(tokens), max(lengths), scored, n_windows, seed)
    result = {}
    for length in lengths:
        windows = torch.stack([tokens[end - length : end + 1] for end in ends.tolist()])
        result[length] = losses_of(model, windows[:, :-1], windows[:, 1:])[:, -scored:].mean().exp().item()
    return result


def test_last_k_scores_the_same_tokens_at_every_length(tokens):
    model = tiny_model()
    lengths = [8, 40, 24]
    result = md.evaluate.perplexity_by_length(model, tokens, lengths, last_k=10, n_windows=5, seed=3)
    assert result == pytest.approx(last_k_by_hand(model, tokens, lengths, 10, 5, 3), rel=1e-5)
    # k = min(last_k, shortest length): 8 here; with longer lengths all of last_k is scored
    result = md.evaluate.perplexity_by_length(model, tokens, [16, 32], last_k=10, n_windows=5, seed=3)
    assert result == pytest.approx(last_k_by_hand(model, tokens, [16, 32], 10, 5, 3), rel=1e-5)


def test_scored_stretches_are_disjoint_seeded_and_leave_room_for_the_longest_window():
    ends = md.evaluate.scored_ends(1000, longest=100, scored=30, n_windows=12, seed=1)
    assert torch.equal(ends, md.evaluate.scored_ends(1000, 100, 30, 12, seed=1))
    assert not torch.equal(ends, md.evaluate.scored_ends(1000, 100, 30, 12, seed=2))
    assert len(set(ends.tolist())) == 12 and ends.min() >= 100 and ends.max() <= 999
    assert bool((ends.diff() >= 30).all())  # no token is scored twice
    assert md.evaluate.scored_ends(131, 100, 30, 2, seed=0).tolist() == [100, 130]  # every candidate taken
    with pytest.raises(ValueError, match="hold 2 disjoint stretches of 30 scored tokens"):
        md.evaluate.scored_ends(131, 100, 30, 3)


class ContextFree(nn.Module):
    """A bigram model: its prediction depends only on the current token (log bigram frequencies of Austen's
    training split), so its perplexity over a fixed set of scored tokens cannot depend on the context length."""

    def __init__(self):
        super().__init__()
        train = md.load_corpus("austen", "train")[:200_000].long()
        counts = torch.ones(256, 256).index_put_((train[:-1], train[1:]), torch.ones(len(train) - 1), accumulate=True)
        self.log_probs = nn.Parameter((counts / counts.sum(1, keepdim=True)).log())

    def forward(self, idx, targets=None):
        return self.log_probs[idx], None


@pytest.mark.parametrize("protocol", md.evaluate.PROTOCOLS)
def test_a_context_free_model_has_a_flat_curve(protocol):
    """Every length scores the same tokens, so a model that ignores its context gives one number at every
    length: a curve shows length, not which text was scored."""
    tokens = md.load_corpus("austen", "val")
    lengths = [64, 128, 256, 512, 1024]
    options = dict(n_tokens=20_000) if protocol == "nonoverlap" else dict(n_windows=32)
    curve = md.evaluate.perplexity_by_length(ContextFree(), tokens, lengths, protocol=protocol, **options)
    assert 2 < curve[64] < 50  # a real (bigram) model, not a constant
    assert max(curve.values()) == pytest.approx(min(curve.values()), rel=1e-6)


def test_nonoverlap_scores_every_token_of_one_stretch_at_every_length(tokens):
    model = tiny_model()
    result = md.evaluate.perplexity_by_length(model, tokens, [20, 64], protocol="nonoverlap", n_tokens=1000)
    for length in (20, 64):
        losses = []
        for start in range(0, 1000, length):  # windows of `length` inputs; 64 ends with one of 1000 % 64 = 40
            window = tokens[start : min(start + length, 1000) + 1][None]
            losses.append(losses_of(model, window[:, :-1], window[:, 1:]))
        scored = torch.cat(losses, dim=1)
        assert scored.shape == (1, 1000)
        assert result[length] == pytest.approx(scored.mean().exp().item(), rel=1e-5)


def test_protocols_differ_and_batching_changes_nothing(tokens):
    model = tiny_model(pe="kerple_log", refiner="dape", refiner_width=8)
    lengths = [16, 48]
    for protocol, options in (("last_k", dict(last_k=8, n_windows=6)), ("nonoverlap", dict(n_tokens=500))):
        one_big = md.evaluate.perplexity_by_length(model, tokens, lengths, protocol=protocol, **options)
        many_small = md.evaluate.perplexity_by_length(
            model, tokens, lengths, protocol=protocol, **options, max_batch_tokens=20
        )
        assert many_small == pytest.approx(one_big, rel=1e-5)
    last_k = md.evaluate.perplexity_by_length(model, tokens, lengths, last_k=8, n_windows=6)
    nonoverlap = md.evaluate.perplexity_by_length(model, tokens, lengths, protocol="nonoverlap", n_tokens=500)
    assert last_k[48] != pytest.approx(nonoverlap[48], rel=1e-3)


def test_loss_by_position_is_the_mean_loss_at_each_position(tokens):
    model = tiny_model(pe="rope")
    curve = md.evaluate.loss_by_position(model, tokens, 24, n_windows=7, seed=2)
    windows = fixed_windows(tokens, 25, 7, seed=2)
    expected = losses_of(model, windows[:, :-1], windows[:, 1:]).mean(dim=0)
    assert curve.shape == (24,)
    assert torch.allclose(curve, expected, atol=1e-5)


def test_sixteen_times_the_training_length(tokens):
    model = tiny_model(pe="kerple_log", refiner="conv", refiner_width=8)
    lengths = [model.cfg.block_size, 16 * model.cfg.block_size]
    result = md.evaluate.perplexity_by_length(model, tokens, lengths, last_k=32, n_windows=2)
    assert result == pytest.approx(last_k_by_hand(model, tokens, lengths, 32, 2, 0), rel=1e-5)
    assert md.evaluate.loss_by_position(model, tokens, lengths[-1], n_windows=1).shape == (lengths[-1],)


def test_learned_positions_give_nan_beyond_their_table(tokens):
    model = tiny_model(pe="learned")
    with pytest.warns(UserWarning, match="length 32 skipped"):
        result = md.evaluate.perplexity_by_length(model, tokens, [16, 32], n_windows=2)
    assert math.isfinite(result[16]) and math.isnan(result[32])


def test_evaluation_restores_the_training_mode(tokens):
    model = tiny_model(dropout=0.5).train()
    first = md.evaluate.perplexity_by_length(model, tokens, [16], n_windows=3)
    assert model.training
    assert md.evaluate.perplexity_by_length(model, tokens, [16], n_windows=3) == first  # no dropout inside


def test_bad_input_is_named(tokens):
    model = tiny_model()
    evaluate = md.evaluate.perplexity_by_length
    with pytest.raises(ValueError, match="unknown protocol 'sliding'; valid choices: last_k, nonoverlap"):
        evaluate(model, tokens, [16], protocol="sliding")
    with pytest.raises(ValueError, match="length must be a positive integer, got 0"):
        evaluate(model, tokens, [16, 0])
    with pytest.raises(ValueError, match="lengths is empty"):
        evaluate(model, tokens, [])
    with pytest.raises(ValueError, match="last_k must be a positive integer"):
        evaluate(model, tokens, [16], last_k=-1)
    with pytest.raises(TypeError, match="1-D integer tensor"):
        evaluate(model, tokens.float(), [16])
    with pytest.raises(ValueError, match="vocab_size=256"):
        evaluate(model, torch.full((100,), 999), [16])
    with pytest.raises(ValueError, match="hold no window of length 64"):
        evaluate(model, tokens[:50], [64], protocol="nonoverlap")
    with pytest.raises(ValueError, match="n_tokens=6000 predictions asked for, but 6000 tokens hold 5999"):
        evaluate(model, tokens, [64], protocol="nonoverlap", n_tokens=6000)
    with pytest.raises(ValueError, match="n_tokens=500 applies to protocol='nonoverlap' only"):
        evaluate(model, tokens, [64], n_tokens=500)
    with pytest.raises(ValueError, match="need windows of 65 tokens"):
        evaluate(model, tokens[:50], [64])
    with pytest.raises(ValueError, match="length must be a positive integer"):
        md.evaluate.loss_by_position(model, tokens, 0)


# ----------------------------------------------------------------------------- plots and tables

RESULTS = {"ALiBi": {128: 4.5, 512: 4.75, 2048: 5.0}, "RoPE": {128: 4.0, 512: 9.5, 2048: math.nan}}


def test_plot_extrapolation_has_log_axes_and_the_training_length(tmp_path):
    fig = md.plots.plot_extrapolation(RESULTS, train_length=128, path=tmp_path / "curve.png")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    curves = {line.get_label(): line for line in ax.get_lines()}
    assert list(curves["ALiBi"].get_xdata()) == [128, 512, 2048]
    assert list(curves["ALiBi"].get_ydata()) == [4.5, 4.75, 5.0]
    assert list(curves["RoPE"].get_xdata()) == [128, 512]  # NaN (cannot run) is left out
    vertical = curves["training length 128"]
    assert list(vertical.get_xdata()) == [128, 128]
    assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title() and ax.get_legend() is not None
    assert os.listdir(tmp_path) == ["curve.png"] and (tmp_path / "curve.png").stat().st_size > 1000


def test_markdown_table_holds_the_numbers():
    table = md.plots.markdown_table(RESULTS, train_length=128, digits=2)
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.strip().splitlines()]
    assert rows[0] == ["model", "128 (train)", "512", "2048"]
    assert set(rows[1][1:]) == {"---:"}
    body = {row[0]: row[1:] for row in rows[2:]}
    assert body["ALiBi"] == ["4.50", "**4.75**", "**5.00**"]  # the best model at each length in bold
    assert body["RoPE"] == ["**4.00**", "9.50", "n/a"]


def test_loss_by_position_and_bias_plots():
    fig = md.plots.plot_loss_by_position({"a": torch.arange(1.0, 33.0)}, train_length=16)
    (curve, vertical) = fig.axes[0].get_lines()
    assert list(curve.get_xdata()) == list(range(1, 33)) and list(vertical.get_xdata()) == [16, 16]
    fig = md.plots.plot_bias(torch.randn(4, 8, 8), heads=[0, 3])
    assert [ax.get_title() for ax in fig.axes[:2]] == ["head 0", "head 3"]
    with pytest.raises(ValueError, match="heads must be a non-empty selection of 0..3"):
        md.plots.plot_bias(torch.randn(4, 8, 8), heads=[4])
    with pytest.raises(ValueError, match="give it a suffix"):
        md.plots.plot_extrapolation(RESULTS, path="curve_without_suffix")
