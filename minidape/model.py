r"""The minidape GPT: one file, every positional encoding, every attention refiner.

Read top to bottom:
  1. ``GPTConfig`` and the two registries (positional encodings, refiners).
  2. Positional encodings, in three kinds:
     - absolute: added to the token embeddings (``learned``, ``sinusoidal``);
     - rotary: rotate queries and keys (``rope``, ``yarn``);
     - additive biases ``B`` of shape ``(n_head, Tq, Tk)`` added to the scores
       (``t5``, ``alibi``, ``kerple_log``, ``kerple_power``, ``fire`` and user biases).
  3. Refiners, which rewrite the pre-softmax scores ``S = QK^T/\sqrt{d}`` of every layer using ``B``
     (DAPE/CAPE MLPs across heads, DAPE-V2 ``1 x k`` convolutions).
  4. Attention, the transformer block and ``GPT``.

``block_size`` is the *training* length; every encoding except ``learned`` runs at any length.
Attention with a refiner (or a bias too large to hold at once) is computed in blocks of query rows: a
refiner acts on each query row independently and softmax is per row, so blocking changes nothing but
memory, and the causal upper triangle beyond each block is never computed.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F


# ----------------------------------------------------------------------------------------------------
# Configuration and registries


@dataclass
class GPTConfig:
    vocab_size: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 128         # training length; not a limit at inference (except pe="learned")
    pe: str = "rope"              # one of PE_NAMES
    refiner: str = "none"         # one of REFINER_NAMES
    refiner_width: int = 32       # hidden width of the DAPE MLP / conv refiner (D_DAPE)
    refiner_kernel: int = 3       # key-axis kernel size of the "conv" refiner (odd)
    causal: bool = True           # False: bidirectional encoder (Chomsky-hierarchy tasks)
    dropout: float = 0.0
    random_positions: int = 0     # L > 0: train on sorted random positions drawn from [0, L)
    rope_base: float = 10000.0
    attn_chunk: int = 0           # query rows per attention block; 0 picks a size from a memory budget

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the bad value and the valid choices."""
        if self.pe not in PE_REGISTRY:
            raise ValueError(f"unknown pe {self.pe!r}; valid choices: {', '.join(PE_NAMES)}")
        if self.refiner not in REFINER_REGISTRY:
            raise ValueError(f"unknown refiner {self.refiner!r}; valid choices: {', '.join(REFINER_NAMES)}")
        for name in ("vocab_size", "n_layer", "n_head", "n_embd", "block_size", "refiner_width"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer; got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}; "
                             f"choose n_embd as a multiple of n_head")
        head_size = self.n_embd // self.n_head
        if issubclass(PE_REGISTRY[self.pe], RotaryEmbedding) and head_size % 2:
            raise ValueError(f"pe={self.pe!r} rotates pairs of channels and needs an even head size; "
                             f"got n_embd/n_head = {self.n_embd}/{self.n_head} = {head_size}")
        if self.pe == "sinusoidal" and self.n_embd % 2:
            raise ValueError(f"pe='sinusoidal' needs an even n_embd (sin/cos pairs); got {self.n_embd}")
        if not isinstance(self.refiner_kernel, int) or self.refiner_kernel < 1 or self.refiner_kernel % 2 == 0:
            raise ValueError(f"refiner_kernel must be an odd integer >= 1 (1, 3, 5, ...); "
                             f"got {self.refiner_kernel!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1); got {self.dropout!r}")
        if self.random_positions:
            if not isinstance(self.random_positions, int) or self.random_positions < self.block_size:
                raise ValueError(f"random_positions must be 0 (off) or an integer L >= block_size="
                                 f"{self.block_size}; got {self.random_positions!r}")
            if self.pe == "none":
                raise ValueError("random_positions needs a pe that reads positions; pe='none' reads none")
        if not isinstance(self.attn_chunk, int) or self.attn_chunk < 0:
            raise ValueError(f"attn_chunk must be 0 (automatic) or a positive integer; got {self.attn_chunk!r}")


PE_REGISTRY: dict[str, type[nn.Module]] = {}
REFINER_REGISTRY: dict[str, type[nn.Module] | None] = {"none": None}


class RegisteredNames(Sequence):
    """A live, read-only list of a registry's names (it grows when users register more)."""

    def __init__(self, registry: dict):
        self._registry = registry

    def __getitem__(self, i):
        return list(self._registry)[i]

    def __len__(self):
        return len(self._registry)

    def __repr__(self):
        return repr(list(self._registry))


PE_NAMES = RegisteredNames(PE_REGISTRY)
REFINER_NAMES = RegisteredNames(REFINER_REGISTRY)


def _register(registry: dict, kind: str, name: str, check: Callable[[type], None]):
    if not isinstance(name, str) or not name:
        raise ValueError(f"a {kind} name must be a non-empty string; got {name!r}")
    if name in registry:
        raise ValueError(f"{kind} {name!r} is already registered; registered {kind}s: "
                         f"{', '.join(registry)}. Pick another name.")

    def decorator(cls):
        check(cls)
        registry[name] = cls
        return cls
    return decorator


def register_pe(name: str):
    """Class decorator: make ``GPTConfig(pe=name)`` build ``cls(cfg)``.

    ``cls`` subclasses ``AdditiveBias`` (a bias ``(n_head, Tq, Tk)`` from positions), or, for other kinds of
    encoding, ``AbsolutePositions`` or ``RotaryEmbedding``.
    """
    def check(cls):
        if not (isinstance(cls, type) and issubclass(cls, (AdditiveBias, AbsolutePositions, RotaryEmbedding))):
            raise TypeError(f"register_pe({name!r}) expects a subclass of md.AdditiveBias "
                            f"(or AbsolutePositions / RotaryEmbedding); got {cls!r}")
    return _register(PE_REGISTRY, "pe", name, check)


def register_refiner(name: str):
    """Class decorator: make ``GPTConfig(refiner=name)`` build ``cls(cfg)`` in every layer.

    ``cls.forward(scores, bias, mask) -> scores``: ``scores`` ``(B, h, Tq, Tk)`` already scaled by
    ``1/sqrt(d_head)``, ``bias`` ``(h, Tq, Tk)`` or ``None``, ``mask`` ``(Tq, Tk)`` bool, True where attention
    is allowed. The result must include the bias (if any): it goes straight to the mask and softmax.
    Each output row may depend only on its own query row (attention is computed in query blocks); a
    refiner that also reads masked keys just past the diagonal declares how many as ``key_margin``.
    """
    def check(cls):
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise TypeError(f"register_refiner({name!r}) expects an nn.Module subclass; got {cls!r}")
    return _register(REFINER_REGISTRY, "refiner", name, check)


def _normal_linear(n_in: int, n_out: int, std: float = 0.02, bias: bool = True) -> nn.Linear:
    """A Linear with GPT-2's N(0, std) weights and zero bias (refiners keep PyTorch's default init)."""
    layer = nn.Linear(n_in, n_out, bias=bias)
    nn.init.normal_(layer.weight, std=std)
    if bias:
        nn.init.zeros_(layer.bias)
    return layer


# ----------------------------------------------------------------------------------------------------
# Positional encodings: the three kinds


class AbsolutePositions(nn.Module):
    """Base class of absolute encodings: ``forward(pos (T,)) -> (T, n_embd)``, added to token embeddings."""


class AdditiveBias(nn.Module):
    """Base class of relative biases: ``forward(q_pos (Tq,), k_pos (Tk,)) -> (n_head, Tq, Tk)``, added to the
    scores already scaled by ``1/sqrt(d_head)``. The model builds one instance, ``cls(cfg)``, shared by all
    layers, and asks it for blocks of query rows. ``__init__`` takes no arguments."""

    def __init__(self):
        super().__init__()


def relative_distance(q_pos, k_pos, causal: bool = True):
    """(Tq, Tk) float distances: ``i - j`` clamped at 0 for a decoder (future keys are masked anyway),
    ``|i - j|`` for an encoder."""
    diff = (q_pos[:, None] - k_pos[None, :]).float()
    return diff.clamp(min=0) if causal else diff.abs()


class RotaryEmbedding(nn.Module):
    r"""RoPE (Su et al.): channel pair $(x_i, x_{i+d/2})$ of a query/key at position $m$ is rotated by the
    angle $m\,\theta_i$, $\theta_i = \text{base}^{-2i/d}$. Then $\langle R_m q, R_n k\rangle$ depends on
    $m - n$ only. ``forward(pos, T) -> (cos, sin)``, each ``(T, d_head/2)``."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        head_size = cfg.n_embd // cfg.n_head
        theta = cfg.rope_base ** (-torch.arange(0, head_size, 2, dtype=torch.float32) / head_size)
        self.register_buffer("theta", theta, persistent=False)
        self.block_size = cfg.block_size

    def frequencies_and_scale(self, T: int) -> tuple[torch.Tensor, float]:
        return self.theta, 1.0

    def forward(self, pos, T: int):
        theta, scale = self.frequencies_and_scale(T)
        angle = pos.float()[:, None] * theta                           # (T, d/2)
        return angle.cos() * scale, angle.sin() * scale


def apply_rotary(x, cos, sin):
    """Rotate channel pairs (x[..., i], x[..., i + d/2]) of x (B, nh, T, hs) by the given angles."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


# ----------------------------------------------------------------------------------------------------
# Positional encodings: none and absolute


class NoPositions(nn.Module):
    """NoPE: no positional signal at all; the causal mask alone lets a decoder infer order
    (Kazemnejad et al., 2023)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()


PE_REGISTRY["none"] = NoPositions  # the one encoding of no kind, so not through register_pe's check


@register_pe("learned")
class LearnedPositions(AbsolutePositions):
    r"""GPT-2's learned table: $x_i = e_{t_i} + P_i$. It has rows for positions ``< block_size`` (or
    ``< random_positions``) only, so it cannot extrapolate: longer inputs raise an error."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.table = nn.Embedding(max(cfg.block_size, cfg.random_positions), cfg.n_embd)
        nn.init.normal_(self.table.weight, std=0.02)

    def forward(self, pos):
        if pos.max() >= self.table.num_embeddings:
            raise ValueError(f"pe='learned' has a table of {self.table.num_embeddings} positions but got a "
                             f"sequence of length {len(pos)} (largest position {int(pos.max())}); a learned "
                             f"table cannot extrapolate: evaluate at T <= {self.table.num_embeddings} "
                             f"or use another pe")
        return self.table(pos)


@register_pe("sinusoidal")
class SinusoidalPositions(AbsolutePositions):
    r"""Vaswani et al.: $P_{p,2i} = \sin(p\,\omega_i)$, $P_{p,2i+1} = \cos(p\,\omega_i)$,
    $\omega_i = 10000^{-2i/d}$; fixed, defined at every position."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        omega = 10000.0 ** (-torch.arange(0, cfg.n_embd, 2, dtype=torch.float32) / cfg.n_embd)
        self.register_buffer("omega", omega, persistent=False)

    def forward(self, pos):
        angle = pos.float()[:, None] * self.omega                      # (T, d/2)
        return torch.stack((angle.sin(), angle.cos()), dim=-1).flatten(1)  # (T, d) interleaved sin, cos


# ----------------------------------------------------------------------------------------------------
# Positional encodings: rotary


register_pe("rope")(RotaryEmbedding)


@register_pe("yarn")
class YaRNEmbedding(RotaryEmbedding):
    r"""YaRN (Peng et al., 2023): RoPE trained as usual; at $T > L$ (``block_size``) with $s = T/L$, pair $i$
    gets $\theta'_i = \theta_i\,(1-\gamma_i) + \frac{\theta_i}{s}\gamma_i$ with the ramp
    $\gamma_i = \mathrm{clamp}\big(\frac{i - \ell}{h - \ell}, 0, 1\big)$ between the correction dimensions
    $\ell = \lfloor d(\beta{=}32) \rfloor$, $h = \lceil d(\alpha{=}1) \rceil$,
    $d(r) = \frac{D \ln(L / 2\pi r)}{2 \ln \text{base}}$: fast pairs keep their frequency, slow ones are
    interpolated. cos and sin are multiplied by $0.1 \ln s + 1$ (the logits by its square)."""

    def __init__(self, cfg: GPTConfig, beta: float = 32.0, alpha: float = 1.0):
        super().__init__(cfg)
        head_size = cfg.n_embd // cfg.n_head

        def correction_dim(r):
            return head_size * math.log(cfg.block_size / (2 * math.pi * r)) / (2 * math.log(cfg.rope_base))

        last = head_size // 2 - 1
        low = min(max(math.floor(correction_dim(beta)), 0), last)
        high = min(max(math.ceil(correction_dim(alpha)), 0), last)
        span = max(high - low, 1e-3)                                   # avoid 0/0 when low == high
        ramp = ((torch.arange(head_size // 2, dtype=torch.float32) - low) / span).clamp(0, 1)
        self.register_buffer("ramp", ramp, persistent=False)

    def frequencies_and_scale(self, T: int):
        s = T / self.block_size
        if s <= 1:
            return self.theta, 1.0
        return self.theta / s * self.ramp + self.theta * (1 - self.ramp), 0.1 * math.log(s) + 1.0


# ----------------------------------------------------------------------------------------------------
# Positional encodings: additive biases (n_head, Tq, Tk)


@register_pe("alibi")
class ALiBiBias(AdditiveBias):
    r"""ALiBi (Press et al.): $b_h(i, j) = -m_h\,(i - j)$ with fixed geometric slopes $m_h$."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.causal = cfg.causal
        self.register_buffer("slopes", alibi_slopes(cfg.n_head), persistent=False)

    def forward(self, q_pos, k_pos):
        return -self.slopes[:, None, None] * relative_distance(q_pos, k_pos, self.causal)


def alibi_slopes(n_head: int) -> torch.Tensor:
    r"""For $n$ a power of two: $m_h = 2^{-8h/n}$, $h = 1..n$. Otherwise, with $k = 2^{\lfloor\log_2 n\rfloor}$:
    the $k$ slopes for $k$ heads, then every other slope for $2k$ heads, the first $n - k$ of them."""
    def geometric(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** h for h in range(1, n + 1)]

    k = 2 ** math.floor(math.log2(n_head))
    slopes = geometric(k) + geometric(2 * k)[0::2][: n_head - k]
    return torch.tensor(slopes, dtype=torch.float32)


@register_pe("t5")
class T5Bias(AdditiveBias):
    r"""T5's bucketed bias (Raffel et al.): a learned $b_h(\text{bucket}(i - j))$ over 32 buckets. Decoder:
    $n = \max(i - j, 0)$, buckets $0..15$ exact, then
    $16 + \lfloor \ln(n/16) / \ln(128/16) \cdot 16 \rfloor$ capped at 31. Encoder: half the buckets per
    direction (8 exact + 8 logarithmic each). Every distance past 128 shares the last bucket."""

    num_buckets, max_distance = 32, 128

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.causal = cfg.causal
        self.table = nn.Embedding(self.num_buckets, cfg.n_head)
        nn.init.normal_(self.table.weight, std=0.02)

    @staticmethod
    def bucket(distance, num_buckets: int, max_distance: int):
        """Bucket of non-negative distances: ``num_buckets/2`` exact, the rest logarithmic up to
        ``max_distance``."""
        exact = num_buckets // 2
        log_ratio = torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact)
        large = (exact + (log_ratio * (num_buckets - exact)).long()).clamp(max=num_buckets - 1)
        return torch.where(distance < exact, distance, large)

    def buckets(self, q_pos, k_pos):
        diff = q_pos[:, None] - k_pos[None, :]                         # i - j
        if self.causal:
            return self.bucket(diff.clamp(min=0), self.num_buckets, self.max_distance)
        half = self.num_buckets // 2                                   # keys ahead use buckets half..
        return self.bucket(diff.abs(), half, self.max_distance) + half * (diff < 0)

    def forward(self, q_pos, k_pos):
        return self.table(self.buckets(q_pos, k_pos)).permute(2, 0, 1)  # (h, Tq, Tk)


class _ClampedParameters(AdditiveBias):
    """Kerple keeps its per-head parameters in range by projection (clamping the stored values on every
    forward), as the authors' code does; gradients flow as usual."""

    bounds: dict[str, tuple[float, float]] = {}

    def project_(self):
        # ``.data``: the projection is not part of the graph, and values that are already in range do not
        # change, so graphs built earlier in the same forward (other layers, other query blocks) stay valid.
        for name, (low, high) in self.bounds.items():
            getattr(self, name).data.clamp_(low, high)


@register_pe("kerple_log")
class KerpleLogBias(_ClampedParameters):
    r"""KERPLE-log (Chi et al., 2022): $b_h(i, j) = -r_1^{(h)} \ln\!\big(1 + r_2^{(h)}\,(i - j)\big)$,
    from the CPD kernel $-r_1 \ln(1 + r_2|m - n|)$; $r_1, r_2 \ge 10^{-2}$ per head."""

    bounds = {"r1": (1e-2, math.inf), "r2": (1e-2, math.inf)}

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.causal = cfg.causal
        self.r1 = nn.Parameter(torch.rand(cfg.n_head) * 2)          # U[0, 2)
        self.r2 = nn.Parameter(torch.rand(cfg.n_head))              # U[0, 1)

    def forward(self, q_pos, k_pos):
        self.project_()
        distance = relative_distance(q_pos, k_pos, self.causal)
        return -self.r1[:, None, None] * torch.log1p(self.r2[:, None, None] * distance)


@register_pe("kerple_power")
class KerplePowerBias(_ClampedParameters):
    r"""KERPLE-power (Chi et al., 2022): $b_h(i, j) = -a^{(h)}\,(i - j)^{p^{(h)}}$, from the CPD kernel
    $-a|m - n|^p$ with $0 < p \le 2$; $a \ge 10^{-2}$, $10^{-2} \le p \le 2$ per head."""

    bounds = {"a": (1e-2, math.inf), "p": (1e-2, 2.0)}

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.causal = cfg.causal
        self.a = nn.Parameter(torch.rand(cfg.n_head))               # U[0, 1)
        self.p = nn.Parameter(torch.rand(cfg.n_head) * 2)           # U[0, 2)

    def forward(self, q_pos, k_pos):
        self.project_()
        distance = relative_distance(q_pos, k_pos, self.causal)
        # d^p at d = 0 is 0, but its gradient in p (d^p ln d) is NaN there: take the power on d >= 1 only.
        power = distance.clamp(min=1).pow(self.p[:, None, None])
        return -self.a[:, None, None] * torch.where(distance > 0, power, 0.0)


@register_pe("fire")
class FIREBias(AdditiveBias):
    r"""FIRE (Li et al., 2023): $b(i, j) = f_\theta\!\big(\psi(i - j) / \psi(\max(L, i))\big)$ with
    $\psi(x) = \ln(c|x| + 1)$, $c$ learnable (from 0.1), threshold $L = |\lambda L_0|$ with $\lambda$
    learnable (from 1), $f_\theta$: ``Linear(1, 32) -> ReLU -> Linear(32, h)``. $L_0$ is the training length
    ``block_size`` (the paper's listing uses its own training length, 512): beyond it the normaliser grows
    with $i$, so relative distances stay in $[0, 1]$ at any length."""

    def __init__(self, cfg: GPTConfig, hidden: int = 32, eps: float = 1e-6):
        super().__init__()
        self.causal = cfg.causal
        self.mlp = nn.Sequential(nn.Linear(1, hidden), nn.ReLU(), nn.Linear(hidden, cfg.n_head))
        self.c = nn.Parameter(torch.tensor(0.1))
        self.threshold_scale = nn.Parameter(torch.tensor(1.0))
        self.register_buffer("base_threshold", torch.tensor(float(cfg.block_size)), persistent=False)
        self.eps = eps

    def psi(self, x):
        return torch.log(torch.abs(self.c * x) + 1)

    def normalizer(self, q_pos):
        """$\\psi(\\max(L, i))$ for each query position i: constant below the threshold, growing beyond it."""
        threshold = torch.abs(self.threshold_scale * self.base_threshold)
        return self.psi(torch.maximum(q_pos.float(), threshold))

    def forward(self, q_pos, k_pos):
        distance = relative_distance(q_pos, k_pos, self.causal)
        normalized = self.psi(distance) / (self.normalizer(q_pos)[:, None] + self.eps)
        return self.mlp(normalized[..., None].to(self.c.dtype)).permute(2, 0, 1)  # (h, Tq, Tk)


def pe_has_bias(pe: str) -> bool:
    """True when ``pe`` produces an additive bias matrix B (refiners then see ``[S, B]``)."""
    return issubclass(PE_REGISTRY[pe], AdditiveBias)


# ----------------------------------------------------------------------------------------------------
# Refiners: rewrite the scaled scores S (B, h, Tq, Tk) given the bias B (h, Tq, Tk) or None


class _CellMLP(torch.autograd.Function):
    r"""$Y = W_2\,\mathrm{LeakyReLU}(W_1 X + H_0)$ at every cell: X (B, C_in, N) channels first -> Y (B, C_out, N).

    The refiners' workhorse. The hidden activation (B, W, N) is W/C times larger than the scores, so backward
    recomputes it from X instead of keeping it: training memory stays O(B h T^2), and each big tensor is
    written once per pass. ``shared`` $H_0$ (W, N) or (W, 1) is the part that does not depend on the sequence
    ($W_B B + b_1$): computed once for the whole batch and broadcast. Batched matmuls over a broadcast weight
    keep X and the hidden activation in their channels-first layout: no permute copies.
    """

    @classmethod
    def run(cls, x, shared, w_in, w_out):
        """Apply in the scores' dtype (under autocast the scores may be bfloat16, the weights float32)."""
        return cls.apply(x, *(t.to(x.dtype) for t in (shared, w_in, w_out)))

    @staticmethod
    def batched(w, B: int):
        """w as the same matrix for each of B sequences. Contiguous first: with a transposed or sliced weight
        the batched matmul alone ran 2-4x slower on CPU."""
        return w.contiguous().expand(B, -1, -1)

    @staticmethod
    def forward(ctx, x, shared, w_in, w_out):
        ctx.save_for_backward(x, shared, w_in, w_out)
        return torch.bmm(_CellMLP.batched(w_out, len(x)), _CellMLP.hidden(x, shared, w_in))

    @staticmethod
    def hidden(x, shared, w_in):
        return F.leaky_relu_(torch.baddbmm(shared, _CellMLP.batched(w_in, len(x)), x), 0.01)   # (B, W, N)

    @staticmethod
    def backward(ctx, grad_out):
        x, shared, w_in, w_out = ctx.saved_tensors
        B = len(x)
        hidden = _CellMLP.hidden(x, shared, w_in)        # recomputed; LeakyReLU keeps the sign, all backward needs
        grad_w_out = torch.bmm(grad_out, hidden.transpose(1, 2)).sum(0)
        grad_hidden = torch.bmm(_CellMLP.batched(w_out.t(), B), grad_out)
        torch.ops.aten.leaky_relu_backward.grad_input(grad_hidden, hidden, 0.01, False, grad_input=grad_hidden)
        grad_w_in = torch.bmm(x, grad_hidden.transpose(1, 2)).sum(0).t()      # as (C, W): 1.6-2x faster than (W, C)
        grad_shared = grad_hidden.sum(0)
        if shared.shape[-1] == 1:
            grad_shared = grad_shared.sum(-1, keepdim=True)
        grad_x = torch.bmm(_CellMLP.batched(w_in.t(), B), grad_hidden)
        return grad_x, grad_shared, grad_w_in, grad_w_out


def _shared_hidden(b_in, w_bias=None, bias=None):
    """$H_0 = b_1$ (W, 1), plus $W_B B$ (W, N) when the refiner reads the bias (C_B, N)."""
    shared = b_in[:, None]
    return shared if bias is None else torch.addmm(shared, w_bias, bias)


class _HeadMLP(nn.Module):
    r"""The element-wise MLP of DAPE across heads: ``Linear(C_in, W) -> LeakyReLU(0.01) -> Linear(W, h)``,
    applied at every (query, key) cell. Its input is ``[S, B]`` stacked on the head axis; the first layer is
    split as $W_1 [S; B] = W_S S + W_B B$ so that the bias half, the same for every sequence of the batch, is
    computed once and broadcast."""

    def __init__(self, n_head: int, width: int, with_bias_input: bool):
        super().__init__()
        n_in = 2 * n_head if with_bias_input else n_head
        self.mlp = nn.Sequential(nn.Linear(n_in, width), nn.LeakyReLU(0.01), nn.Linear(width, n_head))

    def forward(self, x, bias=None, residual=None):
        """$x + f([x, B]) + R$: x (B, h, Tq, Tk); the bias B and the residual R (h, Tq, Tk) or None."""
        first, last = self.mlp[0], self.mlp[2]
        B, h, Tq, Tk = x.shape
        shared = _shared_hidden(first.bias, first.weight[:, h:], None if bias is None else bias.reshape(h, -1))
        out = _CellMLP.run(x.reshape(B, h, -1), shared, first.weight[:, :h], last.weight).view(B, h, Tq, Tk)
        small = last.bias[:, None, None] if residual is None else residual + last.bias[:, None, None]
        return torch.add(x, out).add_(small)         # two passes over the batch: the small terms are summed first


@register_refiner("dape")
class DAPERefiner(nn.Module):
    r"""DAPE, Concat_Residual (Zheng et al., 2024, eq. 3): $A = S + B + f([S, B])$, $f$ a two-layer LeakyReLU
    MLP over the $2h$ channels $[S$ per head, $B$ per head$]$ $\to h$, hidden width ``refiner_width``.
    Without a bias (RoPE, NoPE): $A = S + f(S)$ over $h$ channels. Registered as ``cape`` too: CAPE
    (NeurIPS 2024) is the same module — the authors' repository renamed ``CAPE.py`` to ``DAPE.py``."""

    bias_in_output = True

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.f = _HeadMLP(cfg.n_head, cfg.refiner_width, with_bias_input=pe_has_bias(cfg.pe))

    def forward(self, scores, bias, mask):
        return self.f(scores, bias, residual=bias if self.bias_in_output else None)


register_refiner("cape")(DAPERefiner)


@register_refiner("dape_concat")
class DAPEConcatRefiner(DAPERefiner):
    r"""DAPE, Concat (eq. 2): $A = S + f([S, B])$: the bias reaches the scores only through $f$."""

    bias_in_output = False


@register_refiner("dape_add")
class DAPEAddRefiner(nn.Module):
    r"""DAPE, Add_Residual (Figure 5): $A = S + B + f(S + B)$, $f$ over $h$ channels."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.f = _HeadMLP(cfg.n_head, cfg.refiner_width, with_bias_input=False)

    def forward(self, scores, bias, mask):
        return self.f(scores if bias is None else scores + bias)


def _shifted_copies(x, k: int):
    r"""(B, C, R, K) -> (B, k, C, R, K): copy t is x moved along the keys by $d_t = t - k/2$,
    $X_t[\dots, j] = x[\dots, j + d_t]$, zero where $j + d_t$ falls outside the row."""
    out = x.new_empty(x.shape[0], k, *x.shape[1:])
    K = x.shape[-1]
    for t in range(k):
        d = t - k // 2
        lo, hi = max(0, -d), K - max(0, d)                # the keys j whose j + d lies in the row
        out[:, t, ..., lo:hi] = x[..., lo + d: hi + d]
        out[:, t, ..., :lo] = 0
        out[:, t, ..., hi:] = 0
    return out


def _summed_shifts(y, k: int):
    r"""The adjoint of ``_shifted_copies``: (B, k, C, R, K) -> (B, C, R, K), $\sum_t Y_t[\dots, j - d_t]$."""
    out = y[:, k // 2].clone()
    K = y.shape[-1]
    for t in range(k):
        d = t - k // 2
        if d:
            lo, hi = max(0, -d), K - max(0, d)
            out[..., lo + d: hi + d] += y[:, t, ..., lo:hi]
    return out


class _KeyShifts(torch.autograd.Function):
    """``_shifted_copies`` (or, with ``adjoint``, ``_summed_shifts``) whose backward pass is the other one."""

    @staticmethod
    def forward(ctx, x, k: int, adjoint: bool):
        ctx.k, ctx.adjoint = k, adjoint
        return _summed_shifts(x, k) if adjoint else _shifted_copies(x, k)

    @staticmethod
    def backward(ctx, grad):
        return (_shifted_copies(grad, ctx.k) if ctx.adjoint else _summed_shifts(grad, ctx.k)), None, None


@register_refiner("conv")
class ConvRefiner(nn.Module):
    r"""DAPE-V2 (Zheng et al., 2024b, eq. 5): $A = S + B + \mathrm{Conv}(\mathrm{tril}([S, B]))$, two
    $1 \times k$ convolutions along the key axis across the $2h$ head channels (width ``refiner_width``,
    LeakyReLU between, padding $k/2$). ``tril`` zeroes the masked (future) scores first: a query row then
    holds only keys it may see, so the key-axis kernel cannot read the future. Without a bias: $h$ channels.

    Computed as the same cell-wise MLP as DAPE. conv1 is a matrix over the $k$ shifted copies of the input
    ($X_t[j] = X[j + t - k/2]$), and conv2 a matrix giving $k$ per-tap outputs at each key, which are shifted
    into place and summed: $\mathrm{conv2}(H)_j = \sum_t (W_2^{(t)} H)_{j + t - k/2}$ — the transpose of making
    the copies, with the taps in reverse order. Equal to ``nn.Conv2d``, faster.
    """

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        n_in = 2 * cfg.n_head if pe_has_bias(cfg.pe) else cfg.n_head
        k = self.kernel = cfg.refiner_kernel
        self.conv1 = nn.Conv2d(n_in, cfg.refiner_width, (1, k), padding=(0, k // 2))
        self.conv2 = nn.Conv2d(cfg.refiner_width, cfg.n_head, (1, k), padding=(0, k // 2))
        self.key_margin = k // 2   # conv2 reads hidden cells up to k//2 keys past the diagonal

    def forward(self, scores, bias, mask):
        B, h, Tq, Tk = scores.shape
        k = self.kernel

        def copies(x):                                                      # (B, C, Tq, Tk) -> (B, k * C, Tq * Tk)
            return _KeyShifts.apply(x.masked_fill(~mask, 0), k, False).flatten(1, 2).flatten(2)

        w1 = self.conv1.weight[:, :, 0].transpose(1, 2)                      # (W, k, C_in)
        bias_copies = None if bias is None else copies(bias[None])[0]
        shared = _shared_hidden(self.conv1.bias, w1[..., h:].flatten(1), bias_copies)
        w2 = self.conv2.weight[:, :, 0].flip(-1).permute(2, 0, 1).flatten(0, 1)   # (k * h, W), taps reversed
        taps = _CellMLP.run(copies(scores), shared, w1[..., :h].flatten(1), w2)  # (B, k * h, Tq * Tk)
        conv = _KeyShifts.apply(taps.view(B, k, h, Tq, Tk), k, True)
        small = self.conv2.bias[:, None, None] if bias is None else bias + self.conv2.bias[:, None, None]
        return torch.add(scores, conv).add_(small)


# ----------------------------------------------------------------------------------------------------
# Attention, block, GPT


class PositionalInputs(NamedTuple):
    """What every layer needs from the positions, computed once per forward."""
    rotary: tuple[torch.Tensor, torch.Tensor] | None                   # (cos, sin), each (T, hs/2)
    bias: Callable[[int, int, int], torch.Tensor] | None               # (q0, q1, k1) -> (h, q1-q0, k1)
    full_bias: torch.Tensor | None = None                              # (h, T, T) when computed once for all layers


# The refiner's hidden activations of one attention block are kept under this many elements (at least 16
# query rows), so T = 16k evaluation stays bounded: on CPU 16 MB, on a GPU a few hundred MB so that kernel
# launches stay few. A full (h, T, T) bias is precomputed below FULL_BIAS_ELEMENTS.
BLOCK_ELEMENTS = {"cpu": 2 ** 22, "accelerator": 2 ** 26}
FULL_BIAS_ELEMENTS = 2 ** 24


class SelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head, self.head_size = cfg.n_head, cfg.n_embd // cfg.n_head
        self.causal, self.dropout, self.attn_chunk = cfg.causal, cfg.dropout, cfg.attn_chunk
        self.c_attn = _normal_linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = _normal_linear(cfg.n_embd, cfg.n_embd, std=0.02 / math.sqrt(2 * cfg.n_layer))
        self.resid_dropout = nn.Dropout(cfg.dropout)
        refiner_cls = REFINER_REGISTRY[cfg.refiner]
        self.refiner = refiner_cls(cfg) if refiner_cls is not None else None
        self.refiner_width = cfg.refiner_width

    def qkv(self, x, positional: PositionalInputs):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, self.head_size).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        if positional.rotary is not None:
            q, k = apply_rotary(q, *positional.rotary), apply_rotary(k, *positional.rotary)
        return q, k, v

    def forward(self, x, positional: PositionalInputs):
        B, T, C = x.shape
        q, k, v = self.qkv(x, positional)
        if self.refiner is None and positional.bias is None:
            # No bias, no refiner: PyTorch's fused kernel, memory-linear in T.
            y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal,
                                               dropout_p=self.dropout if self.training else 0.0)
        else:
            y = torch.cat(self.attend_blocks(q, k, v, positional), dim=2)
        y = y.transpose(1, 2).contiguous().view(B, T, C)                # (B, T, C)
        return self.resid_dropout(self.c_proj(y))

    def block_rows(self, B: int, T: int, device: torch.device) -> int:
        """Query rows per block. Without a refiner one block, unless the (B, h, T, T) scores would be large."""
        if self.attn_chunk:
            return self.attn_chunk
        if self.refiner is None and B * self.n_head * T * T <= FULL_BIAS_ELEMENTS:
            return T
        channels = self.n_head if self.refiner is None else max(self.n_head, self.refiner_width)
        rows = BLOCK_ELEMENTS["cpu" if device.type == "cpu" else "accelerator"] // (B * channels * T)
        if device.type == "cpu":
            # Fewer, taller blocks have less per-block overhead, but a causal block also computes the upper half
            # of its diagonal square in vain (rows / T of the cells) and leaves the cache: T / 16 rows measured
            # best for T = 128 ... 2048 (DAPE at T = 2048, one sequence: 1.80x of `none` with 16 rows, 1.45x).
            rows = min(rows, T // 16)
        return max(16, rows)

    def attend_blocks(self, q, k, v, positional: PositionalInputs) -> list[torch.Tensor]:
        """Attention in blocks of query rows, each against the keys it can see: (B, nh, rows, hs) per block.

        Keys come in chunks of the block's size; a causal block takes the chunks up to its last row, plus the
        refiner's ``key_margin`` keys from the next chunk (a 1 x k conv reads k//2 masked keys past the diagonal:
        zeros after tril, but its hidden layer is not). Concatenating chunks keeps the backward pass cheap: each
        chunk receives only its own gradient, instead of a zero-filled full-length one per block. The last
        (widest) block runs first, so the memory allocator can reuse its buffers for every narrower one: in the
        other order each block needs slightly more than the last freed, and a 16k-token evaluation's peak memory
        grew several-fold from fragmentation alone.
        """
        B, _, T, _ = q.shape
        rows = self.block_rows(B, T, q.device)
        k, v = k.contiguous(), v.contiguous()
        margin = getattr(self.refiner, "key_margin", 0)
        k_chunks, v_chunks = k.split(rows, dim=2), v.split(rows, dim=2)
        q_blocks = q.split(rows, dim=2)
        # A precomputed bias is cut into the blocks' rows the same way: slicing the full (h, T, T) bias per block
        # made each block's backward zero-fill a full-size gradient (at T = 1024 most of a DAPE step).
        bias_rows = positional.full_bias.split(rows, dim=1) if positional.full_bias is not None else None
        outputs = [None] * len(q_blocks)
        for i in reversed(range(len(q_blocks))):
            q0, q1 = i * rows, i * rows + q_blocks[i].shape[2]
            k1 = min(T, q1 + margin) if self.causal else T
            keys, values = (k, v) if k1 == T else (self._first_keys(k_chunks, k1), self._first_keys(v_chunks, k1))
            key_pos, query_pos = torch.arange(k1, device=q.device), torch.arange(q0, q1, device=q.device)
            mask = key_pos[None, :] <= query_pos[:, None] if self.causal else torch.ones(
                q1 - q0, k1, dtype=torch.bool, device=q.device)
            if positional.bias is None:
                bias = None
            else:
                bias = bias_rows[i][:, :, :k1] if bias_rows is not None else positional.bias(q0, q1, k1)
            outputs[i] = self._attend(q_blocks[i], keys, values, bias, mask)
        return outputs

    @staticmethod
    def _first_keys(chunks, n: int):
        """The first n keys (or values) from whole chunks, plus the start of the next one."""
        rows = chunks[0].shape[2]
        pieces = list(chunks[: n // rows])
        if n % rows:
            pieces.append(chunks[n // rows][:, :, : n % rows])
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=2)

    def _attend(self, q, k, v, bias, mask):
        """Attention of a block of query rows: q (B, nh, rows, hs), k/v (B, nh, keys, hs), bias (nh, rows,
        keys) or None, mask (rows, keys) -> (B, nh, rows, hs)."""
        dropout = self.dropout if self.training else 0.0
        if self.refiner is None:                                       # S + B, fused kernel with a float mask
            attn_mask = bias.masked_fill(~mask, float("-inf")).to(q.dtype)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout)
        scores = self.refiner(self.scores(q, k), bias, mask)           # (B, nh, rows, keys)
        return self._softmax_values(scores, v, mask, dropout)

    def scores(self, q, k):
        return (q * (1.0 / math.sqrt(self.head_size))) @ k.transpose(-2, -1)   # scale the smaller operand

    @staticmethod
    def _softmax_values(scores, v, mask, dropout: float):
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        probs = F.dropout(F.softmax(scores, dim=-1), p=dropout)
        return probs.to(v.dtype) @ v

    @torch.no_grad()
    def inspect(self, x, positional: PositionalInputs) -> dict[str, torch.Tensor]:
        """The plain, full-size pieces of this layer's attention for teaching and plots: ``scores``
        S = QK^T/sqrt(d), ``bias`` B (or None), ``refined`` (what reaches the mask), ``probs``."""
        q, k, v = self.qkv(x, positional)
        T = q.shape[2]
        mask = (torch.ones(T, T, dtype=torch.bool, device=x.device).tril() if self.causal
                else torch.ones(T, T, dtype=torch.bool, device=x.device))
        scores = self.scores(q, k)
        bias = positional.bias(0, T, T) if positional.bias is not None else None
        if self.refiner is not None:
            refined = self.refiner(scores, bias, mask)
        else:
            refined = scores if bias is None else scores + bias
        probs = F.softmax(refined.masked_fill(~mask, torch.finfo(refined.dtype).min), dim=-1)
        return {"scores": scores, "bias": bias, "refined": refined, "probs": probs}


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = _normal_linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = _normal_linear(4 * cfg.n_embd, cfg.n_embd, std=0.02 / math.sqrt(2 * cfg.n_layer))
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(cfg.n_embd), SelfAttention(cfg)
        self.ln_2, self.mlp = nn.LayerNorm(cfg.n_embd), MLP(cfg)

    def forward(self, x, positional: PositionalInputs):
        x = x + self.attn(self.ln_1(x), positional)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """A compact GPT (decoder, or encoder with ``causal=False``) whose attention takes any ``pe`` and any
    ``refiner``. ``logits, loss = model(idx, targets=None)``; targets equal to -1 are ignored."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        nn.init.normal_(self.wte.weight, std=0.02)
        self.pe = PE_REGISTRY[cfg.pe](cfg)                             # shared by all layers
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight                          # weight tying

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def positions(self, T: int, device) -> torch.Tensor:
        """0..T-1, or in training with ``random_positions=L`` a sorted random subset of [0, L) (Ruoss et al.,
        2023; one draw per batch). Evaluation always uses plain positions."""
        L = self.cfg.random_positions
        if L and self.training:
            if T > L:
                raise ValueError(f"sequence length {T} exceeds random_positions={L}")
            return torch.randperm(L, device=device)[:T].sort().values
        return torch.arange(T, device=device)

    def positional_inputs(self, pos) -> PositionalInputs:
        T = len(pos)
        rotary = self.pe(pos, T) if isinstance(self.pe, RotaryEmbedding) else None
        if not isinstance(self.pe, AdditiveBias):
            return PositionalInputs(rotary, None)
        dtype = self.wte.weight.dtype

        def compute(q_pos, k_pos):
            b = self.pe(q_pos, k_pos)
            expected = (self.cfg.n_head, len(q_pos), len(k_pos))
            if tuple(b.shape) != expected:
                raise ValueError(f"pe={self.cfg.pe!r} returned a bias of shape {tuple(b.shape)}; expected "
                                 f"(n_head, Tq, Tk) = {expected}")
            return b.to(dtype)

        # Small enough: compute the bias once for all layers (attention cuts it into its blocks' rows); else per
        # query block.
        full = compute(pos, pos) if self.cfg.n_head * T * T <= FULL_BIAS_ELEMENTS else None

        def bias(q0: int, q1: int, k1: int):
            return full[:, q0:q1, :k1] if full is not None else compute(pos[q0:q1], pos[:k1])
        return PositionalInputs(rotary, bias, full)

    def _check_idx(self, idx):
        if not isinstance(idx, torch.Tensor) or idx.dtype not in (torch.long, torch.int32, torch.int16,
                                                                    torch.int8, torch.uint8):
            got = idx.dtype if isinstance(idx, torch.Tensor) else type(idx).__name__
            raise TypeError(f"idx must be an integer tensor of token ids (torch.long); got {got}")
        if idx.dim() != 2:
            raise ValueError(f"idx must have shape (B, T); got shape {tuple(idx.shape)}")
        if idx.numel() and (idx.min() < 0 or idx.max() >= self.cfg.vocab_size):
            raise ValueError(f"token ids must be in [0, vocab_size={self.cfg.vocab_size}); got values in "
                             f"[{int(idx.min())}, {int(idx.max())}]")

    def hidden_states(self, idx, upto_layer: int | None = None):
        """Embed idx and run the first ``upto_layer`` blocks (all by default): (x, positional inputs)."""
        self._check_idx(idx)
        idx = idx.long()
        pos = self.positions(idx.shape[1], idx.device)
        x = self.wte(idx)                                              # (B, T, C)
        if isinstance(self.pe, AbsolutePositions):
            x = x + self.pe(pos).to(x.dtype)
        x = self.drop(x)
        positional = self.positional_inputs(pos)
        for block in self.blocks[:upto_layer]:
            x = block(x, positional)
        return x, positional

    def forward(self, idx, targets=None):
        x, _ = self.hidden_states(idx)
        logits = self.lm_head(self.ln_f(x))                            # (B, T, vocab)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten().long(), ignore_index=-1)
        return logits, loss

    @torch.no_grad()
    def attention_maps(self, idx, layer: int) -> dict[str, torch.Tensor]:
        """Scores, bias, refined scores and probabilities of one layer (see ``SelfAttention.inspect``)."""
        if not 0 <= layer < self.cfg.n_layer:
            raise ValueError(f"layer must be in [0, {self.cfg.n_layer}); got {layer}")
        x, positional = self.hidden_states(idx, upto_layer=layer)
        block = self.blocks[layer]
        return block.attn.inspect(block.ln_1(x), positional)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None):
        """Sample continuations of idx (B, T) autoregressively (decoders only)."""
        if not self.cfg.causal:
            raise ValueError("generate needs a decoder; this model has causal=False")
        for _ in range(max_new_tokens):
            logits = self(idx)[0][:, -1] / temperature
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, [-1]]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            idx = torch.cat((idx, torch.multinomial(F.softmax(logits, dim=-1), 1)), dim=1)
        return idx
