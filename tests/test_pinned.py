"""minidape's encodings pinned to their papers: each test computes the paper's equation itself, from the module's
parameters and random inputs, without calling minidape's functions for the reference, and compares within
float32 tolerance. The equation each follows is named in its docstring. (The other tests pin minidape to its own
docstrings; these would catch a docstring or a default that disagrees with the paper.)"""

import math
import re

import pytest
import torch
import torch.nn.functional as F

import minidape as md
from minidape import fast
from minidape import model as M

# Random inputs in float64 for the references; minidape runs in float32 (its own dtype) unless said otherwise.
TOLERANCE = dict(atol=2e-5, rtol=1e-4)


def tiny(**kw):
    base = dict(vocab_size=64, n_layer=1, n_head=2, n_embd=16, block_size=16)
    return md.GPTConfig(**{**base, **kw})


def random_heads(batch, heads, T, head_size, seed):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, T, head_size, generator=generator) for _ in range(3)]


def complex_pairs(x):
    """A head's channels as RoPE's pairs (x_i, x_{i + d/2}) -> complex x_i + i x_{i + d/2} (Su et al., eq. 34)."""
    first, second = x.double().chunk(2, dim=-1)
    return torch.complex(first, second)


def rotary_scores(q, k, q_pos, k_pos, theta, pair_factor=None):
    r"""$\mathrm{Re}\sum_i \tilde q_{n,i}\,\overline{\tilde k_{m,i}}\,e^{i(n\theta_i - m\theta_i)}\,f_i(n, m)$: RoPE's
    score of query n and key m (RoFormer eq. 34) with an optional per-pair factor f (n, m, pair)."""
    qc, kc = complex_pairs(q), complex_pairs(k)  # (..., T, d/2)
    q_turn = torch.polar(torch.ones_like(theta), q_pos.double()[:, None] * theta)  # e^{i n theta}
    k_turn = torch.polar(torch.ones_like(theta), k_pos.double()[:, None] * theta)
    product = (qc * q_turn)[..., :, None, :] * (kc * k_turn).conj()[..., None, :, :]  # (..., Tq, Tk, d/2)
    if pair_factor is not None:
        product = product * pair_factor
    return product.real.sum(-1)


def minidape_rotary_scores(encoding, q, k, T):
    """q . k after minidape's rotation tables (and xPos's factors about the middle) at positions 0..T-1."""
    pos = torch.arange(T)
    (q_cos, q_sin), (k_cos, k_sin) = encoding.rotations(pos, T)
    rq, rk = M.apply_rotary(q, q_cos, q_sin), M.apply_rotary(k, k_cos, k_sin)
    if isinstance(encoding, M.XPosEmbedding):
        rq, rk = M.PositionalInputs(pos, None, None, log_decay=encoding.log_decay(pos)).decayed(rq, rk)
    return (rq @ rk.transpose(-2, -1)).double()


# ---------------------------------------------------------------------------------------------- rotary family


def rope_frequencies(head_size, base=10000.0):
    r"""$\theta_i = \text{base}^{-2i/d}$ (RoFormer eq. 15)."""
    return base ** (-torch.arange(0, head_size, 2, dtype=torch.float64) / head_size)


@pytest.mark.parametrize("T", [16, 48])
def test_position_interpolation_is_chen_et_al_eq_4(T):
    r"""PI (Chen et al. 2023, eq. 4): $f'(x, m) = f(x, mL/L')$, positions squeezed by $s = T/L$ beyond L."""
    cfg = tiny(pe="rope_pi")
    encoding = md.GPT(cfg).pe
    q, k, _ = random_heads(2, 2, T, 8, seed=T)
    s = max(T / cfg.block_size, 1.0)
    pos = torch.arange(T).double() / s
    expected = rotary_scores(q, k, pos, pos, rope_frequencies(8))
    torch.testing.assert_close(minidape_rotary_scores(encoding, q, k, T), expected, **TOLERANCE)


@pytest.mark.parametrize("T", [16, 64])
def test_ntk_aware_scaling_is_bloc97s_base_change(T):
    r"""NTK-aware scaling (bloc97 2023; YaRN paper eq. 17): $b' = b\,s^{|D|/(|D|-2)}$, $\theta_i = b'^{-2i/|D|}$."""
    cfg = tiny(pe="rope_ntk")
    encoding = md.GPT(cfg).pe
    q, k, _ = random_heads(2, 2, T, 8, seed=T)
    s = max(T / cfg.block_size, 1.0)
    pos = torch.arange(T).double()
    expected = rotary_scores(q, k, pos, pos, rope_frequencies(8, 10000.0 * s ** (8 / 6)))
    torch.testing.assert_close(minidape_rotary_scores(encoding, q, k, T), expected, **TOLERANCE)


@pytest.mark.parametrize("T", [16, 80])
def test_yarn_is_peng_et_al_eqs_18_to_22(T):
    r"""YaRN (Peng et al. 2023): ramp $\gamma(r)$ between $\alpha = 1$, $\beta = 32$ over $r_i = L/\lambda_i$ (eq.
    18-19), $h(\theta_i) = (1 - \gamma)\theta_i/s + \gamma\theta_i$ (eq. 20), logits times $(0.1\ln s + 1)^2$
    (eq. 21-22). The ramp is written from the wavelengths $\lambda_i = 2\pi/\theta_i$ here, the paper's form; minidape
    writes it over correction dimensions (REFERENCE.md): the two agree up to the floor and ceiling at the ends."""
    cfg = tiny(pe="yarn", n_embd=64, n_head=2, block_size=16)  # head size 32: 16 pairs, some on the ramp
    encoding = md.GPT(cfg).pe
    q, k, _ = random_heads(1, 2, T, 32, seed=T)
    s = T / cfg.block_size
    theta = rope_frequencies(32)
    if s > 1:
        d = 32
        low = math.floor(d * math.log(cfg.block_size / (2 * math.pi * 32)) / (2 * math.log(10000.0)))
        high = math.ceil(d * math.log(cfg.block_size / (2 * math.pi * 1)) / (2 * math.log(10000.0)))
        low, high = min(max(low, 0), d // 2 - 1), min(max(high, 0), d // 2 - 1)
        # keep = 1 - ramp: 1 for the fast pairs (many turns within L), 0 for the slow ones (interpolated)
        interpolate = ((torch.arange(d // 2).double() - low) / max(high - low, 1e-3)).clamp(0, 1)
        theta = theta / s * interpolate + theta * (1 - interpolate)
        attention_factor = (0.1 * math.log(s) + 1) ** 2
    else:
        attention_factor = 1.0
    pos = torch.arange(T).double()
    expected = attention_factor * rotary_scores(q, k, pos, pos, theta)
    torch.testing.assert_close(minidape_rotary_scores(encoding, q, k, T), expected, **TOLERANCE)
    if s > 1:  # the fast pairs keep their frequency, the slow ones are interpolated by exactly s
        assert interpolate[0] == 0 and interpolate[-1] == 1


@pytest.mark.parametrize("pe", ["rope_pi", "rope_ntk", "yarn"])
def test_a_fixed_rope_scale_leaves_a_prefix_alone_and_the_dynamic_one_does_not(pe):
    """The window-length dependence the docstrings state: with s = T / L a prefix's logits change when more tokens
    follow it; ``rope_scale`` fixes s, and then they do not."""
    idx = torch.randint(0, 64, (1, 48), generator=torch.Generator().manual_seed(0))
    for rope_scale, moves in ((0.0, True), (3.0, False)):
        torch.manual_seed(0)
        model = md.GPT(tiny(pe=pe, n_layer=2, rope_scale=rope_scale)).eval()
        with torch.no_grad():
            prefix, whole = model(idx[:, :16])[0], model(idx)[0][:, :16]
        assert ((prefix - whole).abs().max() > 1e-6) == moves, (pe, rope_scale)  # float32 rounding: ~1e-7
    assert "dynamic" in M.NTKAwareRoPE.__doc__ and "window length" in M.NTKAwareRoPE.__doc__
    for cls in (M.PositionInterpolation, M.YaRNEmbedding):
        assert "window length" in cls.__doc__


# ---------------------------------------------------------------------------------------------- xPos


def xpos_zeta(head_size):
    r"""$\zeta_i = (i/(d/2) + \gamma)/(1 + \gamma)$ with $\gamma = 0.4$ (Sun et al. 2023, eq. 9 and the authors'
    code, pair index $i$ of $d/2$)."""
    return (torch.arange(0, head_size, 2, dtype=torch.float64) / head_size + 0.4) / 1.4


def test_xpos_is_sun_et_al_eq_9():
    r"""xPos (Sun et al. 2023, eq. 9): pair $i$ of $q_n^\top k_m$ is RoPE's times $\zeta_i^{(n-m)/\gamma}$,
    $\gamma = 512$."""
    T = 40
    encoding = md.GPT(tiny(pe="xpos")).pe
    q, k, _ = random_heads(2, 2, T, 8, seed=1)
    n = torch.arange(T).double()
    factor = xpos_zeta(8) ** ((n[:, None, None] - n[None, :, None]) / 512)  # (Tq, Tk, d/2)
    expected = rotary_scores(q, k, n, n, rope_frequencies(8), factor)
    torch.testing.assert_close(minidape_rotary_scores(encoding, q, k, T), expected, **TOLERANCE)


def test_xpos_decays_the_fast_pairs_fastest_and_its_docstring_says_so():
    """The decay order read from the behaviour (a key 64 tokens back, one pair at a time) and from the docstring:
    the fastest-turning pair (i = 0, theta = 1) loses the most, and the docstring must say that, not the opposite."""
    encoding = md.GPT(tiny(pe="xpos", n_embd=32)).pe  # head size 16: 8 pairs
    pos = torch.arange(65)
    log_decay = encoding.log_decay(pos)
    kept = (log_decay[64] - log_decay[0]).exp()  # pair i's factor at distance 64
    assert torch.all(kept.diff() > 0), kept  # increasing with i: the slow pairs keep the most
    assert torch.all(encoding.theta.diff() < 0)  # and pair 0 turns fastest
    doc = " ".join(M.XPosEmbedding.__doc__.split())
    assert re.search(r"fastest for the fast pairs", doc), doc
    assert not re.search(r"slowest for the fast pairs", doc), doc


def test_xpos_stays_finite_and_exact_at_100k_positions():
    """At 100,000 positions, the fast path's factors about each block's last query (``fast.recentred``) are finite,
    and pair products equal the paper's zeta^((n - m)/gamma) computed in float64; the factors about the middle
    (the reference form's) would overflow float32 there, which is why the fast path recentres."""
    T, head_size = 100_000, 8
    encoding = md.GPT(tiny(pe="xpos")).pe
    log_decay = encoding.log_decay(torch.arange(T))
    assert torch.isfinite(log_decay).all()
    assert not fast.decay_fits_about_the_middle(log_decay)
    q0, q1, k1 = T - 16, T, T
    q = torch.randn(1, 1, q1 - q0, head_size, dtype=torch.float32)
    k = torch.randn(1, 1, k1, head_size, dtype=torch.float32)
    scaled_q, scaled_k = fast.recentred(q, k, log_decay, q0, q1)
    assert torch.isfinite(scaled_q).all() and torch.isfinite(scaled_k).all()
    zeta = xpos_zeta(head_size)
    for row, m in [(15, T - 1), (0, T - 17), (15, T - 3000), (7, 0)]:
        n = q0 + row
        expected = (q[0, 0, row].double() * k[0, 0, m].double() * (zeta ** ((n - m) / 512)).repeat(2)).sum()
        got = (scaled_q[0, 0, row].double() * scaled_k[0, 0, m].double()).sum()
        assert got.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-30), (n, m)


def test_xpos_recentred_blocks_equal_the_reference_form(monkeypatch):
    """The fast path's recentred blocks (forced at a short length) compute the reference form's logits."""
    monkeypatch.setattr(fast, "DECAY_SPAN", 0.0)
    monkeypatch.setattr(fast, "DECAY_BLOCK_ROWS", 8)
    idx = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(0))
    for refiner in ("none", "dape"):
        torch.manual_seed(0)
        model = md.GPT(tiny(pe="xpos", n_layer=2, refiner=refiner))
        reference = md.GPT(tiny(pe="xpos", n_layer=2, refiner=refiner, fast=False))
        reference.load_state_dict(model.state_dict())
        torch.testing.assert_close(model(idx)[0], reference(idx)[0], **TOLERANCE)


# ---------------------------------------------------------------------------------------------- FoX


def test_fox_bias_is_lin_et_al_eq_9():
    r"""FoX (Lin et al. 2025, eq. 6 and 9): $f_t = \sigma(w^\top x_t + b)$, $D_{ij} = \sum_{l=j+1}^{i} \ln f_l$."""
    cfg = tiny(pe="fox")
    fox = M.ForgetGateBias(cfg)
    with torch.no_grad():
        fox.gate.bias.normal_()
    batch, T = 2, 12
    x = torch.randn(batch, T, cfg.n_embd)
    q, k, _ = random_heads(batch, cfg.n_head, T, cfg.n_embd // cfg.n_head, seed=2)
    gates = torch.sigmoid(x.double() @ fox.gate.weight.double().t() + fox.gate.bias.double())  # (batch, T, h)
    expected = torch.zeros(batch, cfg.n_head, T, T, dtype=torch.float64)
    for i in range(T):
        for j in range(i + 1):
            expected[:, :, i, j] = gates[:, j + 1 : i + 1].log().sum(1)
    got = fox(x, q, k).double()
    visible = torch.ones(T, T, dtype=torch.bool).tril()
    torch.testing.assert_close(got[..., visible], expected[..., visible], **TOLERANCE)


def test_fox_starts_with_the_authors_gates_and_the_readme_says_so():
    """The authors' code starts every forget gate's bias at 0 (gates 1/2); minidape's default must be that, and the
    README must name the default and the measured difference to the ALiBi start."""
    assert md.GPTConfig().fox_gate_init == "zero"
    fox = M.ForgetGateBias(tiny(pe="fox", n_head=4))
    torch.testing.assert_close(torch.sigmoid(fox.gate.bias), torch.full((4,), 0.5))
    slopes = torch.tensor([2.0 ** (-8 * h / 4) for h in range(1, 5)])  # ALiBi's, Press et al. 2022
    alibi_start = M.ForgetGateBias(tiny(pe="fox", n_head=4, fox_gate_init="alibi"))
    torch.testing.assert_close(torch.sigmoid(alibi_start.gate.bias), torch.exp(-slopes))
    constant = M.ForgetGateBias(tiny(pe="fox", n_head=4, fox_gate_init="0.993"))
    torch.testing.assert_close(torch.sigmoid(constant.gate.bias), torch.full((4,), 0.993))
    from pathlib import Path

    readme = " ".join((Path(__file__).parents[1] / "README.md").read_text().split())
    assert "fox_gate_init" in readme and "authors' init" in readme


def test_fox_data_independent_gates_are_alibi_with_learned_or_fixed_slopes():
    """The paper's data-independent ablation: f = sigma(b_h), so D_ij = (i - j) ln sigma(b_h); with b from ALiBi's
    slopes and "fixed", exactly ALiBi's bias -m_h (i - j) (Press et al. 2022)."""
    cfg = tiny(pe="fox", n_head=4, fox_gate="fixed", fox_gate_init="alibi")
    fox = M.ForgetGateBias(cfg)
    T = 10
    q, k, _ = random_heads(1, 4, T, 4, seed=3)
    got = fox(torch.randn(1, T, cfg.n_embd), q, k)[0]
    slopes = torch.tensor([2.0 ** (-8 * h / 4) for h in range(1, 5)])
    distance = torch.arange(T)[:, None] - torch.arange(T)[None, :]
    visible = distance >= 0
    torch.testing.assert_close(got[:, visible], (-slopes[:, None, None] * distance)[:, visible], **TOLERANCE)
    assert not list(fox.parameters())  # fixed: nothing to learn
    assert [p.shape for p in M.ForgetGateBias(tiny(pe="fox", fox_gate="constant")).parameters()] == [(2,)]


# ---------------------------------------------------------------------------------------------- CoPE


def test_cope_is_golovneva_et_al_eqs_3_to_5():
    r"""CoPE (Golovneva et al. 2024): gates $g_{ij} = \sigma(q_i^\top k_j)$ on the scaled logits (the authors'
    code), $p_{ij} = \sum_{t=j}^{i} g_{it}$ (eq. 3-4) capped at $P - 1$, and the interpolation
    $z_{ij} = (p - \lfloor p\rfloor)\,q_i^\top e[\lceil p\rceil]
    + (1 - p + \lfloor p\rfloor)\,q_i^\top e[\lfloor p\rfloor]$ (eq. 5), with $P$ = ``cope_positions``."""
    cfg = tiny(pe="cope", cope_positions=5)
    cope = M.ContextualPositionBias(cfg)
    with torch.no_grad():
        cope.embeddings.normal_()
    T, hs = 9, cfg.n_embd // cfg.n_head
    q, k, _ = random_heads(2, cfg.n_head, T, hs, seed=4)
    qd, kd, e = q.double(), k.double(), cope.embeddings.double()
    expected = torch.zeros(2, cfg.n_head, T, T, dtype=torch.float64)
    for i in range(T):
        for j in range(i + 1):
            gates = torch.sigmoid((qd[:, :, i, None, :] * kd[:, :, j : i + 1]).sum(-1) / math.sqrt(hs))
            p = gates.sum(-1).clamp(max=4)  # capped at P - 1
            low, high = p.floor().long(), p.ceil().long()
            reads = qd[:, :, i] @ e  # q_i^T e[n] (batch, h, P)
            at = lambda n: reads.gather(-1, n[..., None])[..., 0]  # noqa: E731
            expected[:, :, i, j] = (p - p.floor()) * at(high) + (1 - p + p.floor()) * at(low)
    got = cope(torch.randn(2, T, cfg.n_embd), q, k).double()
    visible = torch.ones(T, T, dtype=torch.bool).tril()
    torch.testing.assert_close(got[..., visible], expected[..., visible], **TOLERANCE)
    assert md.GPTConfig().cope_positions == 64  # the default the docstring and README give


def test_a_cope_checkpoint_from_before_cope_positions_loads_with_its_block_size_slots():
    import dataclasses

    from minidape.lab.checkpoints import checkpoint_config

    cfg = tiny(pe="cope", block_size=32, cope_positions=32)  # what CoPE was before the field existed
    written = {name: value for name, value in dataclasses.asdict(cfg).items() if name != "cope_positions"}
    loaded = md.GPT(checkpoint_config({"config": written}))
    loaded.load_state_dict(md.GPT(cfg).state_dict())
    assert loaded.cfg.cope_positions == 32


# ---------------------------------------------------------------------------------------------- temperatures


def layer_scores(model, idx):
    """S = QK^T / sqrt(d) of layer 0 of a NoPE model, from its weights (embedding, LayerNorm, c_attn)."""
    block = model.blocks[0]
    x = F.layer_norm(model.wte(idx), (model.cfg.n_embd,), block.ln_1.weight, block.ln_1.bias)
    q, k, _ = (x @ block.attn.c_attn.weight.t() + block.attn.c_attn.bias).split(model.cfg.n_embd, dim=2)
    heads = lambda t: t.view(*idx.shape, model.cfg.n_head, -1).transpose(1, 2)  # noqa: E731
    q, k = heads(q), heads(k)
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])


@pytest.mark.parametrize("temperature", ["log_length", "learned"])
def test_temperatures_are_the_log_n_scalings(temperature):
    r"""log-n scaling (Chiang & Cholak 2022; YaRN's and Qwen's $\max(1, \log_L n)$): $\tau_i = \max(1, \ln n_i/\ln L)$;
    Scalable-Softmax (Nakanishi 2025, eq. 3): $\tau_{h,i} = s_h \ln n_i$; $n_i = i + 1$ keys in a decoder."""
    torch.manual_seed(0)
    model = md.GPT(tiny(pe="none", temperature=temperature)).eval()
    if temperature == "learned":
        with torch.no_grad():
            model.blocks[0].attn.temperature.scale.uniform_(0.2, 0.9)
    T = 40
    idx = torch.randint(0, 64, (2, T), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        S = layer_scores(model, idx).double()
        probs = model.attention_maps(idx, 0)["probs"].double()
    n = torch.arange(1, T + 1).double()
    if temperature == "log_length":
        tau = (n.log() / math.log(16)).clamp(min=1)[None, :, None]
    else:
        tau = model.blocks[0].attn.temperature.scale.double()[:, None, None] * n.log()[None, :, None]
    expected = (tau * S).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
    torch.testing.assert_close(probs, expected, **TOLERANCE)


# ---------------------------------------------------------------------------------------------- PaTH, stick-breaking


def test_stick_breaking_is_tan_et_al_eq_4():
    r"""Stick-breaking (Tan et al. 2025, eq. 4): $A_{ij} = \beta_{ij}\prod_{j<k<i}(1 - \beta_{ik})$ for $j < i$,
    $\beta_{ij} = \sigma(q_i^\top k_j/\sqrt d)$, $y_i = \sum_j A_{ij} v_j$; a direct product, no logarithms."""
    T, hs = 10, 8
    q, k, v = random_heads(2, 2, T, hs, seed=6)
    y, pieces = M.StickBreakingAttention(tiny(pe="stick_breaking"))(None, q, k, v)
    beta = torch.sigmoid(q.double() @ k.double().transpose(-2, -1) / math.sqrt(hs))
    A = torch.zeros_like(beta)
    for i in range(T):
        for j in range(i):
            A[:, :, i, j] = beta[:, :, i, j] * torch.prod(1 - beta[:, :, i, j + 1 : i], dim=-1)
    torch.testing.assert_close(pieces["probs"].double(), A, **TOLERANCE)
    torch.testing.assert_close(y.double(), A @ v.double(), **TOLERANCE)
    assert torch.all(A.sum(-1) <= 1 + 1e-12)


def test_path_is_yang_et_al_eq_3():
    r"""PaTH (Yang et al. 2025, eq. 3): $S_{ij} = q_i^\top H_i H_{i-1}\cdots H_{j+1} k_j/\sqrt d$ with
    $H_t = I - \beta_t w_t w_t^\top$, $w_t$ the unit-length causal short convolution of $W_w x$,
    $\beta_t = 2\sigma(u^\top x_t + b)$; $y = \mathrm{softmax}(S)V$. The product of the
    explicit $d \times d$ matrices, in float64."""
    cfg = tiny(pe="path")
    path = M.PaTHAttention(cfg)
    T, hs, h = 9, cfg.n_embd // cfg.n_head, cfg.n_head
    x = torch.randn(2, T, cfg.n_embd)
    q, k, v = random_heads(2, h, T, hs, seed=7)
    y, _ = path(x, q, k, v)
    xd = x.double()
    projected = xd @ path.w_proj.weight.double().t() + path.w_proj.bias.double()  # (batch, T, C)
    conv = F.conv1d(
        F.pad(projected.transpose(1, 2), (2, 0)), path.w_conv.weight.double(), path.w_conv.bias.double(), groups=16
    )  # causal: position t reads t-2..t
    w = F.normalize(conv.transpose(1, 2).reshape(2, T, h, hs), dim=-1).transpose(1, 2)  # (batch, h, T, hs)
    beta = 2 * torch.sigmoid(xd @ path.beta_proj.weight.double().t() + path.beta_proj.bias.double()).transpose(1, 2)
    eye = torch.eye(hs, dtype=torch.float64)
    S = torch.full((2, h, T, T), float("-inf"), dtype=torch.float64)
    for i in range(T):
        for j in range(i + 1):
            product = eye.expand(2, h, hs, hs)
            for t in range(i, j, -1):  # H_i H_{i-1} ... H_{j+1}
                H = eye - beta[:, :, t, None, None] * w[:, :, t, :, None] * w[:, :, t, None, :]
                product = product @ H
            S[:, :, i, j] = (q.double()[:, :, i, None, :] @ product @ k.double()[:, :, j, :, None])[..., 0, 0]
    expected = (S / math.sqrt(hs)).softmax(-1) @ v.double()
    torch.testing.assert_close(y.double(), expected, **TOLERANCE)


@pytest.mark.parametrize("pe", ["path", "stick_breaking"])
def test_path_and_stick_breaking_train_and_are_causal_at_4x_the_training_length(pe):
    cfg = tiny(pe=pe, n_layer=2)
    assert md.check_causal(cfg, length=4 * cfg.block_size)
    torch.manual_seed(0)
    assert learns(md.GPT(cfg))


def learns(model, steps: int = 5) -> bool:
    """Whether a few AdamW steps on one batch lower the model's loss (every parameter reached by the gradient)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    idx = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(0))
    losses = []
    for _ in range(steps):
        loss = model(idx, idx)[1]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses[-1] < losses[0]


# ---------------------------------------------------------------------------------------------- the first generation


def bias_of(pe, T=12, **kw):
    encoding = md.GPT(tiny(pe=pe, n_head=4, **kw)).pe
    positions = torch.arange(T)
    return encoding, encoding(positions, positions).double(), positions.double()


def test_rope_is_su_et_al_eq_34():
    r"""RoPE (Su et al. 2021, eq. 34): $q_m^\top k_n$ after rotating pair $i$ by $m\theta_i$ and $n\theta_i$."""
    T = 20
    encoding = md.GPT(tiny(pe="rope")).pe
    q, k, _ = random_heads(2, 2, T, 8, seed=8)
    pos = torch.arange(T).double()
    torch.testing.assert_close(
        minidape_rotary_scores(encoding, q, k, T), rotary_scores(q, k, pos, pos, rope_frequencies(8)), **TOLERANCE
    )


def test_hope_is_chen_et_al_section_3():
    r"""HoPE (Chen et al. 2025): RoPE with every pair whose period $2\pi/\theta_i$ exceeds the training length set
    to $\theta_i = 0$ (position-independent)."""
    T = 40
    cfg = tiny(pe="hope", n_embd=64)  # head size 32: 16 pairs, some slow
    encoding = md.GPT(cfg).pe
    q, k, _ = random_heads(1, 2, T, 32, seed=9)
    theta = rope_frequencies(32)
    theta = torch.where(2 * math.pi / theta <= cfg.block_size, theta, 0.0)
    pos = torch.arange(T).double()
    expected = rotary_scores(q, k, pos, pos, theta)
    torch.testing.assert_close(minidape_rotary_scores(encoding, q, k, T), expected, **TOLERANCE)


def test_sinusoidal_is_vaswani_et_al_section_3_5():
    r"""$PE_{(p, 2i)} = \sin(p / 10000^{2i/d})$, $PE_{(p, 2i+1)} = \cos(p / 10000^{2i/d})$."""
    encoding = md.GPT(tiny(pe="sinusoidal")).pe
    p, i = torch.arange(30).double()[:, None], torch.arange(8).double()[None, :]
    expected = torch.zeros(30, 16, dtype=torch.float64)
    expected[:, 0::2] = torch.sin(p / 10000 ** (2 * i / 16))
    expected[:, 1::2] = torch.cos(p / 10000 ** (2 * i / 16))
    torch.testing.assert_close(encoding(torch.arange(30)).double(), expected, **TOLERANCE)


def test_learned_and_none_are_a_table_and_nothing():
    """GPT-2's learned table: x_p = e_t + P_p; NoPE: no positional input (a token's embedding alone)."""
    model = md.GPT(tiny(pe="learned"))
    torch.testing.assert_close(model.pe(torch.arange(5)), model.pe.table.weight[:5])
    assert not list(md.GPT(tiny(pe="none")).pe.parameters())


def test_alibi_is_press_et_al_section_3():
    r"""ALiBi (Press et al. 2022): $-m_h (i - j)$, $m_h = 2^{-8h/n}$ for $n$ heads, $h = 1..n$."""
    _, got, pos = bias_of("alibi")
    slopes = torch.tensor([2.0 ** (-8 * h / 4) for h in range(1, 5)], dtype=torch.float64)
    expected = -slopes[:, None, None] * (pos[:, None] - pos[None, :])
    visible = torch.ones(12, 12, dtype=torch.bool).tril()
    torch.testing.assert_close(got[:, visible], expected[:, visible], **TOLERANCE)


def test_t5_is_raffel_et_al_bucketing():
    r"""T5's causal buckets (Raffel et al. 2020; its code): $n = i - j$; $n < 16$ exact, else
    $16 + \lfloor \ln(n/16)/\ln(128/16) \cdot 16\rfloor$ capped at 31; the bias is the table's entry."""
    encoding, got, _ = bias_of("t5", T=300)
    for i, j in [(0, 0), (15, 0), (16, 0), (40, 3), (299, 0), (200, 190)]:
        n = i - j
        bucket = n if n < 16 else min(31, 16 + int(math.log(n / 16) / math.log(8) * 16))
        torch.testing.assert_close(got[:, i, j], encoding.table.weight[bucket].double(), **TOLERANCE)


def test_kerple_is_chi_et_al_eq_9_and_10():
    r"""KERPLE (Chi et al. 2022): log $-r_1\ln(1 + r_2|i - j|)$, power $-a|i - j|^p$, per head."""
    encoding, got, pos = bias_of("kerple_log")
    distance = (pos[:, None] - pos[None, :]).clamp(min=0)
    r1, r2 = encoding.r1.double()[:, None, None], encoding.r2.double()[:, None, None]
    torch.testing.assert_close(got, -r1 * torch.log(1 + r2 * distance), **TOLERANCE)
    encoding, got, _ = bias_of("kerple_power")
    a, p = encoding.a.double()[:, None, None], encoding.p.double()[:, None, None]
    torch.testing.assert_close(got, -a * distance**p, **TOLERANCE)


def test_fire_is_li_et_al_eq_4():
    r"""FIRE (Li et al. 2024): $f_\theta(\psi(i - j)/\psi(\max(L, i)))$, $\psi(x) = \ln(c|x| + 1)$."""
    encoding, got, pos = bias_of("fire", T=40)
    c, L = encoding.c.double(), abs(encoding.threshold_scale.double() * 16)

    def psi(x):
        return torch.log(torch.abs(c * x) + 1)

    distance = (pos[:, None] - pos[None, :]).clamp(min=0)
    normalized = psi(distance) / (psi(torch.maximum(pos, L))[:, None] + 1e-6)
    first, last = encoding.mlp[0], encoding.mlp[2]
    hidden = torch.relu(normalized[..., None] * first.weight.double()[:, 0] + first.bias.double())
    expected = (hidden @ last.weight.double().t() + last.bias.double()).permute(2, 0, 1)
    torch.testing.assert_close(got, expected, **TOLERANCE)


# ---------------------------------------------------------------------------------------------- FoX's Pro block


def test_fox_pro_block_is_lin_et_al_section_3_2():
    r"""FoX's Pro block (Lin et al. 2025, section 3.2, as the docstring reads it), from the layer's weights: KV-shift
    $k_t \leftarrow \alpha_t k_{t-1} + (1-\alpha_t) k_t$, $\alpha = \sigma(w_\alpha^\top x)$ per head (and $v$);
    QK-norm (RMSNorm per head); output norm (RMSNorm per head) and output gate $o \odot \sigma(W_g x)$. The layer's
    output is recomputed here with FoX's bias and softmax, and compared on both paths."""
    for fast_path in (True, False):
        torch.manual_seed(0)
        cfg = tiny(pe="fox", attention_extras="pro", fast=fast_path)
        layer = md.GPT(cfg).blocks[0].attn
        with torch.no_grad():
            for norm in (layer.q_norm, layer.k_norm, layer.output_norm):
                norm.weight.uniform_(0.5, 1.5)
        T, h, hs = 10, cfg.n_head, cfg.n_embd // cfg.n_head
        x = torch.randn(2, T, cfg.n_embd)
        positional = M.PositionalInputs(torch.arange(T), None, None)
        with torch.no_grad():
            got = layer(x, positional).double()
        xd = x.double()
        q, k, v = (xd @ layer.c_attn.weight.double().t() + layer.c_attn.bias.double()).split(cfg.n_embd, dim=2)
        q, k, v = (t.view(2, T, h, hs).transpose(1, 2) for t in (q, k, v))
        alpha = torch.sigmoid(xd @ layer.shifts_kv.weight.double().t() + layer.shifts_kv.bias.double())  # (2, T, 2h)
        alpha_k, alpha_v = alpha[..., :h].transpose(1, 2)[..., None], alpha[..., h:].transpose(1, 2)[..., None]
        shifted = lambda t, a: a * torch.cat([torch.zeros_like(t[:, :, :1]), t[:, :, :-1]], 2) + (1 - a) * t  # noqa: E731
        k, v = shifted(k, alpha_k), shifted(v, alpha_v)

        def rms(t, weight):
            return t / torch.sqrt((t * t).mean(-1, keepdim=True) + torch.finfo(torch.float32).eps) * weight.double()

        q, k = rms(q, layer.q_norm.weight), rms(k, layer.k_norm.weight)
        gates = torch.sigmoid(xd @ layer.data_bias.gate.weight.double().t() + layer.data_bias.gate.bias.double())
        c = gates.log().cumsum(1).transpose(1, 2)  # (2, h, T)
        scores = q @ k.transpose(-2, -1) / math.sqrt(hs) + c[..., :, None] - c[..., None, :]
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        o = rms(scores.softmax(-1) @ v, layer.output_norm.weight).transpose(1, 2).reshape(2, T, cfg.n_embd)
        o = o * torch.sigmoid(xd @ layer.output_gate.weight.double().t() + layer.output_gate.bias.double())
        expected = o @ layer.c_proj.weight.double().t() + layer.c_proj.bias.double()
        torch.testing.assert_close(got, expected, **TOLERANCE)
    assert md.check_causal(tiny(pe="fox", attention_extras="pro", n_layer=2), length=64)
