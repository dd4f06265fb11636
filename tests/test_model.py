"""The core model: causality, the refiners against their plain formulas, every encoding's maths, errors."""
import itertools
import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import minidape as md
from minidape import model as M

BUILTIN_PES = ["none", "learned", "sinusoidal", "rope", "yarn", "t5", "alibi", "kerple_log", "kerple_power", "fire"]
BUILTIN_REFINERS = ["none", "dape", "dape_concat", "dape_add", "cape", "conv"]


def tiny(**kw):
    base = dict(vocab_size=64, n_layer=2, n_head=4, n_embd=32, block_size=16)
    base.update(kw)
    return md.GPTConfig(**base)


def test_registries_list_every_builtin_name():
    assert set(BUILTIN_PES) <= set(md.PE_NAMES)
    assert set(BUILTIN_REFINERS) <= set(md.REFINER_NAMES)


# ---------------------------------------------------------------------------------------------- causality

@pytest.mark.parametrize("pe,refiner", list(itertools.product(BUILTIN_PES, BUILTIN_REFINERS)))
def test_future_tokens_do_not_change_past_logits(pe, refiner):
    torch.manual_seed(0)
    # attn_chunk=7 forces several query blocks, so block boundaries are exercised too
    model = md.GPT(tiny(pe=pe, refiner=refiner, attn_chunk=7)).eval()
    T = 16 if pe == "learned" else 40                      # beyond block_size=16 where the PE allows
    t = T // 2
    idx = torch.randint(0, 64, (2, T))
    changed = idx.clone()
    changed[:, t + 1:] = (idx[:, t + 1:] + 1 + torch.randint(0, 62, (2, T - t - 1))) % 64
    with torch.no_grad():
        a, _ = model(idx)
        b, _ = model(changed)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], atol=1e-5, rtol=0)
    assert (a[:, t + 1:] - b[:, t + 1:]).abs().max() > 1e-4   # and the changed tokens do matter


@pytest.mark.parametrize("pe,refiner", [("kerple_log", "dape"), ("alibi", "conv"), ("rope", "none"),
                                        ("t5", "dape_add"), ("fire", "none")])
def test_encoder_sees_the_future(pe, refiner):
    torch.manual_seed(0)
    model = md.GPT(tiny(pe=pe, refiner=refiner, causal=False)).eval()
    idx = torch.randint(0, 64, (1, 24))
    changed = idx.clone()
    changed[0, -1] = (idx[0, -1] + 1) % 64
    with torch.no_grad():
        a, _ = model(idx)
        b, _ = model(changed)
    assert (a[0, 0] - b[0, 0]).abs().max() > 1e-5


@pytest.mark.parametrize("pe,refiner", [("kerple_log", "dape"), ("alibi", "none"), ("rope", "conv"),
                                        ("fire", "dape_concat")])
def test_query_blocking_changes_nothing(pe, refiner):
    torch.manual_seed(1)
    model = md.GPT(tiny(pe=pe, refiner=refiner)).eval()
    idx = torch.randint(0, 64, (2, 50))
    with torch.no_grad():
        whole, _ = model(idx)
        for block in model.blocks:
            block.attn.attn_chunk = 6
        blocked, _ = model(idx)
    torch.testing.assert_close(whole, blocked, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------- refiners

def plain_mlp(mlp, x):
    """The papers' form: channels last, the MLP over the head axis, channels first again."""
    return mlp(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def random_inputs(B=2, h=4, T=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(B, h, T, T, generator=g, dtype=torch.float64)
    bias = torch.randn(h, T, T, generator=g, dtype=torch.float64)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    return scores, bias, mask


def refiner_for(name, pe="kerple_log", **kw):
    torch.manual_seed(3)
    return M.REFINER_REGISTRY[name](tiny(pe=pe, refiner=name, **kw)).double()


def test_dape_equals_concat_mlp_residual():
    scores, bias, mask = random_inputs()
    refiner = refiner_for("dape")
    mlp = refiner.f.mlp
    assert mlp[0].in_features == 8 and isinstance(mlp[1], nn.LeakyReLU) and mlp[1].negative_slope == 0.01
    tiled = bias.expand(scores.shape[0], -1, -1, -1)
    expected = scores + bias + plain_mlp(mlp, torch.cat([scores, tiled], dim=1))
    torch.testing.assert_close(refiner(scores, bias, mask), expected)


def test_dape_without_bias_uses_head_channels_only():
    scores, _, mask = random_inputs()
    refiner = refiner_for("dape", pe="rope")
    assert refiner.f.mlp[0].in_features == 4
    torch.testing.assert_close(refiner(scores, None, mask), scores + plain_mlp(refiner.f.mlp, scores))


def test_dape_concat_and_add_follow_their_equations():
    scores, bias, mask = random_inputs()
    tiled = bias.expand(scores.shape[0], -1, -1, -1)
    concat = refiner_for("dape_concat")
    torch.testing.assert_close(concat(scores, bias, mask),
                               scores + plain_mlp(concat.f.mlp, torch.cat([scores, tiled], dim=1)))
    add = refiner_for("dape_add")
    assert add.f.mlp[0].in_features == 4
    torch.testing.assert_close(add(scores, bias, mask), scores + bias + plain_mlp(add.f.mlp, scores + bias))


def test_cape_is_dape():
    assert M.REFINER_REGISTRY["cape"] is M.REFINER_REGISTRY["dape"]
    assert "CAPE" in M.REFINER_REGISTRY["cape"].__doc__
    scores, bias, mask = random_inputs()
    torch.testing.assert_close(refiner_for("cape")(scores, bias, mask), refiner_for("dape")(scores, bias, mask))


@pytest.mark.parametrize("kernel", [1, 3, 5])
def test_conv_equals_tril_then_two_key_axis_convolutions(kernel):
    scores, bias, mask = random_inputs(T=11)
    refiner = refiner_for("conv", refiner_kernel=kernel)
    conv1 = nn.Conv2d(8, 32, (1, kernel), padding=(0, kernel // 2)).double()
    conv2 = nn.Conv2d(32, 4, (1, kernel), padding=(0, kernel // 2)).double()
    conv1.load_state_dict(refiner.conv1.state_dict())
    conv2.load_state_dict(refiner.conv2.state_dict())
    stacked = torch.cat([scores, bias.expand(2, -1, -1, -1)], dim=1).tril()
    expected = scores + bias + conv2(F.leaky_relu(conv1(stacked), 0.01))
    torch.testing.assert_close(refiner(scores, bias, mask), expected)


def test_conv_without_tril_would_leak_but_ours_does_not():
    scores, bias, mask = random_inputs(T=10)
    refiner = refiner_for("conv")
    future = scores.clone()
    future[..., 3, 4:] += 10.0                                      # row 3's masked (future) entries
    out_a, out_b = refiner(scores, bias, mask), refiner(future, bias, mask)
    torch.testing.assert_close(out_a[..., 3, :4], out_b[..., 3, :4])


def plain_refiner(name, refiner, scores, bias):
    """Each refiner's equation written with plain modules (full size, channels last for the MLPs)."""
    tiled = None if bias is None else bias.expand(scores.shape[0], -1, -1, -1)
    if name == "conv":
        stacked = scores if bias is None else torch.cat([scores, tiled], dim=1)
        hidden = F.leaky_relu(F.conv2d(stacked.tril(), refiner.conv1.weight, refiner.conv1.bias,
                                       padding=refiner.conv1.padding), 0.01)
        out = scores + F.conv2d(hidden, refiner.conv2.weight, refiner.conv2.bias, padding=refiner.conv2.padding)
        return out if bias is None else out + bias
    mlp = refiner.f.mlp
    if name == "dape_add":
        x = scores if bias is None else scores + bias
        return x + plain_mlp(mlp, x)
    stacked = scores if bias is None else torch.cat([scores, tiled], dim=1)
    out = scores + plain_mlp(mlp, stacked)
    return out + bias if (bias is not None and name == "dape") else out


@pytest.mark.parametrize("name,pe,kw", [("dape", "kerple_log", {}), ("dape", "rope", {}),
                                        ("dape_concat", "alibi", {}), ("dape_add", "t5", {}),
                                        ("conv", "kerple_log", {"refiner_kernel": 3}),
                                        ("conv", "fire", {"refiner_kernel": 5}), ("conv", "rope", {})])
def test_refiner_gradients_equal_the_plain_formula(name, pe, kw):
    """Our refiners recompute their hidden layer in backward: every gradient (scores, bias, weights) must
    still equal autograd through the plain formula."""
    scores, bias, mask = random_inputs(T=10, seed=4)
    bias = bias if M.pe_has_bias(pe) else None
    refiner = refiner_for(name, pe=pe, **kw)
    upstream = torch.randn(scores.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    inputs = [t.requires_grad_() for t in (scores, bias) if t is not None] + list(refiner.parameters())

    def grads(fn):
        out = fn(refiner, scores.tril() if name == "conv" else scores, bias)
        return torch.autograd.grad((out * upstream * mask).sum(), inputs)

    fast = grads(lambda r, s, b: r(s, b, mask))
    plain = grads(lambda r, s, b: plain_refiner(name, r, s, b))
    for got, expected in zip(fast, plain):
        torch.testing.assert_close(got, expected)


def reference_attention(attn, x, positional, causal=True):
    """One layer of attention written plainly at full size: scores, refiner (or + B), mask, softmax."""
    B, T, C = x.shape
    q, k, v = attn.qkv(x, positional)
    scores = q @ k.transpose(-2, -1) / math.sqrt(attn.head_size)
    bias = positional.bias(0, T, T) if positional.bias is not None else None
    mask = torch.ones(T, T, dtype=torch.bool).tril() if causal else torch.ones(T, T, dtype=torch.bool)
    if attn.refiner is not None:
        scores = attn.refiner(scores, bias, mask)
    elif bias is not None:
        scores = scores + bias
    probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    y = (probs @ v).transpose(1, 2).reshape(B, T, C)
    return attn.c_proj(y)


@pytest.mark.parametrize("pe,refiner", [("kerple_log", "dape"), ("alibi", "conv"), ("rope", "dape"),
                                        ("t5", "dape_add"), ("kerple_power", "none")])
def test_blocked_training_attention_matches_plain_forward_and_gradients(pe, refiner):
    torch.manual_seed(0)
    model = md.GPT(tiny(pe=pe, refiner=refiner, attn_chunk=5)).train()
    attn = model.blocks[0].attn
    x = torch.randn(2, 23, 32, requires_grad=True)
    positional = model.positional_inputs(torch.arange(23))
    fast = attn(x, positional)
    grads_fast = torch.autograd.grad(fast.square().sum(), [x] + list(model.parameters()), allow_unused=True)
    plain = reference_attention(attn, x, model.positional_inputs(torch.arange(23)))
    grads_plain = torch.autograd.grad(plain.square().sum(), [x] + list(model.parameters()), allow_unused=True)
    torch.testing.assert_close(fast, plain, atol=1e-5, rtol=1e-4)
    for gf, gp in zip(grads_fast, grads_plain):
        if gp is None:
            assert gf is None or gf.abs().max() == 0
        else:
            torch.testing.assert_close(gf, gp, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("refiner", ["dape", "none"])
def test_cpu_query_blocks_keep_a_block_bounded_whatever_the_length(refiner):
    """Blocks grow with T (fewer blocks) but a block's widest tensor, (B, channels, rows, T), stays under the CPU
    budget unless it is already at the 16-row minimum: evaluation memory is linear in T, not quadratic."""
    attn = md.GPT(tiny(pe="kerple_log", refiner=refiner, refiner_width=32)).blocks[0].attn
    channels = attn.refiner_width if refiner == "dape" else attn.n_head
    for B in (1, 2, 8, 32):
        for T in (100, 128, 512, 2048, 16384):
            rows = attn.block_rows(B, T, torch.device("cpu"))
            if refiner == "none" and B * attn.n_head * T * T <= M.FULL_BIAS_ELEMENTS:
                assert rows == T                        # small: one block through the fused kernel
                continue
            assert rows >= 16 and (rows == 16 or B * channels * rows * T <= M.BLOCK_ELEMENTS["cpu"])
            assert rows < T


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
        torch.testing.assert_close(M.alibi_slopes(8), torch.tensor([0.5 ** h for h in range(1, 9)]))


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
    assert t5.buckets(torch.tensor([0]), torch.tensor([distance])).item() == 0   # future keys: bucket 0


def test_t5_encoder_separates_directions():
    t5 = M.T5Bias(tiny(pe="t5", causal=False))
    ahead = t5.buckets(torch.tensor([0]), torch.tensor([5])).item()
    behind = t5.buckets(torch.tensor([5]), torch.tensor([0])).item()
    assert ahead != behind and ahead == behind + 16


@pytest.mark.parametrize("pe,names,limits", [("kerple_log", ("r1", "r2"), ((1e-2, None), (1e-2, None))),
                                             ("kerple_power", ("a", "p"), ((1e-2, None), (1e-2, 2.0)))])
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
        assert value[2] == 0.5                                      # in-range values untouched


def test_kerple_formulas():
    log = M.KerpleLogBias(tiny(pe="kerple_log"))
    power = M.KerplePowerBias(tiny(pe="kerple_power"))
    b_log = log(torch.arange(8), torch.arange(8))
    b_pow = power(torch.arange(8), torch.arange(8))
    for h in range(4):
        r1, r2, a, p = log.r1[h].item(), log.r2[h].item(), power.a[h].item(), power.p[h].item()
        assert b_log[h, 7, 2].item() == pytest.approx(-r1 * math.log(1 + r2 * 5), rel=1e-5)
        assert b_pow[h, 7, 2].item() == pytest.approx(-a * 5 ** p, rel=1e-5)
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
    psi = lambda x: math.log(0.1 * x + 1)                            # c starts at 0.1
    assert torch.allclose(norm[:17], torch.full((17,), psi(16)))     # below L = 16: psi(L)
    assert norm[30].item() == pytest.approx(psi(30), rel=1e-6)      # beyond: psi(i)
    with torch.no_grad():
        fire.threshold_scale.fill_(2.0)                             # L = 32 now
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
    cfg = tiny(pe="yarn", n_embd=128, n_head=2, block_size=128)      # head size 64: 32 pairs
    yarn = M.YaRNEmbedding(cfg)
    s = 4.0
    theta, scale = yarn.frequencies_and_scale(int(128 * s))
    assert scale == pytest.approx(0.1 * math.log(s) + 1)
    assert torch.allclose(theta[0], yarn.theta[0])                  # fastest pair untouched
    assert torch.allclose(theta[-1], yarn.theta[-1] / s)            # slowest pair interpolated by s
    ratio = yarn.theta / theta
    assert torch.all(ratio[1:] >= ratio[:-1] - 1e-6)                # monotone ramp in between


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
    model = md.GPT(tiny(pe=pe, refiner="dape")).eval()
    with torch.no_grad():
        logits, _ = model(torch.randint(0, 64, (1, 16 * 9)))
    assert logits.shape == (1, 144, 64) and torch.isfinite(logits).all()


def test_bfloat16_autocast_and_bfloat16_weights_run():
    torch.manual_seed(0)
    for pe, refiner in [("kerple_log", "dape"), ("rope", "none"), ("alibi", "none"), ("fire", "conv")]:
        model = md.GPT(tiny(pe=pe, refiner=refiner))
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
            return -(d / self.width[:, None, None]) ** 2

    assert name in md.PE_NAMES
    torch.manual_seed(0)
    data = torch.randint(0, 8, (1, 200)).repeat(1, 4).view(-1) % 64   # a learnable, repeating sequence
    for refiner in BUILTIN_REFINERS:
        model = md.GPT(tiny(pe=name, refiner=refiner))
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        losses = []
        for step in range(25):
            start = torch.randint(0, len(data) - 17, (8,))
            x = torch.stack([data[s:s + 16] for s in start])
            y = torch.stack([data[s + 1:s + 17] for s in start])
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
    tiny(pe="alibi", n_embd=12, n_head=4)                           # odd heads are fine without rotation
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


def test_bad_idx():
    model = md.GPT(tiny())
    with pytest.raises(TypeError, match=r"integer tensor.*float32"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match=r"shape \(B, T\); got shape \(4,\)"):
        model(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"vocab_size=64"):
        model(torch.full((1, 4), 64))


def test_learned_positions_refuse_lengths_beyond_their_table():
    model = md.GPT(tiny(pe="learned")).eval()
    model(torch.zeros(1, 16, dtype=torch.long))
    with pytest.raises(ValueError, match=r"table of 16 positions.*length 17"):
        model(torch.zeros(1, 17, dtype=torch.long))


# ---------------------------------------------------------------------------------------------- devices

DEVICES = ["cpu"] + [d for d, ok in (("cuda", torch.cuda.is_available()),
                                      ("mps", getattr(torch.backends, "mps", None) is not None
                                       and torch.backends.mps.is_available())) if ok]


@pytest.mark.parametrize("pe,refiner", [("kerple_log", "dape"), ("alibi", "conv"), ("rope", "none"),
                                        ("fire", "dape_add"), ("t5", "none"), ("yarn", "cape")])
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
