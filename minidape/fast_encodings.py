r"""The fast path's forms of the position-only encodings, beside ``fast.py``'s attention: the same numbers (to
float rounding, forward and gradients; ``tests/test_fast.py``) from the same parameters.

  - **RoPE's rotation** (``qkv``, installed as ``model.SelfAttention.fast_qkv``): queries and keys rotated as
    complex numbers, one product in place on the fused projection's output (its rows ordered so that each
    rotated pair is adjacent), with the angles' table made once per forward.
  - **Biases of the distance alone** (``bias``, installed as ``model.GPT.fast_bias``): ALiBi's, Kerple's, T5's
    and FIRE's below its threshold computed once per distance and laid out as a Toeplitz matrix (consecutive
    positions), T5's buckets gathered from the transposed table otherwise. Each is compared with the module's own
    forward at its first use; an equation edited in ``model.py`` makes the module run its own, with a warning.
"""

from __future__ import annotations

import functools
import warnings
import weakref

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import fast  # the module, not its names: `from minidape import fast` first reaches this mid-way
from .model import (
    GPT,
    ALiBiBias,
    FIREBias,
    KerpleLogBias,
    KerplePowerBias,
    PositionalInputs,
    SelfAttention,
    T5Bias,
    relative_distance,
)

# ----------------------------------------------------------------------------------------------------
# Rotary encodings: q and k rotated in one product


def qkv(layer: SelfAttention, x, positional: PositionalInputs):
    r"""``model.SelfAttention.qkv``: x (batch, T, C) -> q, k, v (batch, nh, T, hs), with q and k rotated as complex
    numbers. ``model.apply_rotary`` pairs channel $i$ with $i + hs/2$, so its 4 products and a cat per tensor walk
    rows of hs/2 floats (14 tensors per layer). Here c_attn's rows are taken in the order that puts each pair side
    by side, $(0, hs/2, 1, hs/2 + 1, \dots)$ in every head of q and k (``pair_order``), so the pair is one
    complex number $x_i + i\,x_{i + hs/2}$ and the rotation one product, $(x_i + i\,x_{i+hs/2})\,e^{i t\theta_i}$,
    over q and k together (``_RotatedProjection``). q and k come out with their channels in that order; every consumer
    reads them only through $q \cdot k$, which a permutation of both does not change (v keeps its order).
    Where the order could matter -- a bias that reads q and k (``data_bias``), a rotation whose angles need a
    gradient, a projection that is not a plain ``nn.Linear`` or has hooks (they would not run) -- and under
    ``torch.compile`` (``train --compile``), ``model``'s form runs."""
    rotary = positional.rotary
    if (
        rotary is None
        or torch.compiler.is_compiling()  # it fuses model.py's products itself; it cannot trace complex views
        or x.device.type not in ("cpu", "cuda")  # complex products: tests on the CPU and in test_gpu.py, none on MPS
        or layer.data_bias is not None
        or layer.reshapes_qk
        or positional.log_decay is not None  # xPos's factors are applied in model.py's channel order (fast.py)
        or type(layer.c_attn) is not nn.Linear
        or layer.c_attn._forward_hooks
        or layer.c_attn._forward_pre_hooks
        or any(t.requires_grad for rotation in rotary for t in rotation)
    ):
        return layer.qkv(x, positional)
    order = pair_order(layer.n_head, layer.head_size, str(x.device))
    turns = fast.per_forward(positional, ("rotary", layer.n_head), lambda: rotary_turns(positional, layer.n_head))
    return _RotatedProjection.apply(x, layer.c_attn.weight, layer.c_attn.bias, *turns, order, layer.n_head)


@functools.lru_cache(maxsize=16)
def pair_order(n_head: int, head_size: int, device: str) -> torch.Tensor:
    """c_attn's output rows with each rotated pair side by side: in every head of q and of k the channels
    (0, hs/2, 1, hs/2 + 1, ...); v's rows as they are. Kept for later calls, so never an inference tensor: made
    first in an evaluation (`torch.inference_mode`), it broke every later training step's backward."""
    with torch.inference_mode(False):
        half = head_size // 2
        within = torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).flatten()  # (hs,)
        heads = torch.arange(2 * n_head)[:, None] * head_size + within  # (2 nh, hs): q's heads, then k's
        values = torch.arange(2 * n_head * head_size, 3 * n_head * head_size)
        return torch.cat([heads.flatten(), values]).to(device)


def rotary_turns(positional: PositionalInputs, n_head: int) -> tuple[torch.Tensor, torch.Tensor]:
    r"""$e^{i t\theta} = \cos + i \sin$ of each position's angles, complex (T, 2, nh, hs/2) (the queries' row, then
    the keys'), and their conjugates for the backward in the same layout: written out over the heads so that the
    products run along whole rows of q and k in the projection's layout (1.5-2x faster than broadcasting over the
    heads at the demo shape). xpos's scale rides along as the modulus."""
    query_rotation, key_rotation = positional.rotary
    query_turns = torch.complex(*(table.float() for table in query_rotation))
    key_turns = query_turns if key_rotation is query_rotation else torch.complex(*(t.float() for t in key_rotation))
    turns = torch.stack([query_turns, key_turns], dim=1)[:, :, None].expand(-1, 2, n_head, -1).contiguous()
    return turns, turns.conj().resolve_conj()


def _rotate_(heads: torch.Tensor, turns: torch.Tensor) -> None:
    r"""Rotate q and k in place: heads (batch, T, 2, nh, hs) real, each pair adjacent, times turns (T, 2, nh, hs/2)
    complex, $(x_i + i\,x_{i+hs/2})\,e^{i t\theta_i}$ in one product. In float32 and float64 the pairs are a complex
    view of heads (``view_as_complex`` raises rather than copy); torch has no complex bfloat16, so there the product
    runs in float32 and is rounded back."""
    if heads.dtype in (torch.float32, torch.float64):
        pairs = torch.view_as_complex(heads.unflatten(-1, (-1, 2)))
        torch.mul(pairs, turns, out=pairs)
    else:
        heads.copy_(torch.view_as_real(torch.view_as_complex(heads.float().unflatten(-1, (-1, 2))) * turns).flatten(-2))


class _RotatedProjection(torch.autograd.Function):
    """c_attn with its rows in ``pair_order`` and the rotation, in one step: x (batch, T, C) -> q and k rotated, v
    as it is, (batch, nh, T, hs) each, views of one (batch, T, 3C) buffer in nanoGPT's layout. The rotation runs in
    place on the projection's output, which nothing else holds (a product into a new tensor, with the weight's
    row gather through autograd, cost 0.15 ms a layer more at the demo shape), so the projection's backward is
    written here too: the gradients of q, k and v copied into one buffer in the projection's layout (what
    autograd's cat does for nanoGPT's split), q's and k's turned back there in place by the conjugates (a
    rotation's transpose is the rotation by minus the angles; one product in the layout of the forward's, 0.08 ms
    a layer less than two into the buffer), then the linear layer's three products, the weight's and bias's rows
    put back in their order."""

    @staticmethod
    def forward(ctx, x, weight, bias, turns, turns_back, order, n_head: int):
        with torch.no_grad():  # the gradient of the gather is the un-gather in backward
            rows, row_bias = weight.index_select(0, order), None if bias is None else bias.index_select(0, order)
        projected = F.linear(x, rows, row_bias)  # (batch, T, 3C), each rotated pair adjacent
        batch, T, _ = projected.shape
        heads = projected.view(batch, T, 3, n_head, -1)  # (batch, T, q/k/v, nh, hs)
        _rotate_(heads[:, :, :2], turns)
        ctx.save_for_backward(x, rows, turns_back, order)
        ctx.has_bias = bias is not None
        q, k, v = heads.unbind(2)  # (batch, T, nh, hs) each
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_q, grad_k, grad_v):
        x, rows, turns_back, order = ctx.saved_tensors  # turns_back (T, 2, nh, hs/2)
        batch, n_head, T, hs = grad_v.shape
        grad = grad_v.new_empty(batch, T, 3, n_head, hs)  # the projection's, its rows in pair order
        for i, grad_out in enumerate((grad_q, grad_k, grad_v)):  # (batch, nh, T, hs) each
            grad[:, :, i] = grad_out.transpose(1, 2)
        _rotate_(grad[:, :, :2], turns_back)
        flat = grad.view(batch * T, -1).to(rows.dtype)  # (batch T, 3C)
        needs_x, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        grad_x = (flat @ rows).view(x.shape).to(x.dtype) if needs_x else None
        unorder = functools.partial(_put_rows, order)
        grad_weight = unorder(flat.t() @ x.reshape(batch * T, -1).to(flat.dtype)) if needs_weight else None
        grad_bias = unorder(flat.sum(0)) if ctx.has_bias and needs_bias else None
        return grad_x, grad_weight, grad_bias, None, None, None, None


def _put_rows(order: torch.Tensor, gathered: torch.Tensor) -> torch.Tensor:
    """The inverse of ``gathered = t.index_select(0, order)`` for a permutation ``order``: row j back to order[j]."""
    return torch.empty_like(gathered).index_copy_(0, order, gathered)


# ----------------------------------------------------------------------------------------------------
# Biases of the distance alone: computed along the distances once, then laid out as a Toeplitz matrix

# b(i, j) = g(i - j) in these modules' equations (an edit that breaks it is caught by ``_agrees``).
TRANSLATION_INVARIANT = (ALiBiBias, KerpleLogBias, KerplePowerBias, T5Bias)
# Every built-in bias from positions has a fast form below, or is named here with the reason it has none (then it
# runs its own forward); ``tests/test_new_encoding.py`` fails naming this place for a built-in that is in neither.
NO_FAST_FORM: dict[type, str] = {}


def bias(encoding, q_pos, k_pos) -> torch.Tensor:
    """The bias (nh, Tq, Tk) of a position-only ``encoding`` (``model.GPT.fast_bias``): one that depends on the
    distance alone through ``distance_bias`` (consecutive positions, on the CPU), FIRE's through ``fire_bias``,
    T5's through ``t5_bias`` otherwise, where they agree with the module's own forward; any other its own."""
    kind = type(encoding)
    if (kind not in TRANSLATION_INVARIANT and kind is not FIREBias) or _checked.get(encoding) is False:
        return encoding(q_pos, k_pos)  # no fast form, or edited in model.py: its fast form computes something else
    on_cpu = q_pos.device.type == "cpu"
    consecutive = on_cpu and _consecutive(q_pos) and _consecutive(k_pos)
    fast = None
    if kind is FIREBias:
        fast = fire_bias(encoding, q_pos, k_pos, consecutive) if on_cpu else None
    elif consecutive:
        fast = distance_bias(encoding, q_pos, k_pos)
    elif kind is T5Bias:
        fast = t5_bias(encoding, q_pos, k_pos)
    if fast is not None and _agrees(encoding, fast, q_pos, k_pos):
        return fast
    return encoding(q_pos, k_pos)


def _consecutive(positions: torch.Tensor) -> bool:
    """Whether positions are p, p + 1, p + 2, ..., at least one (every forward but random positions' training;
    read on the host, so asked on the CPU only)."""
    return len(positions) > 0 and bool((positions.diff() == 1).all())


def distances_along(q_pos, k_pos) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Positions whose one query row holds every distance between consecutive queries ``q_pos`` and keys
    ``k_pos``, largest first: query $d_\max = q_\text{last} - k_\text{first}$ against keys $0, 1, \dots,
    T_q + T_k - 2$, so key $m$ is at distance $d_\max - m$ (down to $q_\text{first} - k_\text{last}$)."""
    longest = q_pos[-1:] - k_pos[0]
    return longest, torch.arange(len(q_pos) + len(k_pos) - 1, device=q_pos.device)


def toeplitz(along: torch.Tensor, rows: int, keys: int) -> torch.Tensor:
    r"""(nh, rows + keys - 1) values at the distances of ``distances_along`` -> the (nh, rows, keys) bias: query
    $i$ and key $j$ are $d_\max - (\text{rows} - 1 - i + j)$ apart: the window of ``along`` that starts at
    rows - 1 - i. The windows are a view; the row flip makes the one copy, and its backward adds each cell's
    gradient back into its distance (as a gather's would, without a scatter over rows x keys indices)."""
    return along.unfold(-1, keys, 1).flip(-2)


def distance_bias(encoding, q_pos, k_pos) -> torch.Tensor | None:
    """An encoding whose bias depends on i - j alone (``TRANSLATION_INVARIANT``): its own forward on one row
    that holds each distance once (Tq + Tk - 1 cells instead of Tq x Tk, its gradient as autograd gives it),
    laid out by ``toeplitz``. At T = 128, 4 heads, forward and backward: T5 0.13 ms against 0.23 (its gather),
    Kerple-power 0.15 against 0.39, Kerple-log 0.12 against 0.15. None if a query lies before every key."""
    longest, keys = distances_along(q_pos, k_pos)
    if int(longest) < 0:
        return None
    along = encoding(longest, keys)[:, 0]  # (nh, Tq + Tk - 1)
    return toeplitz(along, len(q_pos), len(k_pos))


def fire_bias(fire: FIREBias, q_pos, k_pos, consecutive: bool) -> torch.Tensor | None:
    r"""``model.FIREBias`` with its MLP run once per distance instead of once per (query, key) cell for the queries
    below the threshold $L$: there the normaliser $\psi(\max(L, i)) = \psi(L)$ is the same for all rows, so
    $b(i, j)$ depends on the distance alone. The MLP's (distances, nh) outputs are laid out by ``toeplitz``
    for ``consecutive`` positions, else gathered into those rows (the gather's backward sums them back per
    distance); the rows from $L$ on, each with its own normaliser, take the module's own forward. $L$ is
    learned: in training it drifts below the training length, and the last rows go the long way (before, one
    such row sent every row there; forward and backward at T = 128, L = 121.6: 0.60 ms against the module's
    2.10 ms). None where no query lies below $L$, or the ones that do are not the first rows (positions out of
    order). On the CPU only: the threshold test reads a value on the host."""
    threshold = torch.abs(fire.threshold_scale * fire.base_threshold)
    below = q_pos.float() < threshold  # strictly: max()'s gradient splits at a tie
    rows = int(below.sum())
    if rows == 0 or not bool(below[:rows].all()):
        return None
    along = consecutive and int(q_pos[rows - 1] - k_pos[0]) >= 0
    if along:  # each distance once, largest first: (rows + Tk - 1,)
        distance = relative_distance(*distances_along(q_pos[:rows], k_pos), fire.causal).long()[0]
    else:
        distance = relative_distance(q_pos[:rows], k_pos, fire.causal).long()  # (rows, Tk), whole numbers >= 0
    each = torch.arange(int(distance.max()) + 1, device=q_pos.device, dtype=torch.float32)  # every distance once
    normalized = fire.psi(each) / (fire.psi(threshold) + fire.eps)
    per_distance = fire.mlp(normalized[:, None].to(fire.c.dtype))  # (distances, nh)
    picked = per_distance.t().index_select(1, distance.flatten())  # (nh, cells)
    gathered = toeplitz(picked, rows, len(k_pos)) if along else picked.view(-1, *distance.shape)  # (nh, rows, Tk)
    if rows == len(q_pos):
        return gathered
    return torch.cat([gathered, fire(q_pos[rows:], k_pos)], dim=1)  # the rows from L on: their own normalisers


def t5_bias(t5: T5Bias, q_pos, k_pos) -> torch.Tensor:
    r"""``model.T5Bias`` for positions ``distance_bias`` does not take (random ones, on a GPU): $b_h(\text{bucket}(i
    - j))$ gathered from the transposed (nh, 32) table straight into the (nh, Tq, Tk) layout. The module's
    ``nn.Embedding`` lookup makes (Tq, Tk, nh) and permutes it, and its backward sorts the Tq x Tk bucket
    indices; this gather's backward adds them into the 32 rows (0.27 against 0.82 ms forward and backward at
    T = 128, 4 heads)."""
    buckets = t5.buckets(q_pos, k_pos)  # (Tq, Tk)
    table = t5.table.weight.t()  # (nh, 32)
    return table.index_select(1, buckets.flatten()).view(len(table), *buckets.shape)


_checked: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # bias module -> its fast form agrees


@torch.no_grad()
def _agrees(encoding, fast, q_pos, k_pos) -> bool:
    """Whether a fast form (``distance_bias``, ``fire_bias``, ``t5_bias``) gave what the module's own forward gives,
    compared at the module's first use (an equation edited in model.py makes the module run its own forward, with
    a warning)."""
    if encoding not in _checked:
        expected = encoding(q_pos, k_pos)
        agrees = fast.shape == expected.shape and torch.allclose(fast, expected, rtol=1e-4, atol=1e-5)
        if not agrees:
            name = type(encoding).__name__
            warnings.warn(f"fast path: {name}'s forward differs from its fast form; it runs its own", stacklevel=4)
        _checked[encoding] = agrees
    return _checked[encoding]


SelfAttention.fast_qkv = qkv
GPT.fast_bias = bias
