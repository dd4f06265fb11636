r"""The fast path's forms of the position-only encodings, beside ``fast.py``'s attention: the same numbers (to
float rounding, forward and gradients; ``tests/test_fast.py``) from the same parameters.

  - **RoPE's rotation** (``qkv``, installed as ``model.SelfAttention.fast_qkv``): queries and keys rotated as
    complex numbers, one product over the fused projection's output (its rows ordered so that each rotated pair
    is adjacent), with the angles' table made once per forward.
  - **Learned biases from a small table** (``bias``, installed as ``model.GPT.fast_bias``): FIRE's MLP run once
    per distance, T5's buckets gathered from the transposed table. Each is compared with the module's own
    forward at its first use; an equation edited in ``model.py`` makes the module run its own, with a warning.
"""

from __future__ import annotations

import functools
import warnings
import weakref

import torch
import torch.nn as nn
import torch.nn.functional as F

from .fast import per_forward
from .model import GPT, FIREBias, PositionalInputs, SelfAttention, T5Bias, relative_distance

# ----------------------------------------------------------------------------------------------------
# Rotary encodings: q and k rotated in one product


def qkv(layer: SelfAttention, x, positional: PositionalInputs):
    r"""``model.SelfAttention.qkv``: x (batch, T, C) -> q, k, v (batch, nh, T, hs), with q and k rotated as complex
    numbers. ``model.apply_rotary`` pairs channel $i$ with $i + hs/2$, so its 4 products and a cat per tensor walk
    rows of hs/2 floats (14 tensors per layer). Here c_attn's rows are taken in the order that puts each pair side
    by side, $(0, hs/2, 1, hs/2 + 1, \dots)$ in every head of q and k (``pair_order``), so the pair is one
    complex number $x_i + i\,x_{i + hs/2}$ and the rotation one product, $(x_i + i\,x_{i+hs/2})\,e^{i t\theta_i}$,
    over q and k together (``_RotatedQK``). q and k come out with their channels in that order; every consumer
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
        or type(layer.c_attn) is not nn.Linear
        or layer.c_attn._forward_hooks
        or layer.c_attn._forward_pre_hooks
        or any(t.requires_grad for rotation in rotary for t in rotation)
    ):
        return layer.qkv(x, positional)
    order = pair_order(layer.n_head, layer.head_size, str(x.device))
    weight, bias = layer.c_attn.weight[order], None if layer.c_attn.bias is None else layer.c_attn.bias[order]
    projected = F.linear(x, weight, bias)  # (batch, T, 3C), each rotated pair adjacent
    turns = per_forward(positional, ("rotary", layer.n_head), lambda: rotary_turns(positional, layer.n_head))
    return _RotatedQK.apply(projected, *turns, layer.n_head)


@functools.lru_cache(maxsize=16)
def pair_order(n_head: int, head_size: int, device: str) -> torch.Tensor:
    """c_attn's output rows with each rotated pair side by side: in every head of q and of k the channels
    (0, hs/2, 1, hs/2 + 1, ...); v's rows as they are."""
    half = head_size // 2
    within = torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).flatten()  # (hs,)
    heads = torch.arange(2 * n_head)[:, None] * head_size + within  # (2 nh, hs): q's heads, then k's
    values = torch.arange(2 * n_head * head_size, 3 * n_head * head_size)
    return torch.cat([heads.flatten(), values]).to(device)


def rotary_turns(positional: PositionalInputs, n_head: int) -> tuple[torch.Tensor, torch.Tensor]:
    r"""$e^{i t\theta} = \cos + i \sin$ of each position's angles, complex: (T, 2, nh, hs/2) for the forward (the
    queries' row, then the keys'), and their conjugates (2, nh, T, hs/2) for the backward; written out over the
    heads so that the products run along whole rows of q and k, in the forward's layout and in the gradients'
    (1.5-2x faster than broadcasting over the heads at the demo shape). xpos's scale rides along as the modulus."""
    query_rotation, key_rotation = positional.rotary
    query_turns = torch.complex(*(table.float() for table in query_rotation))
    key_turns = query_turns if key_rotation is query_rotation else torch.complex(*(t.float() for t in key_rotation))
    turns = torch.stack([query_turns, key_turns])[:, None].expand(2, n_head, *query_turns.shape)  # (2, nh, T, hs/2)
    return turns.permute(2, 0, 1, 3).contiguous(), turns.conj().contiguous()


def _complex(x: torch.Tensor) -> torch.Tensor:
    """x (..., hs) real -> (..., hs/2) complex, adjacent channels as the real and imaginary parts: a view where x is
    float32 or float64 with its pairs in place, else a copy (torch has no complex bfloat16)."""
    if x.dtype not in (torch.float32, torch.float64):
        x = x.float()
    if x.stride(-1) != 1 or x.storage_offset() % 2 or any(stride % 2 for stride in x.stride()[:-1]):
        x = x.contiguous()  # a gradient in another layout (a refiner's matmul)
    return torch.view_as_complex(x.unflatten(-1, (-1, 2)))


class _RotatedQK(torch.autograd.Function):
    """The projection's output (batch, T, 3C), pairs adjacent -> q and k rotated, v as it is: (batch, nh, T, hs)
    each, views in nanoGPT's layout. The backward turns the gradients of q and k back by the conjugates (a
    rotation's transpose is the rotation by minus the angles) into the gradient of the whole projection."""

    @staticmethod
    def forward(ctx, projected, turns, turns_back, n_head: int):
        batch, T, _ = projected.shape
        heads = projected.view(batch, T, 3, n_head, -1)  # (batch, T, q/k/v, nh, hs)
        # (x_i + i x_{i+hs/2}) e^{i t theta_i}, q and k in one product
        rotated = torch.view_as_real(_complex(heads[:, :, :2]) * turns).flatten(-2).to(projected.dtype)
        ctx.save_for_backward(turns_back)
        q, k = rotated.unbind(2)  # (batch, T, nh, hs) each
        return q.transpose(1, 2), k.transpose(1, 2), heads[:, :, 2].transpose(1, 2)

    @staticmethod
    def backward(ctx, grad_q, grad_k, grad_v):
        (turns_back,) = ctx.saved_tensors
        batch, n_head, T, hs = grad_v.shape
        grad = grad_v.new_empty(batch, T, 3, n_head, hs)
        for i, grad_out in enumerate((grad_q, grad_k)):  # (batch, nh, T, hs), SDPA's layout
            grad[:, :, i] = torch.view_as_real(_complex(grad_out) * turns_back[i]).flatten(-2).transpose(1, 2)
        grad[:, :, 2] = grad_v.transpose(1, 2)
        return grad.view(batch, T, -1), None, None, None


# ----------------------------------------------------------------------------------------------------
# Learned biases from a small table: FIRE's MLP on each distance once, T5's buckets gathered


def bias(encoding, q_pos, k_pos) -> torch.Tensor:
    """The bias (nh, Tq, Tk) of a position-only ``encoding`` (``model.GPT.fast_bias``): FIRE's through
    ``fire_bias`` and T5's through ``t5_bias`` where they apply and agree with the module's own forward, any
    other its own."""
    if _checked.get(encoding) is False:  # edited in model.py: its fast form computes something else
        return encoding(q_pos, k_pos)
    fast = None
    if type(encoding) is FIREBias and q_pos.device.type == "cpu":
        fast = fire_bias(encoding, q_pos, k_pos)
    elif type(encoding) is T5Bias:
        fast = t5_bias(encoding, q_pos, k_pos)
    if fast is not None and _agrees(encoding, fast, q_pos, k_pos):
        return fast
    return encoding(q_pos, k_pos)


def fire_bias(fire: FIREBias, q_pos, k_pos) -> torch.Tensor | None:
    r"""``model.FIREBias`` with its MLP run once per distance instead of once per (query, key) cell for the queries
    below the threshold $L$: there the normaliser $\psi(\max(L, i)) = \psi(L)$ is the same for all rows, so
    $b(i, j)$ depends on the distance alone. The MLP's (distances, nh) outputs are gathered into those rows (the
    gather's backward sums them back per distance); the rows from $L$ on, each with its own normaliser, take the
    module's own forward. $L$ is learned: in training it drifts below the training length, and the last rows go
    the long way (before, one such row sent every row there; forward and backward at T = 128, L = 121.6: 0.60 ms
    against the module's 2.10 ms). None where no query lies below $L$, or the ones that do are not the first
    rows (positions out of order). On the CPU only: the threshold test reads a value on the host."""
    threshold = torch.abs(fire.threshold_scale * fire.base_threshold)
    below = q_pos.float() < threshold  # strictly: max()'s gradient splits at a tie
    rows = int(below.sum())
    if rows == 0 or not bool(below[:rows].all()):
        return None
    distance = relative_distance(q_pos[:rows], k_pos, fire.causal).long()  # (rows, Tk), whole numbers >= 0
    each = torch.arange(int(distance.max()) + 1, device=q_pos.device, dtype=torch.float32)  # every distance once
    normalized = fire.psi(each) / (fire.psi(threshold) + fire.eps)
    per_distance = fire.mlp(normalized[:, None].to(fire.c.dtype))  # (distances, nh)
    gathered = per_distance.t().index_select(1, distance.flatten()).view(-1, *distance.shape)  # (nh, rows, Tk)
    if rows == len(q_pos):
        return gathered
    return torch.cat([gathered, fire(q_pos[rows:], k_pos)], dim=1)  # the rows from L on: their own normalisers


def t5_bias(t5: T5Bias, q_pos, k_pos) -> torch.Tensor:
    """``model.T5Bias``: $b_h(\text{bucket}(i - j))$ gathered from the transposed (nh, 32) table straight into the
    (nh, Tq, Tk) layout. The module's ``nn.Embedding`` lookup makes (Tq, Tk, nh) and permutes it, and its backward
    sorts the Tq x Tk bucket indices; this gather's backward adds them into the 32 rows (0.27 against 0.82 ms
    forward and backward at T = 128, 4 heads)."""
    buckets = t5.buckets(q_pos, k_pos)  # (Tq, Tk)
    return t5.table.weight.t().index_select(1, buckets.flatten()).view(-1, *buckets.shape)


_checked: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # bias module -> its fast form agrees


@torch.no_grad()
def _agrees(encoding, fast, q_pos, k_pos) -> bool:
    """Whether a fast form (``fire_bias``, ``t5_bias``) gave what the module's own forward gives, compared at the
    module's first use (an equation edited in model.py makes the module run its own forward, with a warning)."""
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
