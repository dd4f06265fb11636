r"""The fast path of ``model.py``: the same attention, computed faster and in memory linear in T.

``model.py`` writes every refiner as the papers do, over the full ``(batch, h, T, T)`` scores, and knows nothing of
this file, which its last lines load: it installs ``attention`` below as ``model.SelfAttention.fast_attention``, used
by a model with ``GPTConfig(fast=True)`` (the default). It computes the same numbers (to float rounding, forward and
gradients; ``tests/test_fast.py``) from the same parameters: it reads the reference modules' weights by name
(``HeadMLP.hidden_layer``, ``ConvRefiner.conv1``, ...), so ``state_dict`` keys and checkpoints do not depend on it.

How, in order of what it saves:
  - **Query blocks** (``attend_in_query_blocks``): softmax is per query row and the built-in refiners act on
    each row alone, so attention runs on blocks of query rows, each against only the keys it can see; the
    causal upper triangle beyond a block is never computed, and the refiner's hidden activations of one block
    fit a memory budget. A user's refiner runs in blocks only when it declares ``row_local = True``; any other
    runs in the reference form over the whole sequence (``runs_in_query_blocks``).
  - **The refiners' fused forms** (``fast_refiners.py``): DAPE's $f$ and DAPE-V2's ``1 x kernel`` convolutions as
    one MLP at every cell, on the CPU a compiled kernel that keeps the hidden layer in registers (``native.py``).
  - **Precomputed bias rows**: the bias is computed once for all layers and cut into the blocks' rows.
  - **SDPA** (``F.scaled_dot_product_attention``) whenever there is no refiner; a bias and the mask as one float
    mask with a batch axis, made once per forward (``per_forward``), so that the CPU's fused kernel takes it.
  - **A learnable bias on the CPU** (``_BiasedAttention``): scores, bias and softmax in query blocks, the
    causal half skipped, where SDPA would take its unfused kernel.
  - **FlexAttention** for a bias without a refiner in CUDA training (``uses_flex``): the bias read inside the
    kernel, the blocks above the diagonal skipped.

The fused forms (``FUSED_FORMS``) rely on the structure of the reference modules. Before a layer first uses
one, ``block_form`` checks that structure and compares the fused form with the module's own ``forward`` on a
small input: a refiner edited in ``model.py`` (another activation, another equation) runs in its reference
form, with a warning, instead of silently computing something else. The position-only encodings' own fast
forms (RoPE's rotation, the biases of the distance alone) are in ``fast_encodings.py``.
"""

from __future__ import annotations

import functools
import math
import warnings
import weakref
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from .fast_refiners import FUSED_FORMS
from .model import (
    LEAKY_SLOPE,
    ConvRefiner,
    PositionalInputs,
    SelfAttention,
    attend,
    attention_mask,
    check_refined,
    decay_about,
    refiner_view,
    window_mask,
)
from .model import attention as reference_attention

# The refiner's hidden activations of one query block are counted as (batch, refiner_width, rows, T) and kept
# under this many elements (at least 16 query rows), so T = 16k evaluation stays bounded: on CPU 32 MB, on a GPU a
# few hundred MB so that kernel launches stay few. A full (h, T, T) bias is precomputed below FULL_BIAS_ELEMENTS.
QUERY_BLOCK_ELEMENTS = {"cpu": 2**23, "accelerator": 2**26}
FULL_BIAS_ELEMENTS = 2**24
# A learnable bias without a refiner on the CPU (``_BiasedAttention``): query blocks of at most this many scores.
# A causal block skips the keys after its last row, and a block of 2 MB keeps the allocator from handing out
# fresh pages every step (the demo's model, T = 128 in 2 blocks: 1,000 page faults a step fewer, 10 % faster).
BIASED_BLOCK_ELEMENTS = 2**19


# ----------------------------------------------------------------------------------------------------
# Attention in query blocks


def attention(layer: SelfAttention, q, k, v, positional: PositionalInputs):
    """The attention of the ``model.SelfAttention`` ``layer``: q, k, v (batch, nh, T, hs) -> (batch, nh, T, hs)."""
    dropout = layer.cfg.dropout if layer.training else 0.0
    T = q.shape[2]
    if layer.window:
        return windowed_attention(layer, q, k, v, positional, dropout)
    if positional.log_decay is not None:  # xPos: its factors about the middle, or about each query block
        if not decay_fits_about_the_middle(positional.log_decay):
            blocks = attend_in_query_blocks(layer, q, k, v, positional, refine_form(layer), dropout, recentre=True)
            return torch.cat(blocks, dim=2)
        q, k = positional.decayed(q, k)
    if layer.refiner is None and not positional.has_bias:
        # No bias, no refiner: PyTorch's fused kernel, memory-linear in T. A temperature scales each query row:
        # (tau_i q_i) . k_j = tau_i S_ij.
        temperature = layer.temperature_rows(0, T, T)
        q = q if temperature is None else q * temperature.to(q.dtype)
        return F.scaled_dot_product_attention(q, k, v, is_causal=layer.cfg.causal, dropout_p=dropout)
    if uses_flex(layer, q, positional, dropout):
        return flex_bias_attention(q, k, v, positional.full_bias, layer.cfg.causal)
    refine = refine_form(layer, positional.has_bias)
    if layer.refiner is not None and refine is None:
        # A refiner that may read other query rows: the paper form, over the whole sequence.
        mask, temperature = attention_mask(T, layer.cfg.causal, q.device), layer.temperature_rows(0, T, T)
        return reference_attention(q, k, v, positional.full_bias, mask, layer.refiner, dropout, temperature)[0]
    return torch.cat(attend_in_query_blocks(layer, q, k, v, positional, refine, dropout), dim=2)


def refine_form(layer: SelfAttention, has_bias: bool = False) -> Callable | None:
    """``block_form`` of the layer's refiner, or None without one."""
    return None if layer.refiner is None else block_form(layer, has_bias)


# xPos's factors about the middle of the sequence stay below e^DECAY_SPAN (float32 overflows at e^88.7): up to
# about 58,000 tokens at xPos's fastest decay. Longer sequences recentre each block of queries (``recentred``).
DECAY_SPAN = 70.0
# Query rows per block when recentring: the block's own factors reach e^(rows |ln zeta_0| / gamma) = e^10.
DECAY_BLOCK_ROWS = 4096


def decay_fits_about_the_middle(log_decay) -> bool:
    """Whether xPos's factors about the middle (``model.PositionalInputs.decayed``) stay finite in float32."""
    return float((log_decay - log_decay.mean(0)).abs().max()) <= DECAY_SPAN


def recentred(q_block, keys, log_decay, q0: int, q1: int):
    r"""xPos's factors about the block's last query, $c = q_1 - 1$: $q_n e^{\ell(n) - \ell(c)}$ (at most
    $e^{\text{rows}\,|\ln\zeta_0|/\gamma}$) and $k_m e^{\ell(c) - \ell(m)}$ (at most 1 for a decoder's keys $m \le c$;
    a far key's factor underflows to 0, as its true product $\zeta^{(n - m)/\gamma}$ does). An encoder's keys after
    $c$ grow instead, as xPos's factors do there."""
    k1 = keys.shape[2]
    return decay_about(q_block, keys, (log_decay[q0:q1], log_decay[:k1]), log_decay[q1 - 1])


def windowed_attention(layer: SelfAttention, q, k, v, positional: PositionalInputs, dropout: float):
    r"""A layer with a sliding or chunked window (``model.window_mask``): blocks of at most $W$ query rows, each
    against only the keys its rows may see (at most $2W$, plus a refiner's ``key_margin`` on each side), so the
    cost grows as $T W$, not $T^2$. A bias from positions is computed for those keys only; one that reads the data
    for the keys up to the block's last (its own blocks, as elsewhere in this file). xPos's factors are taken about
    each block's last query. A refiner that is not row-local runs the reference form over the whole sequence."""
    cfg, refiner = layer.cfg, layer.refiner
    T, window = q.shape[2], layer.window
    refine = refine_form(layer, positional.has_bias)
    if refiner is not None and refine is None:
        q, k = positional.decayed(q, k)
        temperature = layer.temperature_rows(0, T, T)
        return reference_attention(
            q, k, v, positional.full_bias, layer.mask(T, q.device), refiner, dropout, temperature
        )[0]
    rows, margin = min(cfg.attn_chunk or window, window, T), key_margin(refiner) if refiner is not None else 0
    outputs = []
    for q0 in range(0, T, rows):
        q1 = min(T, q0 + rows)
        first_key = (q0 // window) * window if layer.chunked else max(0, q0 - window + 1)
        k0, k1 = max(0, first_key - margin), min(T, q1 + margin)
        mask = window_mask(q0, q1, k0, k1, cfg.causal, window, layer.chunked, q.device)
        bias = None
        if positional.bias_between is not None:
            bias = positional.bias_between(positional.positions[q0:q1], positional.positions[k0:k1])
        elif positional.data_bias is not None:
            bias = positional.bias_rows(q0, q1, k1)[..., k0:]
        query_block, keys, values = q[:, :, q0:q1], k[:, :, k0:k1], v[:, :, k0:k1]
        if positional.log_decay is not None:
            log = positional.log_decay
            query_block, keys = decay_about(query_block, keys, (log[q0:q1], log[k0:k1]), log[q1 - 1])
        temperature = layer.temperature_rows(q0, q1, T)
        outputs.append(attend_query_block(refiner, refine, query_block, keys, values, bias, mask, dropout, temperature))
    return torch.cat(outputs, dim=2)


def runs_in_query_blocks(refiner_cls: type) -> bool:
    """Whether query blocks give a refiner's exact output: a built-in one (exact class, see ``FUSED_FORMS``), or
    one that declares ``row_local = True`` (each output row reads only its own query row; a row-mixing refiner,
    e.g. one reading the query row above, must not). Such a refiner that also reads masked keys just past the
    diagonal (as a 1 x k convolution along the keys does) declares how many as ``key_margin``. Any other
    refiner, a subclass of a built-in one included, runs over the whole sequence: blocks would cut what it
    reads."""
    return refiner_cls in FUSED_FORMS or getattr(refiner_cls, "row_local", False) is True


def own_forward(refiner, scores, bias, mask):
    """A row-local refiner's own ``forward``, run on each query block (its output checked like model.py's)."""
    return check_refined(refiner, refiner(scores, bias, mask), scores)


_checked_forms: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # refiner module -> its checked form


def block_form(layer: SelfAttention, has_bias: bool) -> Callable | None:
    """How a query block computes $A = \\mathrm{refine}(S, B)$ with this layer's refiner, as a function
    (refiner, scores, bias, mask) -> A: its fused form (a built-in refiner whose structure checks out), its own
    ``forward`` (``row_local = True``), or None: not in query blocks."""
    refiner = layer.refiner
    if type(refiner) not in FUSED_FORMS:
        return own_forward if runs_in_query_blocks(type(refiner)) else None
    if refiner not in _checked_forms:
        problem = _structure_problem(refiner) or _probe_problem(refiner, layer.cfg.causal, has_bias)
        if problem:
            warnings.warn(
                f"fast path: {type(refiner).__name__} {problem}, so its fused form would compute something "
                f"else; this layer runs model.py's reference form (same result, slower)",
                stacklevel=2,
            )
        _checked_forms[refiner] = None if problem else FUSED_FORMS[type(refiner)]
    return _checked_forms[refiner]


def _structure_problem(refiner) -> str | None:
    """What the fused form of this built-in refiner needs and does not find, or None."""
    if isinstance(refiner, ConvRefiner):
        convs = (getattr(refiner, "conv1", None), getattr(refiner, "conv2", None))
        if not all(isinstance(c, nn.Conv2d) for c in convs):
            return "has no nn.Conv2d conv1 and conv2"
        kernel = convs[0].kernel_size[1]
        expected = ((1, kernel), (0, kernel // 2), (1, 1), (1, 1), 1, "zeros")  # 1 x kernel, "same" padding
        for conv in convs:
            if (conv.kernel_size, conv.padding, conv.stride, conv.dilation, conv.groups, conv.padding_mode) != expected:
                return "has a convolution that is not 1 x kernel with padding kernel // 2 along the keys"
        return None
    f = getattr(refiner, "f", None)
    layers = [getattr(f, name, None) for name in ("hidden_layer", "activation", "output_layer")]
    if not (isinstance(layers[0], nn.Linear) and isinstance(layers[2], nn.Linear)):
        return "has no f.hidden_layer and f.output_layer (nn.Linear)"
    if not isinstance(layers[1], nn.LeakyReLU) or layers[1].negative_slope != LEAKY_SLOPE:
        return f"has an activation other than LeakyReLU({LEAKY_SLOPE})"
    return None


@torch.no_grad()
def _probe_problem(refiner, causal: bool, has_bias: bool, T: int = 7) -> str | None:
    """Compare the fused form with the refiner's own forward on random scores (and bias) of T x T cells."""
    weight = next(refiner.parameters())
    n_head = refiner.conv2.out_channels if isinstance(refiner, ConvRefiner) else refiner.f.output_layer.out_features
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(2, n_head, T, T, generator=generator).to(weight)
    bias = torch.randn(n_head, T, T, generator=generator).to(weight) if has_bias else None
    mask = attention_mask(T, causal, weight.device)
    seen_bias, allowed = refiner_view(bias, mask)
    with torch.autocast(weight.device.type, enabled=False):
        expected = refiner(scores, seen_bias, mask)
        fused = FUSED_FORMS[type(refiner)](refiner, scores, seen_bias, mask)
    if expected.shape != fused.shape:
        return f"returns shape {tuple(expected.shape)} where its fused form gives {tuple(fused.shape)}"
    tolerance = 1e-4 if weight.dtype in (torch.float32, torch.float64) else 3e-2  # relative to the largest score
    error = (expected - fused).masked_fill(~allowed, 0).abs().max().item()
    if not error <= tolerance * (1 + expected.masked_fill(~allowed, 0).abs().max().item()):
        return f"differs from its fused form by {error:.3g} on a test input"
    return None


def rows_per_query_block(cfg, has_refiner: bool, batch: int, T: int, device: torch.device, biased: bool = False) -> int:
    """Query rows per block. Without a refiner one block, unless the (batch, h, T, T) scores would be large, or
    ``biased``: they go through ``_BiasedAttention``, whose scores are kept under BIASED_BLOCK_ELEMENTS a block."""
    if cfg.attn_chunk:
        return cfg.attn_chunk
    if biased:
        return max(16, min(T, BIASED_BLOCK_ELEMENTS // (batch * cfg.n_head * T)))
    if not has_refiner and batch * cfg.n_head * T * T <= FULL_BIAS_ELEMENTS:
        return T
    channels = max(cfg.n_head, cfg.refiner_width) if has_refiner else cfg.n_head
    rows = QUERY_BLOCK_ELEMENTS["cpu" if device.type == "cpu" else "accelerator"] // (batch * channels * T)
    if device.type == "cpu":
        # Fewer, taller blocks have less per-block overhead, but a causal block also computes the upper half
        # of its diagonal square in vain (rows / T of the cells). T / 16 rows measured best for T = 128 ... 2048
        # while the cell MLP went through memory; since it stays in registers (native.py), T / 8: at T = 512,
        # B = 8, interleaved, 64 rows against 32 took DAPE's step 0.95x and the conv's 0.92x (0.90x and 1.02x
        # in the PyTorch form), 128 rows 1.06x and 1.11x (issue 45, RESULTS.md).
        rows = min(rows, T // 8)
    return max(16, rows)


def key_margin(refiner) -> int:
    """Masked keys past the diagonal a refiner reads: DAPE-V2's 1 x kernel conv2 reads kernel // 2 of its hidden
    cells there (zeros after tril at the input, but not after conv1); a row-local user refiner declares its own
    as ``key_margin``."""
    if type(refiner) is ConvRefiner:
        return refiner.conv2.kernel_size[1] // 2
    return getattr(refiner, "key_margin", 0)


def query_block_mask(q0: int, q1: int, k1: int, causal: bool, device) -> torch.Tensor:
    """Rows q0..q1-1 and keys 0..k1-1 of ``model.attention_mask``: (q1 - q0, k1) bool."""
    if not causal:
        return torch.ones(q1 - q0, k1, dtype=torch.bool, device=device)
    return torch.arange(k1, device=device)[None, :] <= torch.arange(q0, q1, device=device)[:, None]


def attend_in_query_blocks(
    layer: SelfAttention,
    q,
    k,
    v,
    positional: PositionalInputs,
    refine: Callable | None,
    dropout: float,
    recentre: bool = False,
) -> list[torch.Tensor]:
    """Attention in blocks of query rows, each against the keys it can see: (batch, nh, rows, hs) per block.

    The keys are split at the same rows as the queries (key blocks); a causal query block takes the key blocks
    up to its last row, plus the refiner's ``key_margin`` keys from the next one. Concatenating key blocks keeps
    the backward pass cheap: each receives only its own gradient, instead of a zero-filled full-length one per
    query block. The last (widest) query block runs first, so the memory allocator can reuse its buffers for
    every narrower one: in the other order each block needs slightly more than the last freed, and a 16k-token
    evaluation's peak memory grew several-fold from fragmentation alone. ``recentre``: q and k have no xPos
    factors yet; each block applies them about its own last query (``recentred``).
    """
    cfg, refiner = layer.cfg, layer.refiner
    batch, _, T, _ = q.shape
    # A bias computed once is cut into the blocks' rows the same way: slicing the full (h, T, T) bias per block
    # made each block's backward zero-fill a full-size gradient (at T = 1024 most of a DAPE step). Too large to
    # hold at once, or read from the data (a layer's own, and batch times larger), it is computed per block.
    has_bias = positional.has_bias
    precomputed = positional.bias_between is not None and cfg.n_head * T * T <= FULL_BIAS_ELEMENTS
    biased = (  # a learnable bias that SDPA would take to its unfused kernel (see _BiasedAttention)
        precomputed
        and refiner is None
        and layer.temperature is None
        and dropout == 0.0
        and q.device.type == "cpu"
        and positional.full_bias.requires_grad
    )
    rows = rows_per_query_block(cfg, refiner is not None, batch, T, q.device, biased)
    if recentre:
        rows = min(rows, DECAY_BLOCK_ROWS)
    k, v = k.contiguous(), v.contiguous()
    if biased:  # its blocks' matmuls want q with batch and heads mergeable: one copy, not one per block backward
        q = q.contiguous()
    margin = key_margin(refiner)
    key_blocks, value_blocks = k.split(rows, dim=2), v.split(rows, dim=2)
    query_blocks = q.split(rows, dim=2)
    bias_rows = positional.full_bias.split(rows, dim=1) if precomputed else None
    outputs = [None] * len(query_blocks)
    for i in reversed(range(len(query_blocks))):
        q0, q1 = i * rows, i * rows + query_blocks[i].shape[2]
        k1 = min(T, q1 + margin) if cfg.causal else T
        keys, values = (k, v) if k1 == T else (_first_keys(key_blocks, k1), _first_keys(value_blocks, k1))
        mask = query_block_mask(q0, q1, k1, cfg.causal, q.device)
        if not has_bias:
            bias = None
        else:
            bias = bias_rows[i][:, :, :k1] if precomputed else positional.bias_rows(q0, q1, k1)
        temperature = layer.temperature_rows(q0, q1, T)
        query_block = query_blocks[i]
        if recentre:
            query_block, keys = recentred(query_block, keys, positional.log_decay, q0, q1)
        if recentre and bias is None and refiner is None and temperature is None:
            outputs[i] = F.scaled_dot_product_attention(query_block, keys, values, attn_mask=mask, dropout_p=dropout)
        elif refiner is None and temperature is None:  # S + B through the fused kernel, bias and mask as one float mask
            if precomputed:  # the same in every layer: made once per forward
                attn_mask = per_forward(
                    positional,
                    ("float mask", q0, q1, k1, q.dtype),
                    lambda bias=bias, mask=mask: float_mask(bias, mask, q.dtype),
                )
            else:
                attn_mask = float_mask(bias, mask, q.dtype)
            if biased:
                outputs[i] = _BiasedAttention.apply(query_block, keys, values, attn_mask)
                continue
            # (batch, nh, rows, keys): on the CPU a mask with a batch axis takes the fused kernel, an (nh, rows,
            # keys) one the unfused math kernel (torch 2.13). A bias that reads the data has its batch axis already.
            outputs[i] = F.scaled_dot_product_attention(
                query_block, keys, values, dropout_p=dropout, attn_mask=attn_mask.expand(batch, -1, -1, -1)
            )
        else:
            outputs[i] = attend_query_block(
                refiner, refine, query_block, keys, values, bias, mask, dropout, temperature
            )
    return outputs


class _BiasedAttention(torch.autograd.Function):
    r"""$\mathrm{softmax}(QK^\top/\sqrt{d} + M)\,V$ with a float mask $M$ (nh, rows, keys) that needs a gradient
    (a learnable bias, ``float_mask``): q (batch, nh, rows, hs), k and v (batch, nh, keys, hs). On the CPU, SDPA
    takes its unfused math kernel for such a mask (torch 2.13); this computes the same products, keeps only the
    probabilities for backward, and sums the mask's gradient over the batch in one pass (measured: 0.8x of the
    math kernel's attention, forward and backward)."""

    @staticmethod
    def forward(ctx, q, k, v, float_mask):
        scale = 1.0 / math.sqrt(q.shape[-1])
        probs = torch.matmul(q * scale, k.transpose(-2, -1)).add_(float_mask)  # S + M (batch, nh, rows, keys)
        torch.softmax(probs, dim=-1, out=probs)
        ctx.save_for_backward(q, k, v, probs)
        return probs @ v

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, probs = ctx.saved_tensors
        scale = 1.0 / math.sqrt(q.shape[-1])
        grad_v = probs.transpose(-2, -1) @ grad_out
        grad_probs = grad_out @ v.transpose(-2, -1)
        grad_scores = torch.ops.aten._softmax_backward_data(grad_probs, probs, -1, probs.dtype)
        grad_q = (grad_scores @ k).mul_(scale)
        grad_k = (grad_scores.transpose(-2, -1) @ q).mul_(scale)
        return grad_q, grad_k, grad_v, grad_scores.sum(0)


def float_mask(bias, mask, dtype):
    """SDPA's float mask: the bias (nh, rows, keys) where ``mask`` allows, -inf elsewhere (and where it is -inf)."""
    return bias.masked_fill(~mask, float("-inf")).to(dtype)


# What the layers of one forward share, made by the first that needs it: PositionalInputs -> {key: value}.
_per_forward: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def per_forward(positional: PositionalInputs, key: tuple, make: Callable):
    """``make()`` once per forward (per ``positional``) and ``key``; the same object for every later layer. Under
    torch.compile each layer makes its own (the compiler merges what repeats)."""
    if torch.compiler.is_compiling():
        return make()
    shared = _per_forward.setdefault(positional, {})
    if key not in shared:
        shared[key] = make()
    return shared[key]


def _first_keys(key_blocks, n: int):
    """The first n keys (or values) from whole key blocks, plus the start of the next one."""
    rows = key_blocks[0].shape[2]
    pieces = list(key_blocks[: n // rows])
    if n % rows:
        pieces.append(key_blocks[n // rows][:, :, : n % rows])
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=2)


def attend_query_block(refiner, refine: Callable | None, q, k, v, bias, mask, dropout: float, temperature=None):
    """``model.attention`` with a refiner or a temperature for a block of query rows: q (batch, nh, rows, hs), k/v
    (batch, nh, keys, hs), bias (nh, rows, keys), (batch, nh, rows, keys) or None, mask (rows, keys), temperature
    (1 or nh, rows, 1) or None -> (batch, nh, rows, hs). ``refine`` is ``block_form``'s."""
    scores = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1)  # S, scaling the smaller operand
    seen_bias, allowed = refiner_view(bias, mask)
    if refiner is None:
        refined = scores if seen_bias is None else scores + seen_bias  # A = S + B
    else:
        refined = refine(refiner, scores, seen_bias, mask)
    if temperature is not None:
        refined = refined * temperature  # tau (.) A
    return attend(refined, allowed, v, dropout)[0]  # softmax(mask(A)) V


# ----------------------------------------------------------------------------------------------------
# FlexAttention: an additive bias on CUDA without a dense mask

# In CUDA training at T >= FLEX_MIN_LENGTH a bias without a refiner goes through FlexAttention: the bias enters
# the scores inside the kernel (``score_mod``) and the causal block mask skips the blocks above the diagonal,
# instead of SDPA reading a dense (batch, nh, T, T) float mask. Shorter sequences stay with SDPA (a loaded bias
# can win there), and so does evaluation (its lengths vary: each new one would compile the kernel again).
# ``FLEX_ON_CUDA = False``: SDPA everywhere (the benchmark's comparison). The kernel's tiles: torch's own for an
# H100 (bf16, head size 64) stage a 128 x 128 float32 tile of the bias too, 240 KiB of shared memory where the card
# has 227 KiB, and do not compile (torch 2.11, issue 46); 128 x 64 in 2 stages did, the fastest of three tried
# there (benchmarks/gpu_flex_tiles.py, RESULTS.md). None: torch's own.
FLEX_ON_CUDA = True
FLEX_MIN_LENGTH = 256
FLEX_KERNEL_OPTIONS: dict | None = {"BLOCK_M": 128, "BLOCK_N": 64, "num_stages": 2}
compiled_once = functools.cache(torch.compile)  # one compiled FlexAttention per process


def uses_flex(layer: SelfAttention, q, positional: PositionalInputs, dropout: float) -> bool:
    """Whether this layer's attention goes through FlexAttention (it has no dropout; its CUDA kernels need a head
    size of at least 16; the bias it reads is the whole (nh, T, T) one, so only where that is held anyway)."""
    T = q.shape[2]
    return (
        FLEX_ON_CUDA
        and q.device.type == "cuda"
        and torch.is_grad_enabled()
        and layer.refiner is None
        and positional.bias_between is not None
        and layer.temperature is None
        and dropout == 0.0
        and T >= FLEX_MIN_LENGTH
        and q.shape[-1] >= 16
        and layer.cfg.n_head * T * T <= FULL_BIAS_ELEMENTS
    )


def flex_bias_attention(q, k, v, bias, causal: bool, compiled: bool = True, kernel_options: dict | None = None):
    """softmax(S + B, masked) V with FlexAttention: q, k, v (batch, nh, T, hs), the bias B (nh, T, T) read inside
    the kernel (its gradient flows back to the encoding's parameters) -> (batch, nh, T, hs). ``compiled=False``
    runs PyTorch's unfused form (the CPU's, forward only); ``kernel_options``: the tiles (FLEX_KERNEL_OPTIONS)."""
    from torch.nn.attention.flex_attention import flex_attention  # here: only CUDA training needs it

    def add_bias(score, batch, head, query, key):
        return score + bias[head, query, key]

    T = q.shape[2]
    block_mask = causal_block_mask(T, str(q.device)) if causal else None
    kernel = compiled_once(flex_attention) if compiled else flex_attention
    options = FLEX_KERNEL_OPTIONS if kernel_options is None else kernel_options
    return kernel(q, k, v, score_mod=add_bias, block_mask=block_mask, kernel_options=options)


@functools.lru_cache(maxsize=8)
def causal_block_mask(T: int, device: str):
    """FlexAttention's block mask of a decoder: key <= query, the blocks above the diagonal skipped."""
    from torch.nn.attention.flex_attention import create_block_mask

    def causal(batch, head, query, key):
        return key <= query

    return create_block_mask(causal, None, None, T, T, device=device)


SelfAttention.fast_attention = attention
