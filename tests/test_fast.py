"""The fast path (minidape/fast.py) computes what the reference (minidape/model.py, fast=False) computes, and
model.py runs alone, copied out of the package."""

import copy
import functools
import itertools
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
from test_model import BUILTIN_COMBINATIONS, BUILTIN_PES, BUILTIN_REFINERS, register_window_pe, tiny, valid_combination

import minidape as md
from minidape import fast, fast_encodings, fast_refiners
from minidape import model as M


def fast_and_reference(cfg):
    """The same model twice, same weights: the fast path and the reference form."""
    torch.manual_seed(0)
    model = md.GPT(cfg)
    for block in model.blocks:  # refiner weights large enough that their mistakes would show
        for p in block.attn.refiner.parameters() if block.attn.refiner is not None else []:
            nn.init.normal_(p, std=0.3)
    reference = copy.deepcopy(model)
    reference.cfg.fast = False  # the copy's own config, shared by its layers
    assert model.cfg.fast and M.SelfAttention.fast_attention is fast.attention
    return model.train(), reference.train()


def assert_same_forward_and_gradients(model, reference, idx):
    logits, loss = model(idx, idx)
    reference_logits, reference_loss = reference(idx, idx)
    torch.testing.assert_close(logits, reference_logits, atol=2e-5, rtol=1e-4)
    loss.backward()
    reference_loss.backward()
    named = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        expected = named[name].grad
        assert (p.grad is None) == (expected is None), name
        if expected is not None:
            assert torch.isfinite(p.grad).all(), name
            # float32 rounding is relative to the gradient's own scale (some are ~1e-5 at initialisation)
            scale = expected.abs().max().item()
            torch.testing.assert_close(
                p.grad, expected, atol=1e-4 * scale + 1e-9, rtol=1e-3, msg=lambda m: f"{name}: {m}"
            )


@pytest.mark.parametrize("causal", [True, False], ids=["decoder", "encoder"])
@pytest.mark.parametrize("pe,refiner", BUILTIN_COMBINATIONS)
def test_fast_equals_reference_forward_and_every_gradient(pe, refiner, causal):
    # short: one query block; long: blocks of 7 rows (beyond block_size where the PE allows)
    if not valid_combination(pe, refiner, causal):
        with pytest.raises(ValueError, match="causal must be True"):
            tiny(pe=pe, refiner=refiner, causal=causal)
        return
    long_T = 16 if pe == "learned" else 40
    for T, chunk in ((12, 0), (long_T, 7)):
        model, reference = fast_and_reference(tiny(pe=pe, refiner=refiner, causal=causal, attn_chunk=chunk))
        idx = torch.randint(0, 64, (2, T), generator=torch.Generator().manual_seed(T))
        assert_same_forward_and_gradients(model, reference, idx)


def assert_same_under_bf16(pe: str, refiner: str, device: str, monkeypatch):
    """Fast path and reference under bfloat16 autocast on `device`: the same precision where softmax is taken
    (the dtype of the refined scores, in every layer), and logits, loss and gradients within bf16 tolerances:
    logits within 2e-2 (bf16 holds ~3 significant digits; the two paths round in different places, e.g. the
    fast path scales q before the matmul), the loss within 1e-2, each gradient within 5% of itself plus 1% of
    the model's largest gradient (a refiner's output bias has an exact gradient of 0: only rounding is left)."""
    model, reference = (m.to(device) for m in fast_and_reference(tiny(pe=pe, refiner=refiner)))
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1)).to(device)
    softmax_dtypes = {}  # the dtypes softmax receives, in every layer, per path
    softmax = torch.nn.functional.softmax
    outputs = []
    for path, m in (("fast", model), ("reference", reference)):
        seen = softmax_dtypes.setdefault(path, [])
        monkeypatch.setattr(
            torch.nn.functional,
            "softmax",
            lambda x, *args, seen=seen, **kwargs: seen.append(x.dtype) or softmax(x, *args, **kwargs),
        )
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            logits, loss = m(idx, idx)
        loss.backward()
        outputs.append((logits.float(), loss.float()))
    monkeypatch.undo()
    fast_dtypes, reference_dtypes = softmax_dtypes["fast"], softmax_dtypes["reference"]
    if refiner != "none":  # without a refiner the fast path runs SDPA: no F.softmax
        assert fast_dtypes == reference_dtypes, f"softmax over {fast_dtypes} (fast), {reference_dtypes} (reference)"
    (logits, loss), (reference_logits, reference_loss) = outputs
    torch.testing.assert_close(logits, reference_logits, atol=2e-2, rtol=0)
    assert abs(loss.item() - reference_loss.item()) < 1e-2
    named = dict(reference.named_parameters())
    scale = max(p.grad.abs().max().item() for p in reference.parameters() if p.grad is not None)
    for name, p in model.named_parameters():
        if named[name].grad is not None:
            torch.testing.assert_close(
                p.grad, named[name].grad, rtol=5e-2, atol=1e-2 * scale, msg=lambda m: f"{name}: {m}"
            )


@pytest.mark.parametrize("pe,refiner", BUILTIN_COMBINATIONS)
def test_fast_equals_reference_under_cpu_bf16_autocast(pe, refiner, monkeypatch):
    assert_same_under_bf16(pe, refiner, "cpu", monkeypatch)


@pytest.mark.filterwarnings("error")  # the fused form, not model.py's taken after a failed first-use check
@pytest.mark.parametrize("pe", ["kerple_log", "rope"], ids=["bias", "no-bias"])
@pytest.mark.parametrize("refiner", [r for r in BUILTIN_REFINERS if r != "none"])
def test_the_cell_mlp_in_slices_of_cells_equals_the_reference(refiner, pe, monkeypatch):
    # On the CPU the cell MLP runs in cache-sized slices of cells; tiny models fit one slice, so cut them small
    # (11 cells, not dividing any block's cells) and check that a block really went through several.
    monkeypatch.setenv("MINIDAPE_NATIVE", "0")  # the PyTorch form: the compiled kernel has no slices
    monkeypatch.setattr(fast_refiners, "HIDDEN_SLICE_ELEMENTS", 1)
    monkeypatch.setattr(fast_refiners, "MIN_SLICE_CELLS", 11)
    counts = []
    cell_slices = fast_refiners.cell_slices
    monkeypatch.setattr(
        fast_refiners,
        "cell_slices",
        lambda x, width: counts.append(len(cell_slices(x, width))) or cell_slices(x, width),
    )
    model, reference = fast_and_reference(tiny(pe=pe, refiner=refiner, attn_chunk=7))
    assert_same_forward_and_gradients(
        model, reference, torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(1))
    )
    assert max(counts) > 1


@pytest.mark.parametrize("refiner", ["none", "dape", "conv"])
def test_a_bias_too_large_to_precompute_is_computed_per_block_alike(refiner, monkeypatch):
    monkeypatch.setattr(fast, "FULL_BIAS_ELEMENTS", 0)  # as at T = 16k: the bias per block and layer
    model, reference = fast_and_reference(tiny(pe="kerple_log", refiner=refiner, attn_chunk=9))
    calls = []
    model.pe.register_forward_hook(lambda module, args, out: calls.append(out.shape))
    assert_same_forward_and_gradients(model, reference, torch.randint(0, 64, (2, 30)))
    # 4 blocks in each of 2 layers (each block one row of distances, fast_encodings.distance_bias), plus the
    # module's own forward on the first block, compared at first use; none full size
    assert len(calls) == 2 * 4 + 1 and all(shape[1] < 30 for shape in calls)


@pytest.mark.parametrize("refiner", BUILTIN_REFINERS)
def test_fast_equals_reference_with_a_hard_window_and_nan_on_future_cells(refiner):
    name = register_window_pe("window", width=5, future=float("nan"))
    model, reference = fast_and_reference(tiny(pe=name, refiner=refiner, attn_chunk=6))
    assert_same_forward_and_gradients(model, reference, torch.randint(0, 64, (2, 25)))


def test_a_user_refiner_runs_in_the_fast_blocks_and_matches_the_reference():
    name = "test_fast_user_refiner"

    @md.register_refiner(name)
    class Gate(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.gate = nn.Parameter(torch.full((cfg.n_head, 1, 1), 0.5))

        def forward(self, scores, bias, mask):
            return scores * self.gate + (0 if bias is None else bias)

    model, reference = fast_and_reference(tiny(pe="alibi", refiner=name, attn_chunk=5))
    assert_same_forward_and_gradients(model, reference, torch.randint(0, 64, (2, 23)))


def test_the_default_model_runs_the_fast_path_and_fast_false_does_not(monkeypatch):
    calls = []
    real = fast.attention
    monkeypatch.setattr(M.SelfAttention, "fast_attention", lambda *args: calls.append(1) or real(*args))
    idx = torch.randint(0, 64, (1, 10))
    md.GPT(tiny(pe="kerple_log", refiner="dape"))(idx)
    assert len(calls) == 2  # one per layer
    md.GPT(tiny(pe="kerple_log", refiner="dape", fast=False))(idx)
    assert len(calls) == 2


def test_checkpoints_load_either_way():
    torch.manual_seed(0)
    model = md.GPT(tiny(pe="t5", refiner="conv"))
    reference = md.GPT(tiny(pe="t5", refiner="conv", fast=False))
    assert list(model.state_dict()) == list(reference.state_dict())
    reference.load_state_dict(model.state_dict())
    idx = torch.randint(0, 64, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(idx)[0], reference.eval()(idx)[0], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("refiner", ["dape", "none"])
def test_cpu_query_blocks_keep_a_block_bounded_whatever_the_length(refiner):
    """Blocks grow with T (fewer blocks) but a block's widest tensor, (batch, channels, rows, T), stays under the
    CPU budget unless it is already at the 16-row minimum: evaluation memory is linear in T, not quadratic."""
    cfg = tiny(pe="kerple_log", refiner=refiner, refiner_width=32)
    channels = cfg.refiner_width if refiner == "dape" else cfg.n_head
    for batch in (1, 2, 8, 32):
        for T in (100, 128, 512, 2048, 16384):
            rows = fast.rows_per_query_block(cfg, refiner != "none", batch, T, torch.device("cpu"))
            if refiner == "none" and batch * cfg.n_head * T * T <= fast.FULL_BIAS_ELEMENTS:
                assert rows == T  # small: one block through the fused kernel
                continue
            assert rows >= 16 and (rows == 16 or batch * channels * rows * T <= fast.QUERY_BLOCK_ELEMENTS["cpu"])
            assert rows < T


STANDALONE = textwrap.dedent("""
    import sys
    sys.path.insert(0, ".")
    import torch
    import model as M
    assert "minidape" not in sys.modules, "model.py imported the package"
    assert M.SelfAttention.fast_attention is None
    torch.manual_seed(0)
    trained = 0
    for pe in M.PE_NAMES:
        for refiner in M.REFINER_NAMES:
            if issubclass(M.PE_REGISTRY[pe], M.AttentionWeights) and refiner != "none":
                continue  # PaTH, stick-breaking: their own weights, nothing to refine (GPTConfig refuses)
            cfg = M.GPTConfig(vocab_size=32, n_layer=2, n_head=2, n_embd=16, block_size=12, pe=pe, refiner=refiner)
            model = M.GPT(cfg)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
            idx = torch.randint(0, 32, (2, 12))
            before = [p.detach().clone() for p in model.parameters()]
            _, loss = model(idx, idx)
            loss.backward()
            optimizer.step()
            assert torch.isfinite(loss), (pe, refiner)
            assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters())), (pe, refiner)
            assert M.check_causal(cfg), (pe, refiner)
            trained += 1
    print("trained", trained, "of", len(M.PE_NAMES) * len(M.REFINER_NAMES))
""")


def test_model_py_runs_alone_in_an_empty_folder(tmp_path):
    """Copied out of the package with nothing else, model.py imports (torch and einops only), builds, trains a
    step and passes check_causal for every pe x refiner: the "copy one file into a Colab" property."""
    shutil.copy(Path(M.__file__), tmp_path / "model.py")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", STANDALONE], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr
    own_weights = [pe for pe in BUILTIN_PES if issubclass(M.PE_REGISTRY[pe], M.AttentionWeights)]
    combinations = (len(BUILTIN_PES) - len(own_weights)) * len(BUILTIN_REFINERS) + len(own_weights)
    assert f"trained {combinations} of" in out.stdout


def test_a_refiner_edited_in_model_py_runs_its_reference_form_with_a_warning(monkeypatch):
    """The fused form is checked against the module's own forward before first use: a student who edits DAPE's
    equation in model.py (here: drops the + B) gets what the edited file says, and is told why it is slower."""
    monkeypatch.setattr(
        M.DAPERefiner,
        "forward",
        lambda self, scores, bias, mask: scores + self.f(M.stack_scores_and_bias(scores, bias)),
    )
    model, reference = fast_and_reference(tiny(pe="kerple_log", refiner="dape", attn_chunk=7))
    with pytest.warns(UserWarning, match=r"DAPERefiner differs from its fused form.*reference form"):
        assert_same_forward_and_gradients(model, reference, torch.randint(0, 64, (2, 30)))


@pytest.mark.parametrize(
    "refiner,edit",
    [
        ("dape", lambda r: r.f.mlp.__setitem__(1, nn.LeakyReLU(0.2))),
        ("dape_add", lambda r: r.f.mlp.__setitem__(1, nn.GELU())),
        ("conv", lambda r: setattr(r.conv1, "padding_mode", "circular")),
    ],
)
def test_a_refiner_whose_structure_changed_runs_its_reference_form(refiner, edit):
    model, reference = fast_and_reference(tiny(pe="alibi", refiner=refiner, attn_chunk=7))
    for m in (model, reference):
        for block in m.blocks:
            edit(block.attn.refiner)
    with pytest.warns(UserWarning, match="reference form"):
        assert_same_forward_and_gradients(model, reference, torch.randint(0, 64, (2, 30)))


def test_an_unedited_refiner_keeps_its_fused_form_without_a_warning(recwarn):
    model = md.GPT(tiny(pe="kerple_log", refiner="conv"))
    model(torch.randint(0, 64, (2, 20)))
    assert not [w for w in recwarn if "fast path" in str(w.message)]
    assert all(fast.block_form(block.attn, True) is fast_refiners.conv for block in model.blocks)


# Position-only biases: FlexAttention's path (a bias that reads the data stays on the query blocks).
BIAS_PES = [pe for pe in BUILTIN_PES if issubclass(M.PE_REGISTRY[pe], M.AdditiveBias)]


def flex_and_reference_attention(model, idx, compiled: bool):
    """The first layer's attention of ``model`` through FlexAttention and through the reference form."""
    layer = model.blocks[0].attn
    x, layer_inputs = model.hidden_states(idx, upto_layer=0)  # each layer's positional inputs
    positional = layer_inputs[0]
    q, k, v = layer.qkv(model.blocks[0].ln_1(x), positional)
    T = idx.shape[1]
    flex = fast.flex_bias_attention(q, k, v, positional.full_bias, model.cfg.causal, compiled=compiled)
    mask = M.attention_mask(T, model.cfg.causal, idx.device)
    return flex, M.attention(q, k, v, positional.full_bias, mask)[0]


@pytest.mark.parametrize("pe,causal", [(pe, True) for pe in BIAS_PES] + [("kerple_log", False)])
def test_flex_attention_equals_the_reference_on_the_cpu(pe, causal):
    """FlexAttention's bias path (CUDA training) computes the reference's attention. torch 2.13 runs it on the
    CPU forward only (its unfused form, seconds a call; no backward there): gradients are checked in
    tests/test_gpu.py."""
    torch.manual_seed(0)
    model = md.GPT(tiny(pe=pe, causal=causal)).eval()
    with torch.no_grad():
        for p in model.pe.parameters():  # a bias far from its initial values
            p.abs_().mul_(3.0)
        idx = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(0))
        flex, reference = flex_and_reference_attention(model, idx, compiled=False)
    torch.testing.assert_close(flex, reference, atol=1e-5, rtol=1e-4)


def test_flex_attention_is_chosen_only_for_cuda_training_of_a_long_bias_without_refiner(monkeypatch):
    def chosen(pe="alibi", refiner="none", device="cuda", T=256, dropout=0.0, grad=True, head_size=16):
        model = md.GPT(tiny(pe=pe, refiner=refiner, block_size=T))
        q = SimpleNamespace(device=torch.device(device), shape=(1, 4, T, head_size))  # where, how long, how wide
        with torch.set_grad_enabled(grad):
            return fast.uses_flex(model.blocks[0].attn, q, model.positional_inputs(torch.arange(T), model.pe), dropout)

    assert chosen() and chosen(pe="kerple_log", T=512)
    assert not chosen(device="cpu") and not chosen(T=128) and not chosen(grad=False)
    assert not chosen(refiner="dape") and not chosen(pe="rope") and not chosen(dropout=0.1)
    assert not chosen(head_size=8) and not chosen(pe="fox")  # a bias that reads the data: query blocks
    monkeypatch.setattr(fast, "FLEX_ON_CUDA", False)
    assert not chosen()


@pytest.mark.parametrize(
    "module,maker,pe", [(fast, "float_mask", "kerple_log"), (fast_encodings, "rotary_turns", "rope")]
)
def test_what_the_layers_share_is_made_once_per_forward(module, maker, pe, monkeypatch):
    """Every layer adds the same bias (without a refiner) or rotates by the same angles: its SDPA mask, or the
    rotation's tables, are made by the first layer of a forward and reused by the others (a mask once per query
    block), and a new forward makes its own (the bias may have been trained in between)."""
    made = []
    make = getattr(module, maker)
    monkeypatch.setattr(module, maker, lambda *args: made.append(1) or make(*args))
    model = md.GPT(tiny(pe=pe, n_layer=3))
    idx = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    model(idx, idx)[1].backward()
    assert len(made) == 1
    model(idx, idx)
    assert len(made) == 2
    if maker == "float_mask":
        md.GPT(tiny(pe=pe, n_layer=3, attn_chunk=4))(idx, idx)
        assert len(made) == 2 + 3  # three query blocks, each once


# Rotary encodings: q and k rotated in one product (fast_encodings.qkv); learnable biases on the CPU
# (fast._BiasedAttention).
ROTARY_PES = [pe for pe in BUILTIN_PES if issubclass(M.PE_REGISTRY[pe], M.RotaryEmbedding)]


def fast_and_model_py_qkv(layer, x, positional, grad_scores, grad_v) -> list[list]:
    """For fast_encodings.qkv, then the layer's own qkv: the scores q k^T, v, and the gradients of x and of c_attn's
    weight and bias (None where they need none) after a backward from the given gradients of scores and v."""
    results = []
    for qkv in (fast_encodings.qkv, M.SelfAttention.qkv):
        x.grad = layer.c_attn.weight.grad = layer.c_attn.bias.grad = None
        q, k, v = qkv(layer, x, positional)
        scores = q @ k.transpose(-2, -1)
        torch.autograd.backward((scores, v), (grad_scores, grad_v))
        results.append([scores.detach(), v.detach(), x.grad, layer.c_attn.weight.grad, layer.c_attn.bias.grad])
    return results


@pytest.mark.parametrize("pe", ROTARY_PES)
def test_rotating_q_and_k_as_complex_numbers_equals_model_py_forward_and_gradients(pe):
    """fast_encodings.qkv against the layer's own qkv (model.apply_rotary per tensor), on the same input: the
    scores q k^T and v it gives (its q and k hold each head's channels in another order, the same for both), and the
    gradients of the input and of c_attn through them (xpos rotates q and k differently)."""
    torch.manual_seed(0)
    model = md.GPT(tiny(pe=pe))
    layer = model.blocks[0].attn
    positional = model.positional_inputs(torch.arange(12), model.pe)
    x = torch.randn(3, 12, 32, requires_grad=True)
    results = fast_and_model_py_qkv(layer, x, positional, torch.randn(3, 4, 12, 12), torch.randn(3, 4, 12, 8))
    for got, expected in zip(*results):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("frozen", ["projection", "input", "nothing"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_the_rotated_projection_gives_each_gradient_that_is_asked_for_in_the_model_dtype(frozen, dtype):
    """fast_encodings.qkv writes c_attn's backward itself (the rotation runs in place on its output): against the
    layer's own qkv with a frozen projection (fine-tuning around it), an input without a gradient, and a model
    in float64 or bfloat16 (no complex bfloat16: the products in float32), every gradient that exists is the
    reference's and in its tensor's dtype, and none is made for what needs none."""
    torch.manual_seed(0)
    model = md.GPT(tiny(pe="rope")).to(dtype)
    layer = model.blocks[0].attn
    layer.c_attn.requires_grad_(frozen != "projection")
    positional = model.positional_inputs(torch.arange(12), model.pe)
    x = torch.randn(3, 12, 32, dtype=dtype, requires_grad=frozen != "input")
    grad_scores, grad_v = torch.randn(3, 4, 12, 12, dtype=dtype), torch.randn(3, 4, 12, 8, dtype=dtype)
    results = fast_and_model_py_qkv(layer, x, positional, grad_scores, grad_v)
    tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-5
    for got, expected in zip(*results):
        assert (got is None) == (expected is None)
        if got is not None:
            assert got.dtype == dtype
            torch.testing.assert_close(got, expected, atol=tolerance * expected.abs().max(), rtol=tolerance)
    assert (results[0][2] is None) == (frozen == "input") and (results[0][3] is None) == (frozen == "projection")


def test_the_complex_rotation_is_one_permutation_of_q_and_k_channels_per_head():
    """What the fast path's q and k are: the reference's, with each head's channels in pair_order's order (so a
    consumer that reads them other than through q . k would see it; fast_encodings.qkv leaves those to model.py)."""
    torch.manual_seed(0)
    model = md.GPT(tiny(pe="rope"))
    layer = model.blocks[0].attn
    positional = model.positional_inputs(torch.arange(12), model.pe)
    x = torch.randn(2, 12, 32)
    fast_q, fast_k, _ = fast_encodings.qkv(layer, x, positional)
    q, k, _ = M.SelfAttention.qkv(layer, x, positional)
    within = fast_encodings.pair_order(layer.n_head, layer.head_size, "cpu")[: layer.head_size]
    torch.testing.assert_close(fast_q, q[..., within], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(fast_k, k[..., within], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(fast_q, q, atol=1e-3)  # the order is not the identity


def test_a_projection_with_a_hook_takes_model_py_form_and_its_hook_runs():
    torch.manual_seed(0)
    model = md.GPT(tiny(pe="rope"))
    layer = model.blocks[0].attn
    positional = model.positional_inputs(torch.arange(12), model.pe)
    seen = []
    layer.c_attn.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    x = torch.randn(2, 12, 32)
    fast_q, _, _ = fast_encodings.qkv(layer, x, positional)
    torch.testing.assert_close(fast_q, M.SelfAttention.qkv(layer, x, positional)[0])  # the channels in their order
    assert seen == [(2, 12, 96)] * 2


def test_a_rotation_that_needs_a_gradient_takes_model_py_form():
    torch.manual_seed(0)
    model = md.GPT(tiny(pe="rope"))
    layer = model.blocks[0].attn
    angle = torch.zeros(12, 4, requires_grad=True)
    rotation = (angle.cos(), angle.sin())
    positional = M.PositionalInputs(torch.arange(12), (rotation, rotation), None)
    q, _, _ = fast_encodings.qkv(layer, torch.randn(2, 12, 32), positional)
    q.sum().backward()
    assert angle.grad is not None  # fast_encodings.qkv's own rotation would give it no gradient


LEARNABLE_BIAS_PES = ["kerple_log", "kerple_power", "t5", "fire"]


@pytest.mark.parametrize("pe", LEARNABLE_BIAS_PES)
def test_a_learnable_bias_takes_the_biased_attention_in_blocks_and_equals_the_reference(pe, monkeypatch):
    """In CPU training a learnable bias without refiner goes through _BiasedAttention, in query blocks, and
    computes the reference's forward and every gradient (the bias's parameters included)."""
    calls = []
    apply = fast._BiasedAttention.apply
    monkeypatch.setattr(fast._BiasedAttention, "apply", lambda *args: calls.append(args[0].shape[2]) or apply(*args))
    monkeypatch.setattr(fast, "BIASED_BLOCK_ELEMENTS", 2 * 4 * 40 * 16)  # 16-row blocks at batch 2, T = 40
    model, reference = fast_and_reference(tiny(pe=pe, block_size=40))
    idx = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(1))
    assert_same_forward_and_gradients(model, reference, idx)
    assert calls == [8, 16, 16] * 2  # widest last block first, in each of the two layers
    with torch.no_grad():  # nothing to learn: SDPA's fused kernel
        model(idx)
    assert len(calls) == 6


def test_a_fixed_bias_and_a_bias_with_dropout_keep_sdpa(monkeypatch):
    monkeypatch.setattr(fast._BiasedAttention, "apply", lambda *args: pytest.fail("took _BiasedAttention"))
    idx = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    for cfg in (tiny(pe="alibi"), tiny(pe="kerple_log", dropout=0.1)):
        md.GPT(cfg).train()(idx, idx)[1].backward()


@pytest.mark.parametrize("q_start,T", [(0, 12), (0, 20), (10, 20)])
def test_fire_runs_its_mlp_once_per_distance_below_the_threshold_and_equals_its_forward(q_start, T):
    """fast_encodings.fire_bias: the MLP on each distance once, laid out as a Toeplitz matrix (consecutive
    positions) or gathered (any), for the queries below the threshold (16 = block_size, moved to 14.4 by a learned
    scale), the module's own rows from there on; the same bias and gradients as FIREBias.forward (decoder and
    encoder), all rows below, some, or a block of queries that starts below and ends past it."""
    for causal, consecutive in itertools.product((True, False), (True, False)):
        torch.manual_seed(0)
        fire = md.GPT(tiny(pe="fire", causal=causal)).pe
        with torch.no_grad():
            fire.c.fill_(0.7)  # away from the initial values
            fire.threshold_scale.fill_(0.9)  # L = 14.4: as training moves it
        q_pos, k_pos = torch.arange(q_start, T), torch.arange(T)
        results = []
        for form in (functools.partial(fast_encodings.fire_bias, consecutive=consecutive), M.FIREBias.forward):
            fire.zero_grad()
            b = form(fire, q_pos, k_pos)
            (b * torch.linspace(-1, 1, b.numel()).view(b.shape)).sum().backward()
            results.append([b.detach()] + [p.grad.clone() for p in fire.parameters()])
        for got, expected in zip(*results):
            torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


def test_fire_takes_its_own_forward_where_no_query_is_below_the_threshold_or_positions_are_out_of_order():
    fire = md.GPT(tiny(pe="fire")).pe
    calls = []
    fire.mlp.register_forward_hook(lambda module, args, out: calls.append(tuple(args[0].shape)))
    fire_bias = fast_encodings.fire_bias
    assert fire_bias(fire, torch.arange(16, 20), torch.arange(20), True) is None  # 16 = block_size: L
    assert fire_bias(fire, torch.tensor([17, 3, 4]), torch.arange(20), False) is None  # a row past L comes first
    assert calls == []
    assert fire_bias(fire, torch.arange(14, 18), torch.arange(18), True).shape == (4, 4, 18)
    assert calls == [(16, 1), (2, 18, 1)]  # distances 0..15 once (rows 14, 15); rows 16, 17 cell by cell


@pytest.mark.parametrize(
    "pe,module,form",
    [
        ("fire", M.FIREBias, "fire_bias"),
        ("t5", M.T5Bias, "distance_bias"),
        ("kerple_log", M.KerpleLogBias, "distance_bias"),
    ],
)
def test_an_edited_bias_runs_its_own_forward_with_a_warning(pe, module, form, monkeypatch):
    model = md.GPT(tiny(pe=pe))
    forward = module.forward
    # another equation, one that also depends on where the query is (so not on the distance alone)
    monkeypatch.setattr(module, "forward", lambda self, q, k: forward(self, q, k) * 2 + 0.01 * q[:, None])
    idx = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with pytest.warns(UserWarning, match=f"{module.__name__}'s forward differs from its fast form"):
        model(idx, idx)
    pos = torch.arange(12)
    assert torch.equal(M.GPT.fast_bias(model.pe, pos, pos), model.pe(pos, pos))
    # once found to differ, the fast form is not computed again only to be thrown away
    monkeypatch.setattr(fast_encodings, form, lambda *args: pytest.fail(f"{form} ran again"))
    model(idx, idx)


@pytest.mark.parametrize("pe", [pe for pe in BUILTIN_PES if M.PE_REGISTRY[pe] in fast_encodings.TRANSLATION_INVARIANT])
@pytest.mark.parametrize(
    "q_pos,k_pos", [(range(20), range(20)), (range(150, 300), range(300)), (range(5, 9), range(3, 40))]
)
def test_a_bias_of_the_distance_alone_is_one_row_of_distances_laid_out_and_equals_its_forward(pe, q_pos, k_pos):
    """fast_encodings.distance_bias: the module's own forward on one row holding each distance once (from the
    largest, query 0 against key 0, to the smallest, query last against key last), laid out by toeplitz; the
    same bias and parameter gradients as the module's forward on every cell, decoder and encoder, a training
    length, a query block past T5's max_distance, keys that start later and reach past the queries."""
    q_pos, k_pos = torch.tensor(q_pos), torch.tensor(k_pos)
    for causal in (True, False):
        torch.manual_seed(0)
        encoding = md.GPT(tiny(pe=pe, causal=causal)).pe
        for p in encoding.parameters():  # away from the initial values
            p.data.uniform_(0.2, 1.5)
        cells = []
        encoding.register_forward_hook(lambda module, args, out: cells.append(out[0].numel()))
        results = []
        for form in (fast_encodings.distance_bias, lambda module, q, k: module(q, k)):
            encoding.zero_grad()
            b = form(encoding, q_pos, k_pos)
            (b * torch.linspace(-1, 1, b.numel()).view(b.shape)).sum().backward() if b.requires_grad else None
            results.append([b.detach()] + [p.grad.clone() for p in encoding.parameters()])
        for got, expected in zip(*results):
            torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
        assert results[0][0].shape == (4, len(q_pos), len(k_pos))
        assert cells == [len(q_pos) + len(k_pos) - 1, len(q_pos) * len(k_pos)]  # one row of distances, then all


def test_positions_that_are_not_consecutive_take_the_gather_or_the_module_and_equal_its_forward():
    """Random positions (a sorted subset, in training) are not one row of distances: T5 gathers from its table,
    Kerple runs its own forward; the bias is the module's either way."""
    positions = torch.tensor([0, 3, 4, 9, 15, 16, 30])
    for pe in ("t5", "kerple_log"):
        encoding = md.GPT(tiny(pe=pe)).pe
        torch.testing.assert_close(fast_encodings.bias(encoding, positions, positions), encoding(positions, positions))
        assert not fast_encodings._consecutive(positions) and fast_encodings._consecutive(torch.arange(4, 9))
        no_query = fast_encodings.bias(encoding, torch.arange(0), torch.arange(5))  # an empty block: the module's
        assert no_query.shape == (4, 0, 5) and not fast_encodings._consecutive(torch.arange(0))


def test_t5_gathers_its_buckets_from_the_table_and_equals_its_forward():
    """fast_encodings.t5_bias: the (nh, 32) table gathered by bucket into (nh, Tq, Tk); the same bias and table
    gradient as T5Bias.forward (an nn.Embedding lookup, permuted), decoder and encoder, at lengths past max_distance."""
    for causal in (True, False):
        torch.manual_seed(0)
        t5 = md.GPT(tiny(pe="t5", causal=causal)).pe
        q_pos, k_pos = torch.arange(150, 300), torch.arange(300)
        results = []
        for form in (fast_encodings.t5_bias, M.T5Bias.forward):
            t5.zero_grad()
            b = form(t5, q_pos, k_pos)
            (b * torch.linspace(-1, 1, b.numel()).view(b.shape)).sum().backward()
            results.append([b.detach(), t5.table.weight.grad.clone()])
        for got, expected in zip(*results):
            torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
        assert results[0][0].shape == (4, 150, 300)


@pytest.mark.parametrize("pe", ["rope", "xpos", "t5", "fire", "kerple_log"])
def test_a_compiled_model_trains_as_the_eager_one(pe):
    """`train --compile` wraps the model in torch.compile: the fast path's forms that the compiler cannot trace
    (RoPE's complex views) step aside for model.py's, and the loss and gradients are the eager model's."""
    torch.manual_seed(0)
    model = md.GPT(tiny(pe=pe))
    eager = md.GPT(tiny(pe=pe))
    eager.load_state_dict(model.state_dict())
    idx = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    compiled_loss = torch.compile(model, backend="aot_eager")(idx, idx)[1]
    compiled_loss.backward()
    eager_loss = eager(idx, idx)[1]
    eager_loss.backward()
    torch.testing.assert_close(compiled_loss, eager_loss)
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=1e-5, msg=lambda m: f"{name}: {m}")
