"""Positions that read the data (issue 33): biases of shape (batch, n_head, Tq, Tk) -- FoX, CoPE and users' own --,
the RoPE scaling family (PI, NTK-aware, xPos, HoPE), per-layer encodings and the length-aware temperature. Each new
encoding x every refiner: its maths, causality, fast path = reference (forward and every gradient), a training step
and evaluation at 16x the training length."""

import copy
import itertools
import math

import pytest
import torch
from test_fast import assert_same_forward_and_gradients
from test_model import BUILTIN_REFINERS, tiny
from torch import nn

import minidape as md
from minidape import model as M
from minidape.lab.checkpoints import load_checkpoint, save_checkpoint
from minidape.lab.evaluate import perplexity_by_length

NEW_PES = ["fox", "cope", "rope_pi", "rope_ntk", "xpos", "hope", "rope,none", "fox,rope"]
# (pe, temperature): the temperature with the encodings it is meant for, NoPE and the RoPE/NoPE hybrid
TEMPERED = [("none", "log_length"), ("none", "learned"), ("rope,none", "learned"), ("fox", "learned")]
COMBINATIONS = [(pe, "none") for pe in NEW_PES] + TEMPERED


def perturbed_pair(cfg, seed: int = 0):
    """The same model twice (fast path, reference form), with refiner and data-bias weights large enough that
    their mistakes would show."""
    torch.manual_seed(seed)
    model = md.GPT(cfg)
    with torch.no_grad():
        for block in model.blocks:
            for module in (block.attn.refiner, block.attn.data_bias, block.attn.temperature):
                for p in module.parameters() if module is not None else []:
                    p.add_(torch.randn_like(p) * 0.3)
    reference = copy.deepcopy(model)
    reference.cfg.fast = False
    return model.train(), reference.train()


# ---------------------------------------------------------------------------------------------- every combination


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize(
    "pe,temperature,refiner", [(pe, t, r) for (pe, t), r in itertools.product(COMBINATIONS, BUILTIN_REFINERS)]
)
def test_every_new_combination_is_causal(pe, temperature, refiner, fast):
    cfg = tiny(pe=pe, temperature=temperature, refiner=refiner, attn_chunk=7, fast=fast)
    model = perturbed_pair(cfg)[0 if fast else 1]
    assert md.check_causal(model, length=40)


@pytest.mark.parametrize("causal", [True, False], ids=["decoder", "encoder"])
@pytest.mark.parametrize(
    "pe,temperature,refiner", [(pe, t, r) for (pe, t), r in itertools.product(COMBINATIONS, BUILTIN_REFINERS)]
)
def test_fast_equals_reference_forward_and_every_gradient(pe, temperature, refiner, causal):
    # FoX from ALiBi's gates: from the authors' (1/2) its bias reaches -28 over 40 tokens, where the two paths'
    # float32 gradients differ by 3e-3 of their scale (float64: 1e-7), conditioning rather than a mistake.
    for T, chunk in ((12, 0), (40, 7)):  # one query block; blocks of 7 rows beyond block_size = 16
        cfg = tiny(
            pe=pe, temperature=temperature, refiner=refiner, causal=causal, attn_chunk=chunk, fox_gate_init="alibi"
        )
        model, reference = perturbed_pair(cfg)
        idx = torch.randint(0, 64, (2, T), generator=torch.Generator().manual_seed(T))
        assert_same_forward_and_gradients(model, reference, idx)


@pytest.mark.parametrize(
    "pe,temperature,refiner", [(pe, t, r) for (pe, t), r in itertools.product(COMBINATIONS, BUILTIN_REFINERS)]
)
def test_every_new_combination_trains_a_step_and_evaluates_at_16x(pe, temperature, refiner):
    torch.manual_seed(0)
    model = md.GPT(tiny(pe=pe, temperature=temperature, refiner=refiner))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    idx = torch.randint(0, 64, (4, 16))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    _, loss = model(idx, idx)
    loss.backward()
    optimizer.step()
    unchanged = [name for name, p in model.named_parameters() if torch.equal(before[name], p)]
    assert torch.isfinite(loss) and not unchanged, unchanged
    tokens = torch.randint(0, 64, (2000,), generator=torch.Generator().manual_seed(1))
    ppl = perplexity_by_length(model, tokens, [16, 256], last_k=16, n_windows=2)
    assert all(math.isfinite(value) and value > 1 for value in ppl.values()), ppl


@pytest.mark.parametrize("pe,temperature", [("fox", "none"), ("cope", "none"), ("rope,none", "learned")])
def test_checkpoints_keep_the_new_encodings(pe, temperature, tmp_path):
    model = perturbed_pair(tiny(pe=pe, temperature=temperature, refiner="dape"))[0].eval()
    save_checkpoint(tmp_path / "ckpt.pt", model)
    loaded, _ = load_checkpoint(tmp_path / "ckpt.pt")
    idx = torch.randint(0, 64, (2, 40))
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(idx)[0], model(idx)[0])


def test_memory_stays_bounded_in_query_blocks_for_a_bias_of_the_data():
    """The fast path asks a data bias for blocks of query rows only, never a (T, T) one."""
    model = md.GPT(tiny(pe="fox", refiner="dape", attn_chunk=16)).eval()
    asked = []
    forward = M.ForgetGateBias.forward

    def spy(self, x, q, k, first_query=0):
        asked.append((q.shape[2], k.shape[2]))
        return forward(self, x, q, k, first_query)

    M.ForgetGateBias.forward = spy
    try:
        with torch.no_grad():
            model(torch.randint(0, 64, (1, 256)))
    finally:
        M.ForgetGateBias.forward = forward
    assert asked and max(rows for rows, _ in asked) == 16 and len(asked) == 2 * 256 // 16


# ---------------------------------------------------------------------------------------------- FoX


def layer_input(model, idx, layer=0):
    """The input of a layer's attention (after its LayerNorm), and its q, k."""
    x, inputs = model.hidden_states(idx, upto_layer=layer)
    block = model.blocks[layer]
    x = block.ln_1(x)
    q, k, _ = block.attn.qkv(x, inputs[layer])
    return x, q, k


def test_fox_bias_is_the_cumulative_log_gate_sum():
    torch.manual_seed(0)
    model = perturbed_pair(tiny(pe="fox"))[1].eval()
    idx = torch.randint(0, 64, (2, 9))
    with torch.no_grad():
        x, q, k = layer_input(model, idx)
        fox = model.blocks[0].attn.data_bias
        bias = fox(x, q, k)
        gate = torch.sigmoid(x @ fox.gate.weight.T + fox.gate.bias)  # f_t (batch, T, nh)
    assert bias.shape == (2, 4, 9, 9)
    for b, h, i in itertools.product(range(2), range(4), range(9)):
        for j in range(i + 1):  # D_ij = sum_{l=j+1..i} log f_l, 0 on the diagonal
            expected = sum(math.log(gate[b, t, h].item()) for t in range(j + 1, i + 1))
            assert bias[b, h, i, j].item() == pytest.approx(expected, abs=1e-5)
    maps = model.attention_maps(idx, layer=0)
    torch.testing.assert_close(maps["bias"], bias)


def test_fox_from_alibis_gates_starts_as_alibi_and_reads_the_content():
    model = md.GPT(tiny(pe="fox", n_head=8, fox_gate_init="alibi"))
    fox = model.blocks[1].attn.data_bias
    nn.init.zeros_(fox.gate.weight)  # constant gates: sigma(b_h) = exp(-m_h)
    x, q, k = torch.randn(1, 10, 32), torch.randn(1, 8, 10, 4), torch.randn(1, 8, 10, 4)
    alibi = M.ALiBiBias(tiny(n_head=8))(torch.arange(10), torch.arange(10))
    torch.testing.assert_close(fox(x, q, k)[0].tril(), alibi.tril())
    nn.init.normal_(fox.gate.weight)  # gates of the content: the decay varies
    D = fox(x, q, k)[0]
    steps = D[:, 1:, 0] - D[:, :-1, 0]  # log f_i along each row's first column
    assert steps.std(dim=1).min() > 1e-3


def test_fox_in_an_encoder_is_symmetric_and_blocks_agree_with_the_whole():
    fox = M.ForgetGateBias(tiny(causal=False))
    nn.init.normal_(fox.gate.weight)
    x, q, k = torch.randn(2, 12, 32), torch.randn(2, 4, 12, 8), torch.randn(2, 4, 12, 8)
    whole = fox(x, q, k)
    torch.testing.assert_close(whole, whole.transpose(-1, -2))
    torch.testing.assert_close(fox(x, q[:, :, 5:9], k, first_query=5), whole[:, :, 5:9])


# ---------------------------------------------------------------------------------------------- CoPE


def test_cope_positions_count_the_gates_and_interpolate():
    cope = M.ContextualPositionBias(tiny(cope_positions=8))
    k = torch.zeros(1, 1, 6, 8)
    k[..., 0] = torch.tensor([1.0, -1, 1, -1, 1, 1])  # keys 0, 2, 4, 5 "count"; 1 and 3 do not
    q = torch.zeros(1, 1, 6, 8)
    q[..., 0] = 1000.0  # gates sigmoid(+-1000 / sqrt 8): exactly 1 or 0
    p = cope.positions(q, k)[0, 0]
    counts = torch.tensor(
        [
            [1.0, 0, 0, 0, 0, 0],
            [1, 0, 0, 0, 0, 0],
            [2, 1, 1, 0, 0, 0],
            [2, 1, 1, 0, 0, 0],
            [3, 2, 2, 1, 1, 0],
            [4, 3, 3, 2, 2, 1],
        ]
    )
    torch.testing.assert_close(p, counts)  # p_ij: counted keys from j to i (words, not tokens)
    q[..., 0] = 0.0  # every gate 1/2: p_ij = (i - j + 1) / 2
    i, j = torch.arange(6)[:, None], torch.arange(6)[None, :]
    torch.testing.assert_close(cope.positions(q, k)[0, 0], ((i - j + 1) / 2).clamp(min=0).where(j <= i, 0.0))
    with torch.no_grad():
        cope.embeddings.copy_(torch.randn(8, 8))
    q = torch.randn(1, 1, 6, 8) * 0.1
    z = cope(None, q, k)[0, 0]
    p = cope.positions(q, k)[0, 0]
    read = q[0, 0] @ cope.embeddings  # q_i^T e[n] (6, 8)
    for i_, j_ in [(5, 0), (4, 2), (3, 3)]:
        lo, w = int(p[i_, j_].floor()), (p[i_, j_] - p[i_, j_].floor()).item()
        expected = (1 - w) * read[i_, lo] + w * read[i_, min(lo + 1, 7)]
        assert z[i_, j_].item() == pytest.approx(expected.item(), abs=1e-6)


def test_cope_caps_positions_at_its_table_and_blocks_agree_with_the_whole():
    cope = M.ContextualPositionBias(tiny(cope_positions=4))
    nn.init.normal_(cope.embeddings)
    q, k = torch.full((1, 1, 10, 8), 10.0), torch.ones(1, 1, 10, 8)  # gates ~ 1: p_ij = i - j + 1
    z = cope(None, q, k)
    read = q[0, 0, 0] @ cope.embeddings
    assert z[0, 0, 9, 0].item() == pytest.approx(read[3].item(), rel=1e-4)  # 10 keys, capped at P - 1 = 3
    q, k = torch.randn(2, 4, 10, 8), torch.randn(2, 4, 10, 8)
    torch.testing.assert_close(
        cope(None, q[:, :, 3:7], k[:, :, :8], first_query=3),
        cope(None, q, k)[:, :, 3:7, :8].where(
            torch.arange(8) <= torch.arange(3, 7)[:, None], cope(None, q[:, :, 3:7], k[:, :, :8], 3)
        ),
    )


# ---------------------------------------------------------------------------------------------- users' own, causality


def test_a_data_bias_that_reads_a_future_token_is_refused_by_check_causal():
    name = "test_reads_next_token"

    @md.register_pe(name)
    class NextTokenBias(M.DataDependentBias):
        """B_ij = x_{i+1} . x_j: the next token leaks into query i."""

        def __init__(self, cfg):
            super().__init__()
            self.n_head = cfg.n_head

        def forward(self, x, q, k, first_query=0):
            Tq, Tk = q.shape[2], k.shape[2]
            ahead = torch.cat([x[:, 1:], x[:, -1:]], dim=1)[:, first_query : first_query + Tq]  # x_{i+1}
            return (ahead @ x[:, :Tk].transpose(1, 2))[:, None].expand(-1, self.n_head, -1, -1)

    for fast, refiner in itertools.product([True, False], ["none", "dape"]):
        assert not md.check_causal(tiny(pe=name, refiner=refiner, fast=fast, attn_chunk=5), length=30)
    assert md.check_causal(tiny(pe="fox", refiner="dape"), length=30)


def test_a_user_data_bias_trains_with_every_refiner_and_a_wrong_shape_is_named():
    name = "test_content_window"

    @md.register_pe(name)
    class ContentGate(M.DataDependentBias):
        """B_ij = -softplus(a_h . x_j) (i - j): each key says how fast it is forgotten."""

        def __init__(self, cfg):
            super().__init__()
            self.rate = nn.Linear(cfg.n_embd, cfg.n_head)

        def forward(self, x, q, k, first_query=0):
            Tq, Tk = q.shape[2], k.shape[2]
            rate = nn.functional.softplus(self.rate(x[:, :Tk])).transpose(1, 2)[:, :, None, :]  # (b, h, 1, Tk)
            distance = (torch.arange(first_query, first_query + Tq)[:, None] - torch.arange(Tk)).clamp(min=0)
            return -rate * distance

    for refiner in BUILTIN_REFINERS:
        model, reference = perturbed_pair(tiny(pe=name, refiner=refiner, attn_chunk=5))
        assert_same_forward_and_gradients(model, reference, torch.randint(0, 64, (2, 20)))
        assert model.blocks[0].attn.data_bias.rate.weight.grad.abs().sum() > 0
        assert md.check_causal(model)

    @md.register_pe("test_data_bias_wrong_shape")
    class Wrong(M.DataDependentBias):
        def __init__(self, cfg):
            super().__init__()

        def forward(self, x, q, k, first_query=0):
            return torch.zeros(q.shape[1], q.shape[2], k.shape[2])  # no batch axis

    with pytest.raises(ValueError, match=r"test_data_bias_wrong_shape.*\(batch, n_head, Tq, Tk\)"):
        md.GPT(tiny(pe="test_data_bias_wrong_shape"))(torch.randint(0, 64, (2, 8)))


# ---------------------------------------------------------------------------------------------- per-layer, temperature


def test_a_per_layer_spec_rotates_only_the_layers_it_names():
    model = md.GPT(tiny(pe="rope,none,none", n_layer=4))
    assert model.layer_pes == ["rope", "none", "none", "rope"]
    idx = torch.randint(0, 64, (1, 10))
    with torch.no_grad():
        x, inputs = model.hidden_states(idx, upto_layer=0)
        for layer, name in enumerate(model.layer_pes):
            attn = model.blocks[layer].attn
            q, k, _ = attn.qkv(x, inputs[layer])
            plain_q, plain_k, _ = (t.view(1, 10, 4, 8).transpose(1, 2) for t in attn.c_attn(x).split(32, dim=2))
            assert torch.allclose(q, plain_q) == torch.allclose(k, plain_k) == (name != "rope"), (layer, name)
    with pytest.raises(ValueError, match="unknown pe 'ropee' in pe='rope,ropee'; valid choices:"):
        tiny(pe="rope,ropee")
    with pytest.raises(ValueError, match="absolute encoding"):
        tiny(pe="learned,rope")
    mixed = md.GPT(tiny(pe="alibi,cope", refiner="dape"))  # both kinds of bias; the refiner reads B
    assert mixed.blocks[0].attn.refiner.f.hidden_layer.in_features == 8
    assert mixed.blocks[1].attn.data_bias is not None and mixed.blocks[0].attn.data_bias is None


@pytest.mark.parametrize("kind", ["log_length", "learned"])
@pytest.mark.parametrize("causal", [True, False])
def test_the_temperature_multiplies_the_logits_by_its_factor_at_every_length(kind, causal):
    torch.manual_seed(0)
    tempered = md.GPT(tiny(pe="alibi", refiner="dape", temperature=kind, causal=causal)).eval()
    if kind == "learned":
        with torch.no_grad():
            tempered.blocks[0].attn.temperature.scale.copy_(torch.tensor([0.1, 0.2, 0.3, 0.5]))
    plain = md.GPT(tiny(pe="alibi", refiner="dape", causal=causal)).eval()
    plain.load_state_dict(tempered.state_dict(), strict=False)
    for T in (8, 16, 100):
        idx = torch.randint(0, 64, (1, T))
        refined = tempered.attention_maps(idx, layer=0)["refined"]
        unscaled = plain.attention_maps(idx, layer=0)["refined"]
        n = (torch.arange(1, T + 1) if causal else torch.full((T,), T)).double()
        if kind == "log_length":
            factor = (n.log() / math.log(16)).clamp(min=1)[None, :, None]
        else:
            factor = torch.tensor([0.1, 0.2, 0.3, 0.5], dtype=torch.double)[:, None, None] * n.log()[None, :, None]
        torch.testing.assert_close(refined[0], (unscaled[0] * factor).float())


def test_a_bad_temperature_is_named():
    with pytest.raises(ValueError, match="unknown temperature 'hot'; valid choices: none, log_length, learned"):
        tiny(temperature="hot")


# ---------------------------------------------------------------------------------------------- RoPE scaling family


def rotary(pe, **kw):
    cfg = tiny(pe=pe, **kw)
    return md.GPT(cfg).pe, cfg


def test_position_interpolation_divides_every_frequency_beyond_the_training_length():
    pi, _ = rotary("rope_pi")
    theta = pi.theta
    for T in (8, 16):
        torch.testing.assert_close(pi.frequencies_and_scale(T)[0], theta)
    cos, sin = pi(torch.arange(64), 64)  # s = 4: position 40 rotates as position 10 did
    torch.testing.assert_close(cos[40], torch.cos(10 * theta))
    torch.testing.assert_close(sin[40], torch.sin(10 * theta))


def test_ntk_scaling_grows_the_base():
    ntk, cfg = rotary("rope_ntk")
    d, s = 8, 4.0
    theta, _ = ntk.frequencies_and_scale(64)
    expected = (cfg.rope_base * s ** (d / (d - 2))) ** (-torch.arange(0, d, 2) / d)
    torch.testing.assert_close(theta, expected.float())
    assert theta[0] == ntk.theta[0] and theta[-1].item() == pytest.approx(ntk.theta[-1].item() / s, rel=1e-5)
    torch.testing.assert_close(ntk.frequencies_and_scale(16)[0], ntk.theta)


def test_xpos_scales_each_pair_by_zeta_to_the_distance():
    xpos, _ = rotary("xpos")
    pos = torch.arange(30)
    (q_cos, q_sin), (k_cos, k_sin) = xpos.rotations(pos, 30)
    zeta = (torch.arange(0, 8, 2) / 8 + 0.4) / 1.4
    q, k = torch.randn(1, 1, 30, 8), torch.randn(1, 1, 30, 8)
    rq, rk = M.apply_rotary(q, q_cos, q_sin), M.apply_rotary(k, k_cos, k_sin)
    rq, rk = M.PositionalInputs(pos, None, None, log_decay=xpos.log_decay(pos)).decayed(rq, rk)
    cos, sin = M.RotaryEmbedding.forward(xpos, pos, 30)
    plain_q, plain_k = M.apply_rotary(q, cos, sin), M.apply_rotary(k, cos, sin)
    for n, m in [(20, 3), (7, 7), (29, 0)]:
        decay = zeta ** ((n - m) / 512)  # per pair i, on both its channels
        expected = (plain_q[0, 0, n] * plain_k[0, 0, m] * decay.repeat(2)).sum()
        assert (rq[0, 0, n] @ rk[0, 0, m]).item() == pytest.approx(expected.item(), rel=1e-4)


def test_hope_keeps_only_the_frequencies_that_turn_within_the_training_length():
    hope, cfg = rotary("hope", n_embd=64)  # head size 16: 8 pairs
    theta = cfg.rope_base ** (-torch.arange(0, 16, 2) / 16)
    keep = 2 * math.pi / theta <= cfg.block_size
    assert 0 < keep.sum() < 8
    torch.testing.assert_close(hope.theta, torch.where(keep, theta, 0.0).float())
    cos, sin = hope(torch.arange(100), 100)
    assert torch.all(cos[:, ~keep] == 1) and torch.all(sin[:, ~keep] == 0)  # no position in those channels


# ---------------------------------------------------------------------------------------------- CLI and compare


def test_the_cli_takes_a_per_layer_spec_and_a_temperature_and_names_a_bad_one(capsys):
    from minidape import __main__ as cli

    parsed = cli.build_parser().parse_args(["train", "--pe", "rope,none", "--temperature", "learned", "--out", "x"])
    assert (parsed.pe, parsed.temperature) == ("rope,none", "learned")
    for flags in (["--pe", "rope,nope"], ["--temperature", "hot"]):
        with pytest.raises(SystemExit) as exit_:
            cli.build_parser().parse_args(["train", *flags, "--out", "x"])
        assert exit_.value.code == 2
        assert flags[1].split(",")[-1] in capsys.readouterr().err


def test_compare_takes_the_new_study_models_by_label():
    from minidape import study
    from minidape.study.comparison import parse_model, resolve_pe

    for label in ("FoX", "DAPE-FoX", "CoPE", "RoPE/NoPE hybrid"):
        name, overrides = parse_model(label)
        assert name == label and overrides == study.MODELS[label] and md.check_causal(tiny(**overrides), length=24)
    assert resolve_pe("rope,none") == ("rope,none", None)
    assert parse_model("rope,none+dape") == ("rope,none+dape", {"pe": "rope,none", "refiner": "dape"})
    with pytest.raises(ValueError, match="unknown pe 'Fox'.*several of them joined by commas"):
        parse_model("Fox")
    with pytest.raises(ValueError, match="unknown pe"):
        parse_model("DAPE1x3-Kerple without tril")  # the leaky model is C4's, never a baseline
