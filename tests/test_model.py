"""The core model in its reference form: causality, each refiner's equation, every encoding's maths, bad input.
The fast path is checked against this reference in test_fast.py."""

import copy
import itertools
import math

import pytest
import torch
import torch.nn as nn

import minidape as md
from minidape import model as M

BUILTIN_PES = [
    "none",
    "learned",
    "sinusoidal",
    "rope",
    "yarn",
    "t5",
    "alibi",
    "kerple_log",
    "kerple_power",
    "fire",
    "rope_pi",
    "rope_ntk",
    "xpos",
    "hope",
    "fox",
    "cope",
    "stick_breaking",
    "path",
]
BUILTIN_REFINERS = ["none", "dape", "dape_concat", "dape_add", "cape", "conv"]


def valid_combination(pe: str, refiner: str, causal: bool = True) -> bool:
    """GPTConfig refuses a refiner, and an encoder, on an encoding that computes its own attention weights (PaTH,
    stick-breaking): there are no softmax logits to refine."""
    return not issubclass(M.PE_REGISTRY[pe], M.AttentionWeights) or (refiner == "none" and causal)


BUILTIN_COMBINATIONS = [pair for pair in itertools.product(BUILTIN_PES, BUILTIN_REFINERS) if valid_combination(*pair)]


def tiny(**kw):
    base = dict(vocab_size=64, n_layer=2, n_head=4, n_embd=32, block_size=16)
    base.update(kw)
    return md.GPTConfig(**base)


def test_registries_list_every_builtin_name():
    assert set(BUILTIN_PES) <= set(md.PE_NAMES)
    assert set(BUILTIN_REFINERS) <= set(md.REFINER_NAMES)


# ---------------------------------------------------------------------------------------------- causality


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("pe,refiner", BUILTIN_COMBINATIONS)
def test_every_builtin_combination_is_causal(pe, refiner, fast):
    # attn_chunk=7 forces several query blocks on the fast path, so block boundaries are exercised too;
    # beyond block_size=16 where the PE allows
    cfg = tiny(pe=pe, refiner=refiner, attn_chunk=7, fast=fast)
    assert md.check_causal(cfg, length=16 if pe == "learned" else 40)


@pytest.mark.parametrize(
    "pe,refiner", [("kerple_log", "dape"), ("alibi", "conv"), ("rope", "none"), ("t5", "dape_add"), ("fire", "none")]
)
def test_an_encoder_sees_the_future_and_check_causal_says_so(pe, refiner):
    torch.manual_seed(0)
    model = md.GPT(tiny(pe=pe, refiner=refiner, causal=False)).train()
    assert not md.check_causal(model)
    assert model.training  # returned to the mode it was in
    idx = torch.randint(0, 64, (1, 24))
    changed = idx.clone()
    changed[0, -1] = (idx[0, -1] + 1) % 64
    with torch.no_grad():
        assert (model.eval()(idx)[0][0, 0] - model(changed)[0][0, 0]).abs().max() > 1e-5


@pytest.mark.parametrize("fast", [True, False])
def test_check_causal_catches_a_user_refiner_that_reads_the_next_key(fast):
    name = "peeks_ahead"

    @md.register_refiner(name)
    class PeekNextKey(nn.Module):
        """Scores shifted one key left: cell (i, j) gets the score of key j + 1 -- the future at j = i."""

        def __init__(self, cfg):
            super().__init__()

        def forward(self, scores, bias, mask):
            shifted = torch.cat([scores[..., 1:], scores[..., -1:]], dim=-1)
            return shifted if bias is None else shifted + bias

    assert not md.check_causal(tiny(pe="alibi", refiner=name, fast=fast))
    assert not md.check_causal(md.GPT(tiny(pe="rope", refiner=name, fast=fast, attn_chunk=5)), length=30)


def test_check_causal_leaves_a_model_as_it_was():
    model = md.GPT(tiny(pe="kerple_log", refiner="conv")).train()
    before = {name: value.clone() for name, value in model.state_dict().items()}
    assert md.check_causal(model)
    assert model.training and all(p.dtype == torch.float32 for p in model.parameters())
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_check_causal_leaves_the_global_random_state_alone_and_refuses_bad_input():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    assert md.check_causal(tiny(pe="kerple_log", refiner="dape"))
    torch.testing.assert_close(torch.rand(3), expected)
    with pytest.raises(TypeError, match="GPT or a GPTConfig"):
        md.check_causal("dape")
    with pytest.raises(ValueError, match="length >= 2"):
        md.check_causal(tiny(), length=1)


# ---------------------------------------------------------------------------------------------- refiners


def random_inputs(batch=2, h=4, T=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(batch, h, T, T, generator=g, dtype=torch.float64)
    bias = torch.randn(h, T, T, generator=g, dtype=torch.float64)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    return scores, bias, mask


def refiner_for(name, pe="kerple_log", **kw):
    torch.manual_seed(3)
    return M.REFINER_REGISTRY[name](tiny(pe=pe, refiner=name, **kw)).double()


CELLS = [(0, 0), (5, 2), (8, 8), (3, 7), (2, 6)]  # visible and masked (future) cells


def test_dape_is_s_plus_b_plus_an_mlp_over_the_heads_at_each_cell():
    scores, bias, mask = random_inputs()
    refiner = refiner_for("dape")
    mlp = refiner.f.mlp
    assert (mlp[0].in_features, mlp[0].out_features, mlp[2].out_features) == (8, 32, 4)
    assert isinstance(mlp[1], nn.LeakyReLU) and mlp[1].negative_slope == 0.01
    refined = refiner(scores, bias, mask)
    for i, j in CELLS:
        stacked = torch.cat([scores[:, :, i, j], bias[:, i, j].expand(2, -1)], dim=1)  # [S, B] at (i, j): (2, 8)
        torch.testing.assert_close(refined[:, :, i, j], scores[:, :, i, j] + bias[:, i, j] + mlp(stacked))


def test_dape_without_bias_reads_the_head_scores_only():
    scores, _, mask = random_inputs()
    refiner = refiner_for("dape", pe="rope")
    assert refiner.f.mlp[0].in_features == 4
    refined = refiner(scores, None, mask)
    for i, j in CELLS:
        torch.testing.assert_close(refined[:, :, i, j], scores[:, :, i, j] + refiner.f.mlp(scores[:, :, i, j]))


def test_dape_concat_and_add_follow_their_equations():
    scores, bias, mask = random_inputs()
    concat, add = refiner_for("dape_concat"), refiner_for("dape_add")
    assert add.f.mlp[0].in_features == 4
    out_concat, out_add = concat(scores, bias, mask), add(scores, bias, mask)
    for i, j in CELLS:
        s, b = scores[:, :, i, j], bias[:, i, j]
        torch.testing.assert_close(out_concat[:, :, i, j], s + concat.f.mlp(torch.cat([s, b.expand(2, -1)], 1)))
        torch.testing.assert_close(out_add[:, :, i, j], s + b + add.f.mlp(s + b))


def test_cape_is_dape():
    assert M.REFINER_REGISTRY["cape"] is M.REFINER_REGISTRY["dape"]
    assert "CAPE" in M.REFINER_REGISTRY["cape"].__doc__
    scores, bias, mask = random_inputs()
    torch.testing.assert_close(refiner_for("cape")(scores, bias, mask), refiner_for("dape")(scores, bias, mask))


def conv_row_by_hand(refiner, scores, bias, i, causal):
    """Row i of S + B + conv2(LeakyReLU(conv1(tril([S, B])))), each 1 x kernel convolution written as its sum
    over taps, zero outside the row: out[:, j] = b + sum_t W[:, :, t] x[:, j + t - kernel // 2]."""
    batch, T = scores.shape[0], scores.shape[-1]
    row = torch.cat([scores[:, :, i], bias[:, i].expand(batch, -1, -1)], dim=1)  # (batch, 2h, T)
    if causal:
        row = row.clone()
        row[..., i + 1 :] = 0  # tril: keys after i are zeroed

    def conv_by_taps(conv, x):
        kernel = conv.weight.shape[-1]
        out = conv.bias[None, :, None].repeat(batch, 1, T)
        for j in range(T):
            for t in range(kernel):
                source = j + t - kernel // 2
                if 0 <= source < T:
                    out[:, :, j] += x[:, :, source] @ conv.weight[:, :, 0, t].T
        return out

    hidden = torch.nn.functional.leaky_relu(conv_by_taps(refiner.conv1, row), 0.01)
    return scores[:, :, i] + bias[:, i] + conv_by_taps(refiner.conv2, hidden)


@pytest.mark.parametrize("kernel", [1, 3, 5])
def test_conv_is_tril_then_two_key_axis_convolutions(kernel):
    scores, bias, mask = random_inputs(T=11)
    refiner = refiner_for("conv", refiner_kernel=kernel)
    assert refiner.conv1.in_channels == 8 and refiner.conv2.out_channels == 4
    refined = refiner(scores, bias, mask)
    for i in (0, 4, 10):
        torch.testing.assert_close(refined[:, :, i], conv_row_by_hand(refiner, scores, bias, i, causal=True))


def test_conv_in_an_encoder_zeroes_nothing():
    """causal=False: every cell is visible, so no tril -- the upper triangle feeds the convolution too."""
    scores, bias, _ = random_inputs(T=8)
    refiner = refiner_for("conv", causal=False)
    everywhere = torch.ones(8, 8, dtype=torch.bool)
    refined = refiner(scores, bias, everywhere)
    for i in (0, 3, 7):
        torch.testing.assert_close(refined[:, :, i], conv_row_by_hand(refiner, scores, bias, i, causal=False))
    assert "encoder" in M.ConvRefiner.__doc__ and "tril" in M.ConvRefiner.__doc__


def test_conv_without_tril_would_leak_but_ours_does_not():
    scores, bias, mask = random_inputs(T=10)
    refiner = refiner_for("conv")
    future = scores.clone()
    future[..., 3, 4:] += 10.0  # row 3's masked (future) entries
    out_a, out_b = refiner(scores, bias, mask), refiner(future, bias, mask)
    torch.testing.assert_close(out_a[..., 3, :4], out_b[..., 3, :4])
    unmasked = torch.ones_like(mask)  # the paper's "cheating" run: no tril
    cheating = refiner(scores, bias, unmasked) - refiner(future, bias, unmasked)
    assert cheating[..., 3, :4].abs().max() > 1e-3


def test_attention_is_softmax_of_the_masked_refined_scores_times_v():
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, 4, 6, 8, dtype=torch.float64).unbind(0)
    bias, mask = torch.randn(4, 6, 6, dtype=torch.float64), torch.ones(6, 6, dtype=torch.bool).tril()
    y, pieces = M.attention(q, k, v, bias, mask)
    S = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(8)
    for i in range(6):  # row i: softmax over keys j <= i
        weights = torch.softmax(S[:, :, i, : i + 1] + bias[:, i, : i + 1], dim=-1)
        torch.testing.assert_close(y[:, :, i], torch.einsum("bhj,bhjd->bhd", weights, v[:, :, : i + 1]))
    torch.testing.assert_close(pieces["refined"], torch.where(mask, S + bias, S))  # B counts as 0 where masked
    assert pieces["probs"][..., 0, 1:].abs().max() == 0


# ---------------------------------------------------------------------------------------------- hard windows


def register_window_pe(name, width, future=0.0):
    """A bias of 0 within `width` keys of the query, -inf beyond (a hard window), `future` on masked cells."""

    @md.register_pe(name)
    class Window(md.AdditiveBias):
        def __init__(self, cfg):
            super().__init__()
            self.scale = nn.Parameter(torch.full((cfg.n_head,), -0.1))

        def forward(self, q_pos, k_pos):
            d = (q_pos[:, None] - k_pos[None, :]).float()
            bias = self.scale[:, None, None] * d.clamp(min=0)
            bias = bias.masked_fill(d >= width, float("-inf"))
            return bias.masked_fill(d < 0, future)

    return name


@pytest.mark.parametrize("refiner", BUILTIN_REFINERS)
@pytest.mark.parametrize("fast", [True, False])
def test_a_minus_inf_bias_is_a_hard_window_with_every_refiner(refiner, fast):
    name = "window"
    register_window_pe(name, width=4)
    torch.manual_seed(0)
    model = md.GPT(tiny(pe=name, refiner=refiner, fast=fast, attn_chunk=6))
    idx = torch.randint(0, 64, (2, 20))
    _, loss = model(idx, idx)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert model.pe.scale.grad.abs().sum() > 0
    probs = model.attention_maps(idx, layer=1)["probs"]
    far = torch.arange(20)[:, None] - torch.arange(20)[None, :] >= 4
    assert probs[..., far].abs().max() == 0 and probs[..., ~far].sum() > 0  # never attends beyond the window


@pytest.mark.parametrize("refiner", BUILTIN_REFINERS)
@pytest.mark.parametrize("fast", [True, False])
def test_whatever_a_bias_holds_on_masked_cells_changes_nothing(refiner, fast):
    """NaN (or anything) on masked future cells: the same output and gradients as 0 there."""
    names = [
        register_window_pe(f"future_{value}", width=1000, future=value)
        for value in (0.0, float("nan"), float("inf"), 1e30)
    ]
    torch.manual_seed(0)
    models = [md.GPT(tiny(pe=name, refiner=refiner, fast=fast, attn_chunk=6)) for name in names]
    for other in models[1:]:
        other.load_state_dict(models[0].state_dict())
    idx = torch.randint(0, 64, (2, 20))
    results = []
    for model in models:
        logits, loss = model(idx, idx)
        loss.backward()
        results.append((logits, [p.grad for p in model.parameters()]))
    for logits, grads in results[1:]:
        torch.testing.assert_close(logits, results[0][0])
        for got, expected in zip(grads, results[0][1]):
            torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("fast", [True, False])
def test_nan_or_plus_inf_where_a_query_may_attend_is_an_error_naming_the_pe(value, fast):
    name = "bad_value"

    @md.register_pe(name)
    class Broken(md.AdditiveBias):
        def __init__(self, cfg):
            super().__init__()

        def forward(self, q_pos, k_pos):
            bias = torch.zeros(4, len(q_pos), len(k_pos))
            bias[:, q_pos >= 5, 2] = value  # visible: queries from 5 on may attend to key 2
            return bias

    model = md.GPT(tiny(pe=name, refiner="dape", fast=fast))
    with pytest.raises(ValueError, match=rf"pe='{name}' returned a bias of {value} at head 0, query 5, key 2"):
        model(torch.zeros(1, 10, dtype=torch.long))


def test_a_row_with_every_key_at_minus_inf_is_an_error():
    name = "test_blind_row"

    @md.register_pe(name)
    class Blind(md.AdditiveBias):
        def __init__(self, cfg):
            super().__init__()

        def forward(self, q_pos, k_pos):
            return torch.zeros(4, len(q_pos), len(k_pos)).masked_fill(q_pos[:, None] == 3, float("-inf"))

    with pytest.raises(ValueError, match=rf"pe='{name}' returned -inf at every key that query 3 may attend to"):
        md.GPT(tiny(pe=name))(torch.zeros(1, 8, dtype=torch.long))


# ---------------------------------------------------------------------------------------------- encodings


def test_rope_scores_depend_only_on_relative_position():
    cfg = tiny(pe="rope")
    rope = M.RotaryEmbedding(cfg)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 12, 8, generator=g), torch.randn(1, 1, 12, 8, generator=g)
    pos = torch.arange(12)

    def scores(offset):
        cos, sin = rope(pos + offset, 12)
        return M.apply_rotary(q, cos, sin) @ M.apply_rotary(k, cos, sin).transpose(-2, -1)

    torch.testing.assert_close(scores(0), scores(1000), atol=1e-3, rtol=1e-4)
    # without the rotation the "same" shift would be meaningless; with it, positions do matter:
    cos, sin = rope(pos, 12)
    assert (scores(0) - q @ k.transpose(-2, -1)).abs().max() > 1e-2


def test_rope_preserves_norms():
    cfg = tiny(pe="rope")
    cos, sin = M.RotaryEmbedding(cfg)(torch.arange(20) * 7, 20)
    x = torch.randn(2, 4, 20, 8)
    torch.testing.assert_close(M.apply_rotary(x, cos, sin).norm(dim=-1), x.norm(dim=-1))


@pytest.mark.parametrize("n_head", [8, 12, 6])
def test_alibi_slopes_follow_the_geometric_rule(n_head):
    def geometric(n):
        return [2 ** (-8 * h / n) for h in range(1, n + 1)]

    closest = 2 ** int(math.log2(n_head))
    expected = geometric(closest) + geometric(2 * closest)[::2][: n_head - closest]
    torch.testing.assert_close(M.alibi_slopes(n_head), torch.tensor(expected))
    if n_head == 8:
        torch.testing.assert_close(M.alibi_slopes(8), torch.tensor([0.5**h for h in range(1, 9)]))


def test_alibi_bias_is_minus_slope_times_distance():
    bias = M.ALiBiBias(tiny(pe="alibi"))(torch.arange(6), torch.arange(6))
    slopes = M.alibi_slopes(4)
    for i, j in [(5, 0), (3, 1), (2, 2)]:
        torch.testing.assert_close(bias[:, i, j], -slopes * (i - j))


@pytest.mark.parametrize("distance", [0, 1, 15, 16, 17, 31, 32, 64, 100, 127, 128, 500, 10_000])
def test_t5_causal_buckets(distance):
    if distance < 16:
        expected = distance
    else:
        expected = min(31, 16 + int(math.log(distance / 16) / math.log(128 / 16) * 16))
    t5 = M.T5Bias(tiny(pe="t5"))
    got = t5.buckets(torch.tensor([distance]), torch.tensor([0]))
    assert got.item() == expected
    assert t5.buckets(torch.tensor([0]), torch.tensor([distance])).item() == 0  # future keys: bucket 0


def test_t5_encoder_separates_directions():
    t5 = M.T5Bias(tiny(pe="t5", causal=False))
    ahead = t5.buckets(torch.tensor([0]), torch.tensor([5])).item()
    behind = t5.buckets(torch.tensor([5]), torch.tensor([0])).item()
    assert ahead != behind and ahead == behind + 16


@pytest.mark.parametrize(
    "pe,names,limits",
    [
        ("kerple_log", ("r1", "r2"), ((1e-2, None), (1e-2, None))),
        ("kerple_power", ("a", "p"), ((1e-2, None), (1e-2, 2.0))),
    ],
)
def test_kerple_parameters_are_projected_into_range(pe, names, limits):
    bias = M.PE_REGISTRY[pe](tiny(pe=pe))
    with torch.no_grad():
        for name in names:
            getattr(bias, name).copy_(torch.tensor([-1.0, 0.0, 0.5, 5.0]))
    bias(torch.arange(4), torch.arange(4))
    for name, (low, high) in zip(names, limits):
        value = getattr(bias, name)
        assert value.min() >= low
        if high is not None:
            assert value.max() <= high
        assert value[2] == 0.5  # in-range values untouched


def test_kerple_formulas():
    log = M.KerpleLogBias(tiny(pe="kerple_log"))
    power = M.KerplePowerBias(tiny(pe="kerple_power"))
    b_log = log(torch.arange(8), torch.arange(8))
    b_pow = power(torch.arange(8), torch.arange(8))
    for h in range(4):
        r1, r2, a, p = log.r1[h].item(), log.r2[h].item(), power.a[h].item(), power.p[h].item()
        assert b_log[h, 7, 2].item() == pytest.approx(-r1 * math.log(1 + r2 * 5), rel=1e-5)
        assert b_pow[h, 7, 2].item() == pytest.approx(-a * 5**p, rel=1e-5)
        assert b_pow[h, 3, 3].item() == 0 and b_log[h, 3, 3].item() == 0


def test_kerple_power_gradients_are_finite():
    power = M.KerplePowerBias(tiny(pe="kerple_power"))
    power(torch.arange(10), torch.arange(10)).sum().backward()
    assert torch.isfinite(power.p.grad).all() and torch.isfinite(power.a.grad).all()
    assert power.p.grad.abs().sum() > 0


def test_fire_normaliser_switches_at_the_threshold():
    fire = M.FIREBias(tiny(pe="fire", block_size=16))
    q = torch.arange(40)
    norm = fire.normalizer(q)
    psi = lambda x: math.log(0.1 * x + 1)  # c starts at 0.1
    assert torch.allclose(norm[:17], torch.full((17,), psi(16)))  # below L = 16: psi(L)
    assert norm[30].item() == pytest.approx(psi(30), rel=1e-6)  # beyond: psi(i)
    with torch.no_grad():
        fire.threshold_scale.fill_(2.0)  # L = 32 now
    assert fire.normalizer(q)[30].item() == pytest.approx(psi(32), rel=1e-6)


def test_fire_bias_is_an_mlp_of_normalised_distance():
    fire = M.FIREBias(tiny(pe="fire", block_size=16))
    bias = fire(torch.arange(20), torch.arange(20))
    i, j = 18, 4
    x = math.log(0.1 * (i - j) + 1) / (math.log(0.1 * 18 + 1) + fire.eps)
    torch.testing.assert_close(bias[:, i, j], fire.mlp(torch.tensor([[x]]))[0])


def test_yarn_equals_rope_within_training_length_and_differs_beyond():
    torch.manual_seed(0)
    rope = md.GPT(tiny(pe="rope")).eval()
    yarn = md.GPT(tiny(pe="yarn")).eval()
    yarn.load_state_dict(rope.state_dict())
    short, long = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 64))
    with torch.no_grad():
        torch.testing.assert_close(rope(short)[0], yarn(short)[0])
        assert (rope(long)[0] - yarn(long)[0]).abs().max() > 1e-5


def test_yarn_keeps_fast_frequencies_and_interpolates_slow_ones():
    cfg = tiny(pe="yarn", n_embd=128, n_head=2, block_size=128)  # head size 64: 32 pairs
    yarn = M.YaRNEmbedding(cfg)
    s = 4.0
    theta, scale = yarn.frequencies_and_scale(int(128 * s))
    assert scale == pytest.approx(0.1 * math.log(s) + 1)
    assert torch.allclose(theta[0], yarn.theta[0])  # fastest pair untouched
    assert torch.allclose(theta[-1], yarn.theta[-1] / s)  # slowest pair interpolated by s
    ratio = yarn.theta / theta
    assert torch.all(ratio[1:] >= ratio[:-1] - 1e-6)  # monotone ramp in between


def test_sinusoidal_matches_vaswani():
    pe = M.SinusoidalPositions(tiny(pe="sinusoidal"))(torch.tensor([0, 3, 1000]))
    p, i = 1000, 5
    assert pe[2, 2 * i].item() == pytest.approx(math.sin(p / 10000 ** (2 * i / 32)), abs=1e-4)
    assert pe[2, 2 * i + 1].item() == pytest.approx(math.cos(p / 10000 ** (2 * i / 32)), abs=1e-4)


def test_random_positions_are_sorted_subsets_in_training_and_plain_in_eval():
    model = md.GPT(tiny(pe="rope", random_positions=256))
    model.train()
    a, b = model.positions(16, "cpu"), model.positions(16, "cpu")
    assert torch.all(a[1:] > a[:-1]) and a.max() < 256 and len(a) == 16
    assert not torch.equal(a, b)
    model.eval()
    assert torch.equal(model.positions(16, "cpu"), torch.arange(16))
    logits, loss = model.train()(torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16)))
    loss.backward()


@pytest.mark.parametrize("pe", [p for p in BUILTIN_PES if p != "learned"])
def test_every_extrapolating_pe_runs_far_beyond_block_size(pe):
    model = md.GPT(tiny(pe=pe, refiner="dape" if valid_combination(pe, "dape") else "none")).eval()
    with torch.no_grad():
        logits, _ = model(torch.randint(0, 64, (1, 16 * 9)))
    assert logits.shape == (1, 144, 64) and torch.isfinite(logits).all()


@pytest.mark.parametrize("fast", [True, False])
def test_bfloat16_autocast_and_bfloat16_weights_run(fast):
    torch.manual_seed(0)
    for pe, refiner in [
        ("kerple_log", "dape"),
        ("rope", "none"),
        ("alibi", "none"),
        ("fire", "conv"),
        ("t5", "dape_add"),
    ]:
        model = md.GPT(tiny(pe=pe, refiner=refiner, fast=fast))
        idx = torch.randint(0, 64, (2, 20))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = model(idx, idx)
        loss.backward()
        assert torch.isfinite(loss)
        logits, _ = model.to(torch.bfloat16).eval()(idx)
        assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()


# ---------------------------------------------------------------------------------------------- extension


def test_user_registered_bias_trains_with_every_refiner():
    name = "test_gaussian_bias"

    @md.register_pe(name)
    class GaussianBias(md.AdditiveBias):
        def __init__(self, cfg):
            super().__init__()
            self.width = nn.Parameter(torch.full((cfg.n_head,), 4.0))

        def forward(self, q_pos, k_pos):
            d = (q_pos[:, None] - k_pos[None, :]).float()
            return -((d / self.width[:, None, None]) ** 2)

    assert name in md.PE_NAMES
    torch.manual_seed(0)
    data = torch.randint(0, 8, (1, 200)).repeat(1, 4).view(-1) % 64  # a learnable, repeating sequence
    for refiner in BUILTIN_REFINERS:
        model = md.GPT(tiny(pe=name, refiner=refiner))
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        losses = []
        for _ in range(25):
            start = torch.randint(0, len(data) - 17, (8,))
            x = torch.stack([data[s : s + 16] for s in start])
            y = torch.stack([data[s + 1 : s + 17] for s in start])
            _, loss = model(x, y)
            opt.zero_grad()
            loss.backward()
            losses.append(loss.item())
            opt.step()
        assert model.pe.width.grad is not None and model.pe.width.grad.abs().sum() > 0
        assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.3, refiner


def test_user_registered_refiner_is_used():
    name = "test_scale_refiner"

    @md.register_refiner(name)
    class HalfScores(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.calls = 0

        def forward(self, scores, bias, mask):
            self.calls += 1
            return scores / 2 if bias is None else scores / 2 + bias

    model = md.GPT(tiny(pe="alibi", refiner=name)).eval()
    model(torch.randint(0, 64, (1, 10)))
    assert all(block.attn.refiner.calls == 1 for block in model.blocks)


def test_bad_bias_shape_is_reported():
    name = "test_bad_shape_bias"

    @md.register_pe(name)
    class Wrong(md.AdditiveBias):
        def __init__(self, cfg):
            super().__init__()

        def forward(self, q_pos, k_pos):
            return torch.zeros(len(q_pos), len(k_pos))

    with pytest.raises(ValueError, match=r"shape .*\(n_head, Tq, Tk\)"):
        md.GPT(tiny(pe=name))(torch.randint(0, 64, (1, 8)))


# ---------------------------------------------------------------------------------------------- errors


def test_unknown_names_list_the_valid_choices():
    with pytest.raises(ValueError, match=r"unknown pe 'rotary'.*kerple_log"):
        tiny(pe="rotary")
    with pytest.raises(ValueError, match=r"unknown refiner 'mlp'.*dape_concat"):
        tiny(refiner="mlp")


def test_bad_shapes_and_kernels():
    with pytest.raises(ValueError, match=r"n_embd=30 is not divisible by n_head=4"):
        tiny(n_embd=30)
    with pytest.raises(ValueError, match=r"even head size.*= 3"):
        tiny(pe="rope", n_embd=12, n_head=4)
    with pytest.raises(ValueError, match=r"even head size"):
        tiny(pe="yarn", n_embd=12, n_head=4)
    tiny(pe="alibi", n_embd=12, n_head=4)  # odd heads are fine without rotation
    for kernel in (0, 2, -3):
        with pytest.raises(ValueError, match=rf"refiner_kernel must be an odd integer.*got {kernel}"):
            tiny(refiner="conv", refiner_kernel=kernel)


def test_duplicate_registration_is_refused():
    with pytest.raises(ValueError, match=r"pe 'alibi' is already registered.*fire"):
        md.register_pe("alibi")
    with pytest.raises(ValueError, match=r"refiner 'dape' is already registered"):
        md.register_refiner("dape")
    with pytest.raises(TypeError, match="AdditiveBias"):
        md.register_pe("test_not_a_bias")(nn.Linear)


def test_a_users_name_registered_again_takes_the_new_class_with_a_notice(capsys):
    class First(md.AdditiveBias):
        def __init__(self, cfg):
            super().__init__()

        def forward(self, q_pos, k_pos):
            return torch.zeros(1, len(q_pos), len(k_pos))

    class Edited(First):  # the same cell run again after an edit: a new class under the same name
        pass

    md.register_pe("notebook_bias")(First)
    md.register_pe("notebook_bias")(First)  # the same class again: nothing to say
    assert capsys.readouterr().err == ""
    md.register_pe("notebook_bias")(Edited)
    notice = capsys.readouterr().err.strip().splitlines()
    assert len(notice) == 1 and "'notebook_bias' now builds" in notice[0] and "Edited" in notice[0]
    assert isinstance(md.GPT(tiny(pe="notebook_bias")).pe, Edited)
    with pytest.raises(ValueError, match=r"pe 'rope' is already registered"):
        md.register_pe("rope")(Edited)  # minidape's own names stay refused
    assert md.model.PE_REGISTRY["rope"] is not Edited


def test_bad_idx():
    model = md.GPT(tiny())
    with pytest.raises(TypeError, match=r"integer tensor.*float32"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match=r"shape \(batch, T\); got shape \(4,\)"):
        model(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"vocab_size=64"):
        model(torch.full((1, 4), 64))
    for empty in ((1, 0), (0, 5)):
        with pytest.raises(ValueError, match=rf"idx is empty: shape \(batch, T\) = \({empty[0]}, {empty[1]}\)"):
            model(torch.zeros(empty, dtype=torch.long))


def test_bad_targets():
    model = md.GPT(tiny())
    idx = torch.zeros(2, 6, dtype=torch.long)
    with pytest.raises(ValueError, match=r"shape of idx \(2, 6\).*got shape \(3, 4\)"):
        model(idx, torch.zeros(3, 4, dtype=torch.long))  # as many elements, the wrong shape
    with pytest.raises(ValueError, match=r"shape of idx"):
        model(idx, torch.zeros(12, dtype=torch.long))
    with pytest.raises(TypeError, match=r"targets must be an integer tensor.*float32"):
        model(idx, torch.zeros(2, 6))
    with pytest.raises(ValueError, match=r"targets must be in \[0, vocab_size=64\) or -1"):
        model(idx, torch.full((2, 6), -2))
    model(idx, torch.full((2, 6), -1).index_fill(1, torch.tensor([0]), 3))  # -1 is ignored, fine


def test_value_checks_run_always_in_evaluation_and_on_each_new_shape_in_training():
    """Checking token ranges reads them on the host (a sync on a GPU): a training step skips it for a shape
    already seen, and the first batch of each shape is still checked."""
    model = md.GPT(tiny()).eval()
    bad = torch.full((2, 6), 64)
    for _ in range(2):
        with pytest.raises(ValueError, match=r"token ids must be in \[0, vocab_size=64\); got values in \[64, 64\]"):
            model(bad)
    model.train()
    with pytest.raises(ValueError, match=r"token ids must be in"):
        model(bad)  # a failed check does not mark its shape as seen
    model(torch.zeros(2, 6, dtype=torch.long), torch.zeros(2, 6, dtype=torch.long))
    with pytest.raises(ValueError, match=r"targets must be in"):
        model(torch.zeros(3, 6, dtype=torch.long), torch.full((3, 6), -2))  # a new shape: checked
    with pytest.raises(ValueError, match=r"token ids must be in"):
        model.eval()(bad)


@pytest.mark.parametrize(
    "field,value,error",
    [
        ("causal", "False", TypeError),
        ("causal", 0, TypeError),
        ("fast", None, TypeError),
        ("tie_embeddings", "yes", TypeError),
        ("n_layer", 2.0, TypeError),
        ("n_layer", True, TypeError),
        ("block_size", "128", TypeError),
        ("refiner_kernel", 3.0, TypeError),
        ("attn_chunk", -1, ValueError),
        ("random_positions", 1.5, TypeError),
        ("dropout", "0.1", TypeError),
        ("dropout", True, TypeError),
        ("dropout", 1.0, ValueError),
        ("dropout", -0.1, ValueError),
        ("dropout", float("nan"), TypeError),
        ("rope_base", 0.0, ValueError),
        ("rope_base", -5, ValueError),
        ("rope_base", float("inf"), TypeError),
        ("pe", None, TypeError),
        ("n_head", 0, ValueError),
    ],
)
def test_config_fields_are_type_and_range_checked(field, value, error):
    with pytest.raises(error, match=rf"{field}.*{value!r}" if error is ValueError else rf"GPTConfig.{field} must be"):
        tiny(**{field: value})


def test_config_accepts_ints_for_float_fields():
    assert tiny(dropout=0, rope_base=500).rope_base == 500


def test_tie_embeddings():
    tied, untied = md.GPT(tiny()), md.GPT(tiny(tie_embeddings=False))
    assert tied.lm_head.weight is tied.wte.weight
    assert untied.lm_head.weight is not untied.wte.weight
    assert untied.num_params() == tied.num_params() + 64 * 32
    idx = torch.randint(0, 64, (2, 8))
    _, loss = untied(idx, idx)
    loss.backward()
    assert untied.lm_head.weight.grad.abs().sum() > 0 and untied.wte.weight.grad.abs().sum() > 0


def test_generate_validates_its_arguments():
    model = md.GPT(tiny()).eval()
    idx = torch.zeros(1, 3, dtype=torch.long)
    for kwargs, message in [
        (dict(temperature=0), "temperature must be a number > 0"),
        (dict(temperature=-1.0), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_k=0), "top_k must be None"),
        (dict(top_k=2.5), "top_k"),
        (dict(max_new_tokens=-1), "max_new_tokens must be an integer >= 0"),
        (dict(max_new_tokens=2.0), "max_new_tokens"),
    ]:
        with pytest.raises(ValueError, match=message):
            model.generate(idx, **{"max_new_tokens": 2, **kwargs})
    out = model.generate(idx, max_new_tokens=4, temperature=0.5, top_k=1)
    assert out.shape == (1, 7) and torch.equal(out[:, :3], idx)
    assert torch.equal(model.generate(idx, max_new_tokens=0), idx)


class DeviceProbe(Exception):
    pass


@pytest.mark.parametrize("call", ["generate", "attention_maps"])
def test_generate_and_attention_maps_move_idx_to_the_model_device(call, monkeypatch):
    """Without a GPU: the model says it lives on 'meta'; the token ids it checks must already be there."""
    model = md.GPT(tiny()).eval()
    monkeypatch.setattr(md.GPT, "device", property(lambda self: torch.device("meta")))
    seen = []

    def probe(model, idx):
        seen.append(idx.device)
        raise DeviceProbe

    monkeypatch.setattr(M, "check_idx", probe)
    idx = torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(DeviceProbe):
        model.generate(idx, max_new_tokens=1) if call == "generate" else model.attention_maps(idx, layer=0)
    assert seen[0].type == "meta" and idx.device.type == "cpu"


def test_learned_positions_refuse_lengths_beyond_their_table():
    model = md.GPT(tiny(pe="learned")).eval()
    model(torch.zeros(1, 16, dtype=torch.long))
    with pytest.raises(ValueError, match=r"table of 16 positions.*length 17"):
        model(torch.zeros(1, 17, dtype=torch.long))


# ---------------------------------------------------------------------------------------------- devices

DEVICES = ["cpu"] + [
    d
    for d, ok in (
        ("cuda", torch.cuda.is_available()),
        ("mps", getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()),
    )
    if ok
]


@pytest.mark.parametrize(
    "pe,refiner",
    [
        ("kerple_log", "dape"),
        ("alibi", "conv"),
        ("rope", "none"),
        ("fire", "dape_add"),
        ("t5", "none"),
        ("yarn", "cape"),
    ],
)
def test_every_available_device_agrees_with_float64(pe, refiner):
    """Reference: the model in float64 on CPU. On every device present (CPU always, CUDA/MPS where there) the
    same weights in float32 give the same logits and gradients, beyond block_size, and bfloat16 autocast
    stays close."""
    torch.manual_seed(0)
    model = md.GPT(tiny(pe=pe, refiner=refiner, attn_chunk=9))
    idx = torch.randint(0, 64, (2, 37))
    reference = copy.deepcopy(model).double()
    reference_logits, reference_loss = reference(idx, idx)
    reference_loss.backward()
    for device in DEVICES:
        twin = copy.deepcopy(model).to(device)
        x = idx.to(device)
        logits, loss = twin(x, x)
        loss.backward()
        torch.testing.assert_close(logits.cpu().double(), reference_logits, atol=2e-4, rtol=1e-3)
        for p, r in zip(twin.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad.cpu().double(), r.grad, atol=2e-4, rtol=1e-2)
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            _, loss_bf16 = twin(x, x)
        assert abs(loss_bf16.item() - reference_loss.item()) < 0.05
