r"""The minidape GPT in the papers' own form: one file, every positional encoding, every attention refiner.

Read top to bottom:
  1. ``GPTConfig`` and the two registries (positional encodings, refiners).
  2. Positional encodings, in five kinds:
     - absolute: added to the token embeddings (``learned``, ``sinusoidal``);
     - rotary: rotate queries and keys (``rope``, ``yarn``, ``rope_pi``, ``rope_ntk``, ``xpos``, ``hope``);
     - additive biases $B$ of shape ``(n_head, Tq, Tk)`` added to the scores
       (``t5``, ``alibi``, ``kerple_log``, ``kerple_power``, ``fire`` and user biases);
     - biases that read the data, ``(batch, n_head, Tq, Tk)``, one module per layer (``fox``, ``cope``);
     - attention weights computed by the encoding itself, one module per layer (``stick_breaking``, ``path``);
     a per-layer spec (``pe="rope@sliding=32,none"``, ``layer_specs``) picks one per layer with its attention
     window and temperature, and a softmax temperature may grow with the context (``LengthTemperature``).
  3. Refiners, which rewrite the pre-softmax scores $S = QK^\top/\sqrt{d}$ of every layer using $B$
     (DAPE/CAPE MLPs across heads, DAPE-V2 ``1 x kernel`` convolutions).
  4. Attention, one plain function: $\mathrm{softmax}(\mathrm{mask}(\mathrm{refine}(S, B)))\,V$; then the
     transformer block, ``GPT`` and ``check_causal``.

Everything here is written as the papers write it, at full size: a ``(batch, n_head, T, T)`` tensor of scores per
layer. This file imports nothing else from the package and runs alone: copied out of it, with only torch and
einops installed, it builds and trains every encoding and refiner in the forms below. Inside the package,
``fast.py`` computes the same thing faster and in less memory, with the same parameters, when
``GPTConfig(fast=True)`` (the default): it installs itself as ``SelfAttention.fast_attention``, and
``fast_encodings.py`` as ``SelfAttention.fast_qkv`` and ``GPT.fast_bias``.

Letters: $S$ scores, $B$ the additive bias, $A$ the refined scores, $h$ the number of heads; ``batch`` is the
number of sequences, ``T`` their length, ``Tq``/``Tk`` the numbers of queries and keys.
"""

from __future__ import annotations

import copy
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from functools import cached_property

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange

# ----------------------------------------------------------------------------------------------------
# Configuration and registries


@dataclass
class GPTConfig:
    vocab_size: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 128  # training length; not a limit at inference (except pe="learned")
    pe: str = "rope"  # one of PE_NAMES, or names joined by commas, cycled over the layers
    refiner: str = "none"  # one of REFINER_NAMES
    refiner_width: int = 32  # hidden width of the DAPE MLP / conv refiner (D_DAPE)
    refiner_kernel: int = 3  # key-axis kernel size of the "conv" refiner (odd)
    causal: bool = True  # False: bidirectional encoder (Chomsky-hierarchy tasks)
    dropout: float = 0.0
    random_positions: int = 0  # L > 0: train on sorted random positions drawn from [0, L)
    rope_base: float = 10000.0
    tie_embeddings: bool = True  # the output layer shares the token embedding (GPT-2); False: its own weights
    fast: bool = True  # the package's fast path when installed (see SelfAttention); False: forms below
    attn_chunk: int = 0  # for the fast path: query rows per attention block; 0 picks from a memory budget
    temperature: str = "none"  # one of TEMPERATURES: a softmax temperature that grows with the context
    # The knobs the encodings' papers vary (each class's docstring says more); defaults are the authors'.
    fox_gate: str = "data"  # FoX's forget gate, one of FOX_GATES: sigma(w.x + b), or data-independent sigma(b)
    fox_gate_init: str = "zero"  # FoX's b at init: "zero" (the authors', gates 1/2), "alibi", or a gate in (0, 1)
    cope_positions: int = 64  # CoPE's number of position slots P: positions are capped at P - 1
    rope_scale: float = 0.0  # rope_pi/rope_ntk/yarn: 0 scales by T / block_size beyond it (dynamic); s >= 1 fixed
    attention_extras: str = ""  # FoX's "Pro" block: names of ATTENTION_EXTRAS joined by commas, or "pro" (all)

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raise TypeError (wrong type) or ValueError (bad value) naming the field, the value and what is valid."""
        kinds = {
            "pe": str,
            "refiner": str,
            "temperature": str,
            "fox_gate": str,
            "fox_gate_init": str,
            "attention_extras": str,
            "rope_scale": float,
            "causal": bool,
            "tie_embeddings": bool,
            "fast": bool,
            "dropout": float,
            "rope_base": float,
        }
        for field in fields(self):
            value, kind = getattr(self, field.name), kinds.get(field.name, int)
            if kind is float:  # an int is a number too (dropout=0), a bool is not
                ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            else:  # bool is a subclass of int: an int field refuses True
                ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
            if not ok:
                expected = {str: "a string", bool: "True or False", float: "a finite number", int: "an integer"}
                raise TypeError(
                    f"GPTConfig.{field.name} must be {expected[kind]}; got {value!r} ({type(value).__name__})"
                )
        layer_pes = layer_encodings(self)  # checks each name and option of a per-layer spec
        if self.temperature not in TEMPERATURES:
            raise ValueError(f"unknown temperature {self.temperature!r}; valid choices: {', '.join(TEMPERATURES)}")
        if self.refiner not in REFINER_REGISTRY:
            raise ValueError(f"unknown refiner {self.refiner!r}; valid choices: {', '.join(REFINER_NAMES)}")
        for name in ("vocab_size", "n_layer", "n_head", "n_embd", "block_size", "refiner_width"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer; got {getattr(self, name)!r}")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}; choose n_embd as a multiple of n_head"
            )
        head_size = self.n_embd // self.n_head
        if any(issubclass(PE_REGISTRY[name], RotaryEmbedding) for name in layer_pes) and head_size % 2:
            raise ValueError(
                f"pe={self.pe!r} rotates pairs of channels and needs an even head size; "
                f"got n_embd/n_head = {self.n_embd}/{self.n_head} = {head_size}"
            )
        if self.pe == "sinusoidal" and self.n_embd % 2:
            raise ValueError(f"pe='sinusoidal' needs an even n_embd (sin/cos pairs); got {self.n_embd}")
        if self.refiner_kernel < 1 or self.refiner_kernel % 2 == 0:
            raise ValueError(f"refiner_kernel must be an odd integer >= 1 (1, 3, 5, ...); got {self.refiner_kernel!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1); got {self.dropout!r}")
        if not self.rope_base > 1.0:
            raise ValueError(
                f"rope_base must be > 1 (RoPE's frequencies base^(-2i/d) must fall with i); got {self.rope_base!r}"
            )
        if self.rope_base > FLOAT32_MAX:  # inf in float32: every pair but the first stops turning
            raise ValueError(
                f"rope_base must be at most float32's largest number, {FLOAT32_MAX:.4g} (RoPE's "
                f"frequencies are float32); got {self.rope_base!r}"
            )
        if self.random_positions:
            if self.random_positions < self.block_size:
                raise ValueError(
                    f"random_positions must be 0 (off) or an integer L >= block_size="
                    f"{self.block_size}; got {self.random_positions!r}"
                )
            if all(name == "none" or issubclass(PE_REGISTRY[name], LAYER_OWN) for name in layer_pes):
                raise ValueError(f"random_positions needs a pe that reads positions; pe={self.pe!r} reads none")
        own_weights = sorted({name for name in layer_pes if issubclass(PE_REGISTRY[name], AttentionWeights)})
        for spec in layer_specs(self):
            if spec.pe in own_weights and (spec.window or spec.temperature not in (None, "none")):
                raise ValueError(
                    f"pe={self.pe!r}: {spec.pe} computes its own attention weights; it takes no window or "
                    f"temperature ('@' options)"
                )
        for field, off in (("refiner", "none"), ("temperature", "none"), ("causal", True)):
            if own_weights and getattr(self, field) != off:
                got = getattr(self, field)
                raise ValueError(
                    f"pe={self.pe!r}: {', '.join(own_weights)} computes its own attention weights (a decoder's, "
                    f"without softmax logits to refine or sharpen); {field} must be {off!r}, got {got!r}"
                )
        tempered = self.temperature != "none" or any(
            spec.temperature not in (None, "none") for spec in layer_specs(self)
        )
        if tempered and self.block_size < 2:
            raise ValueError(
                f"temperature={self.temperature!r} divides by ln(block_size) and needs block_size >= 2; "
                f"got {self.block_size}"
            )
        if self.attn_chunk < 0:
            raise ValueError(f"attn_chunk must be 0 (automatic) or a positive integer; got {self.attn_chunk!r}")
        if self.fox_gate not in FOX_GATES:
            raise ValueError(f"unknown fox_gate {self.fox_gate!r}; valid choices: {', '.join(FOX_GATES)}")
        fox_gate_init_value(self.fox_gate_init)  # raises on a bad value
        if self.cope_positions < 2:
            raise ValueError(f"cope_positions must be an integer >= 2 (position slots); got {self.cope_positions!r}")
        if self.rope_scale != 0 and self.rope_scale < 1:
            raise ValueError(
                f"rope_scale must be 0 (s = T / block_size beyond the training length) or a fixed s >= 1; "
                f"got {self.rope_scale!r}"
            )
        attention_extras(self)  # raises on an unknown name


@dataclass(frozen=True)
class LayerSpec:
    """One layer of a per-layer spec (``layer_specs``): its encoding's name and the options written after it."""

    pe: str
    window: int = 0  # keys a query may see, itself included; 0: every earlier key
    chunked: bool = False  # the window as fixed chunks of ``window`` tokens (Llama 4) instead of sliding
    temperature: str | None = None  # this layer's temperature (one of TEMPERATURES); None: GPTConfig.temperature
    qk_norm: bool = False  # RMSNorm of this layer's queries and keys (as ``attention_extras="qk_norm"``)


LAYER_OPTIONS = ("sliding=W", "chunk=W", "temp=NAME", "qk_norm")


def parse_layer(entry: str, pe: str) -> LayerSpec:
    """``name[@option...]``, options from LAYER_OPTIONS: ``rope@sliding=64`` (a sliding window of 64 keys),
    ``rope@chunk=64`` (attention within chunks of 64 tokens), ``none@temp=llama4``, ``rope@qk_norm``."""
    name, *options = entry.split("@")
    spec = LayerSpec(name)
    for option in options:
        key, _, value = option.partition("=")
        if key in ("sliding", "chunk") and value.isdigit() and int(value) >= 1:
            spec = replace(spec, window=int(value), chunked=key == "chunk")
        elif key == "temp" and value in TEMPERATURES:
            spec = replace(spec, temperature=value)
        elif option == "qk_norm":
            spec = replace(spec, qk_norm=True)
        else:
            raise ValueError(
                f"unknown layer option {option!r} in pe={pe!r}; valid options after a name and '@': "
                f"{', '.join(LAYER_OPTIONS)} (W a positive integer, NAME one of {', '.join(TEMPERATURES)}), "
                f"e.g. 'rope@sliding=64,rope@sliding=64,rope@sliding=64,none'"
            )
    return spec


def layer_specs(cfg: GPTConfig) -> list[LayerSpec]:
    """Each layer's encoding and options. ``pe`` names one encoding for every layer, or several joined by commas,
    cycled over the layers: ``pe="rope,rope,rope,none"`` gives layers 0-2 RoPE and layer 3 NoPE, then again
    (``"rope,none"`` alternates). After a name, ``@`` options (``parse_layer``) give that layer an attention window
    and its own temperature, so the published hybrids are one string each (block_size 128, windows of 32):

      - RNoPE-SWA (Cohere, Yang et al. 2025): ``"rope@sliding=32,rope@sliding=32,rope@sliding=32,none"``: three
        RoPE layers with a sliding window, one NoPE layer with full attention;
      - Llama 4's iRoPE: ``"rope@chunk=32@qk_norm,rope@chunk=32@qk_norm,rope@chunk=32@qk_norm,none@temp=llama4"``:
        chunked attention on the RoPE layers (optionally QK-norm), full attention on the NoPE layer, which alone
        scales its logits (``LengthTemperature``'s ``llama4``);
      - SWAN-GPT (Puvvada et al. 2025) style: ``"none@temp=log_length,rope@sliding=32,rope@sliding=32,rope@sliding=32"``
        (full NoPE layers with log-length logit scaling interleaved with sliding-window RoPE layers).

    Absolute encodings are added once to the token embeddings, below every layer, so they cannot be one layer's
    choice."""
    entries = cfg.pe.split(",")
    specs = [parse_layer(entry, cfg.pe) for entry in entries]
    for spec in specs:
        if spec.pe not in PE_REGISTRY:
            raise ValueError(
                f"unknown pe {spec.pe!r}"
                + (f" in pe={cfg.pe!r}" if len(entries) > 1 or spec.pe != cfg.pe else "")
                + f"; valid choices: {', '.join(PE_NAMES)}, or several joined by commas "
                f"(cycled over the layers, e.g. 'rope,none'), each with '@' options ({', '.join(LAYER_OPTIONS)})"
            )
    names = [spec.pe for spec in specs]
    if (len(names) > 1 or cfg.pe != names[0]) and any(
        issubclass(PE_REGISTRY[name], AbsolutePositions) for name in names
    ):
        raise ValueError(
            f"pe={cfg.pe!r}: an absolute encoding is added to the token embeddings, not chosen per "
            f"layer; a per-layer spec may name rotary encodings, biases and 'none'"
        )
    if not cfg.causal and any(spec.window for spec in specs):
        raise ValueError(f"pe={cfg.pe!r}: attention windows are for decoders; this config has causal=False")
    if len(specs) > cfg.n_layer:  # the encodings past the last layer would be dropped unseen
        raise ValueError(
            f"pe={cfg.pe!r} names {len(specs)} encodings for n_layer={cfg.n_layer}: give one per layer (a shorter "
            f"list is cycled over the layers), or more layers"
        )
    return [specs[layer % len(specs)] for layer in range(cfg.n_layer)]


def layer_encodings(cfg: GPTConfig) -> list[str]:
    """The encoding's name of each layer (``layer_specs`` without the options)."""
    return [spec.pe for spec in layer_specs(cfg)]


def pe_names(pe: str) -> list[str]:
    """The encodings a ``pe`` string names, without their ``@`` options: ``"rope@sliding=8,none"`` -> rope, none."""
    return [entry.split("@")[0] for entry in pe.split(",")]


# float32's largest number, torch.finfo(torch.float32).max written out so that GPTConfig's checks need no torch
FLOAT32_MAX = (2 - 2**-23) * 2**127
# Softmax temperatures (``GPTConfig.temperature``), see ``LengthTemperature``.
TEMPERATURES = ("none", "log_length", "learned", "llama4")
# FoX's forget gates (``GPTConfig.fox_gate``), see ``ForgetGateBias``.
FOX_GATES = ("data", "constant", "fixed")
# The parts of FoX's "Pro" block (``GPTConfig.attention_extras``), see ``SelfAttention``.
ATTENTION_EXTRAS = ("output_gate", "output_norm", "qk_norm", "kv_shift")


def attention_extras(cfg: GPTConfig) -> frozenset[str]:
    """The parts of FoX's Pro block a config turns on: ``"pro"`` is all four."""
    if cfg.attention_extras == "pro":
        return frozenset(ATTENTION_EXTRAS)
    names = frozenset(cfg.attention_extras.split(",")) - {""}
    for name in sorted(names - set(ATTENTION_EXTRAS)):
        raise ValueError(
            f"unknown attention extra {name!r} in attention_extras={cfg.attention_extras!r}; valid choices: "
            f"{', '.join(ATTENTION_EXTRAS)} joined by commas, or 'pro' (all four)"
        )
    return names


def fox_gate_start(init: str, n_head: int) -> torch.Tensor:
    r"""FoX's gate bias $b_h$ at init (n_head,): ``"zero"`` $b = 0$, every gate $\sigma(0) = 1/2$ (the authors'
    code); ``"alibi"`` $b_h = -\ln(e^{m_h} - 1)$, so $\sigma(b_h) = e^{-m_h}$ with ALiBi's slopes $m_h$ (gates 0.78 to
    0.996 for 8 heads: minidape's choice before it took the authors'); a number $g \in (0, 1)$ (a string such as
    ``"0.993"``, x-transformers' start) $b = \ln(g / (1 - g))$ in every head."""
    gate = fox_gate_init_value(init)
    if gate == "zero":
        return torch.zeros(n_head)
    if gate == "alibi":
        return -torch.log(torch.expm1(alibi_slopes(n_head)))
    return torch.full((n_head,), math.log(gate / (1 - gate)))


def fox_gate_init_value(init: str) -> str | float:
    """``fox_gate_init`` checked: "zero", "alibi", or the gate g in (0, 1) that a number's string gives. Apart from
    ``fox_gate_start`` (which needs torch) so that ``GPTConfig``'s checks need none: the command line runs them
    before loading torch."""
    if init in ("zero", "alibi"):
        return init
    try:
        gate = float(init)
    except ValueError:
        gate = math.nan
    if not 0 < gate < 1:
        raise ValueError(
            f"fox_gate_init must be 'zero' (the authors': gates start at 1/2), 'alibi' (ALiBi's slopes) or a gate "
            f"value strictly between 0 and 1 such as '0.993'; got {init!r}"
        )
    return gate


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


def _builtin(cls) -> bool:
    """minidape's own classes (and the refiner "none"): their names can never be taken over."""
    return cls is None or cls.__module__.split(".")[0] == "minidape"


def _register(registry: dict, kind: str, name: str, check: Callable[[type], None]):
    if not isinstance(name, str) or not name:
        raise ValueError(f"a {kind} name must be a non-empty string; got {name!r}")
    if name in registry and _builtin(registry[name]):
        raise ValueError(
            f"{kind} {name!r} is already registered; registered {kind}s: {', '.join(registry)}. Pick another name."
        )

    def decorator(cls):
        check(cls)
        # A user's name registered again with a new class (a notebook cell run after an edit) takes the new
        # class, with a one-line notice, so editing a bias needs no kernel restart.
        if registry.get(name, cls) is not cls:
            print(
                f"minidape: {kind} {name!r} now builds {cls.__qualname__} (replacing the class registered "
                f"before under that name)",
                file=sys.stderr,
            )
        registry[name] = cls
        return cls

    return decorator


def register_pe(name: str):
    """Class decorator: make ``GPTConfig(pe=name)`` build ``cls(cfg)``.

    ``cls`` subclasses ``AdditiveBias`` (a bias ``(n_head, Tq, Tk)`` from positions), ``DataDependentBias`` (a
    bias ``(batch, n_head, Tq, Tk)`` that reads the layer's input, queries and keys), or, for other kinds of
    encoding, ``AbsolutePositions`` or ``RotaryEmbedding``. A bias value of ``-inf`` means "never attend here"
    (a hard window); NaN or ``+inf`` where a query may attend is an error.

    Registering a name again with another class (a notebook cell re-run after an edit) replaces it and says so
    in one line on stderr, so editing a bias needs no kernel restart; minidape's own names stay refused.
    """

    def check(cls):
        if not (isinstance(cls, type) and issubclass(cls, PE_KINDS)):
            raise TypeError(
                f"register_pe({name!r}) expects a subclass of md.AdditiveBias or md.DataDependentBias "
                f"(or AbsolutePositions / RotaryEmbedding / AttentionWeights); got {cls!r}"
            )

    return _register(PE_REGISTRY, "pe", name, check)


def register_refiner(name: str):
    """Class decorator: make ``GPTConfig(refiner=name)`` build ``cls(cfg)`` in every layer.

    ``cls.forward(scores, bias, mask) -> scores``: ``scores`` ``(batch, h, Tq, Tk)`` already scaled by
    ``1/sqrt(d_head)``, ``bias`` ``(h, Tq, Tk)`` or ``None``, ``mask`` ``(Tq, Tk)`` bool, True where attention
    is allowed. The result must include the bias (if any): it goes straight to the mask and softmax. The bias
    arrives as 0 at masked cells and where the encoding says ``-inf`` (attention is cut there after refining).
    For long sequences a refiner may declare ``row_local = True`` (see ``runs_in_query_blocks`` in the package's
    ``fast.py``). A decoder's refiner must not read the future: ``check_causal(GPTConfig(refiner=name, ...))``
    tells whether any output depends on later tokens (a perturbation test); ``train``, ``compare`` and
    ``reproduce`` run it before the first step and refuse a decoder that fails it.
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
    layers, and may ask it for any query positions against any key positions. A subclass's ``__init__``
    receives ``cfg`` (the ``GPTConfig``) and calls ``super().__init__()``, which takes no arguments. A value of
    ``-inf`` means "never attend here" (a hard window); values on masked (future) cells are ignored."""

    def __init__(self):
        super().__init__()


class DataDependentBias(nn.Module):
    r"""Base class of biases that read the data: ``forward(x, q, k, first_query=0) -> (batch, n_head, Tq, Tk)``,
    added to the scores like an ``AdditiveBias`` and seen by the refiners the same way (as $B$ in $[S, B]$).

    The model builds one instance per layer, ``cls(cfg)``, and calls it in that layer with ``x`` (batch, T, C),
    the layer's input (after its LayerNorm) at every position, ``q`` (batch, n_head, Tq, hs) the queries of
    positions ``first_query .. first_query + Tq - 1`` and ``k`` (batch, n_head, Tk, hs) the keys of positions
    ``0 .. Tk - 1``. The reference form asks for every query against every key; the fast path asks for blocks of
    query rows (so a 16k-token evaluation never holds a (T, T) bias). Cells of keys after the query are
    ignored, but in a decoder the value at (i, j <= i) must not read ``x``, ``q`` or ``k`` beyond position i:
    ``check_causal`` perturbs later tokens and catches a bias that does."""

    def __init__(self):
        super().__init__()


class AttentionWeights(nn.Module):
    r"""Base class of encodings that replace $\mathrm{softmax}(QK^\top/\sqrt{d})$ itself (PaTH, stick-breaking):
    ``forward(x, q, k, v) -> (y, pieces)``, x (batch, T, C) the layer's input (after its LayerNorm), q, k, v
    (batch, n_head, T, hs), y (batch, n_head, T, hs) and ``pieces`` the full-size ``scores`` and ``probs`` (the
    weights) for plots, as ``attention`` gives them. One module per layer, built as ``cls(cfg)``; decoders only;
    no refiner or temperature (they act on softmax logits these encodings do not have, or do differently). These
    are the papers' $O(T^2)$ forms, meant for a CPU at T up to about 512; the fast path runs them as they are."""

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
        self.block_size, self.fixed_scale = cfg.block_size, cfg.rope_scale

    def frequencies_and_scale(self, T: int) -> tuple[torch.Tensor, float]:
        return self.theta, 1.0

    def context_scale(self, T: int) -> float:
        r"""The scale $s$ of the RoPE scaling family (``rope_pi``, ``rope_ntk``, ``yarn``): by default *dynamic*,
        $s = T / L$ from the window length $T$ beyond the training length $L$ (``block_size``), so a prefix's
        outputs change when more tokens follow it; with ``GPTConfig.rope_scale`` $> 0$ a fixed $s$ at every
        length (the papers' fine-tuned setting), so they do not. Scaling applies where $s > 1$."""
        return self.fixed_scale if self.fixed_scale else T / self.block_size

    def forward(self, pos, T: int):
        theta, scale = self.frequencies_and_scale(T)
        angle = pos.float()[:, None] * theta  # (T, d/2)
        return angle.cos() * scale, angle.sin() * scale

    def rotations(self, pos, T: int):
        """((cos, sin) for the queries, (cos, sin) for the keys): the same rotation for both."""
        rotation = self(pos, T)
        return rotation, rotation


def shift_back(t, alpha):
    r"""$\alpha_t t_{t-1} + (1 - \alpha_t) t_t$ along the positions of t (batch, nh, T, hs), $t_{-1} = 0$; alpha
    (batch, nh, T, 1)."""
    previous = F.pad(t, (0, 0, 1, 0))[:, :, :-1]
    return alpha.to(t.dtype) * previous + (1 - alpha.to(t.dtype)) * t


# The kinds of positional encoding ``register_pe`` takes.
PE_KINDS = (AbsolutePositions, RotaryEmbedding, AdditiveBias, DataDependentBias, AttentionWeights)


def apply_rotary(x, cos, sin):
    """Rotate channel pairs (x[..., i], x[..., i + d/2]) of x (batch, nh, T, hs) by the given angles."""
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
        # In training the positions are the model's own (0..T-1, or sorted draws below random_positions): their
        # count tells whether they fit, without reading them on the host (which on a GPU waits for the queue).
        rows = self.table.num_embeddings
        if (len(pos) > rows) if self.training else (pos.max() >= rows):
            raise ValueError(
                f"pe='learned' has a table of {self.table.num_embeddings} positions but got a "
                f"sequence of length {len(pos)} (largest position {int(pos.max())}); a learned "
                f"table cannot extrapolate: evaluate at T <= {self.table.num_embeddings} "
                f"or use another pe"
            )
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
        angle = pos.float()[:, None] * self.omega  # (T, d/2)
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
    interpolated. cos and sin are multiplied by $0.1 \ln s + 1$ (the logits by its square). $s$ is
    ``context_scale``: dynamic (from the window length $T$) unless ``GPTConfig.rope_scale`` fixes it."""

    def __init__(self, cfg: GPTConfig, beta: float = 32.0, alpha: float = 1.0):
        super().__init__(cfg)
        head_size = cfg.n_embd // cfg.n_head

        def correction_dim(r):
            return head_size * math.log(cfg.block_size / (2 * math.pi * r)) / (2 * math.log(cfg.rope_base))

        last = head_size // 2 - 1
        low = min(max(math.floor(correction_dim(beta)), 0), last)
        high = min(max(math.ceil(correction_dim(alpha)), 0), last)
        span = max(high - low, 1e-3)  # avoid 0/0 when low == high
        ramp = ((torch.arange(head_size // 2, dtype=torch.float32) - low) / span).clamp(0, 1)
        self.register_buffer("ramp", ramp, persistent=False)

    def frequencies_and_scale(self, T: int):
        s = self.context_scale(T)
        if s <= 1:
            return self.theta, 1.0
        return self.theta / s * self.ramp + self.theta * (1 - self.ramp), 0.1 * math.log(s) + 1.0


@register_pe("rope_pi")
class PositionInterpolation(RotaryEmbedding):
    r"""Position interpolation (Chen et al., 2023): RoPE trained as usual; at $T > L$ (``block_size``) the
    positions are squeezed into the trained range, $m \to m L / T$, i.e. every frequency is divided by
    $s = T / L$: $\theta'_i = \theta_i / s$. $s$ is ``context_scale``: dynamic, from the window length $T$ (a
    prefix's outputs change when more tokens follow), unless ``GPTConfig.rope_scale`` fixes it."""

    def frequencies_and_scale(self, T: int):
        s = self.context_scale(T)
        return (self.theta / s, 1.0) if s > 1 else (self.theta, 1.0)


@register_pe("rope_ntk")
class NTKAwareRoPE(RotaryEmbedding):
    r"""NTK-aware scaling (bloc97, 2023): at $T > L$ the base grows instead, $\text{base}' = \text{base}\,
    s^{d/(d-2)}$ with $s = T/L$: $\theta'_i = \text{base}'^{-2i/d}$. The fastest pair ($i = 0$) keeps its
    frequency and the slowest ($i = d/2 - 1$) is divided by exactly $s$, as in position interpolation.

    This is the *dynamic* variant (dynamic NTK): $s = T/L$ from the window length $T$, so a prefix's outputs change
    when more tokens follow it; ``GPTConfig.rope_scale`` $= s$ gives the fixed-scale NTK-aware variant
    (``context_scale``)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__(cfg)
        self.base = cfg.rope_base

    def frequencies_and_scale(self, T: int):
        s = self.context_scale(T)
        if s <= 1:
            return self.theta, 1.0
        d = 2 * len(self.theta)
        exponent = torch.arange(0, d, 2, dtype=torch.float32, device=self.theta.device) / d  # 2i/d
        return (self.base * s ** (d / (d - 2))) ** -exponent, 1.0


@register_pe("xpos")
class XPosEmbedding(RotaryEmbedding):
    r"""xPos (Sun et al., 2023): RoPE whose query at position $n$ is also scaled by $\zeta_i^{n/\gamma}$ and
    key at $m$ by $\zeta_i^{-m/\gamma}$, so that pair $i$ of $q_n^\top k_m$ is multiplied by
    $\zeta_i^{(n - m)/\gamma}$: an exponential decay with distance, fastest for the fast pairs (small $i$, high
    frequency, $\zeta_0 = 0.29$) and slowest for the slow ones ($\zeta_i \to 1$).
    $\zeta_i = (2i/d + 0.4)/1.4 \in [0.29, 1)$, $\gamma = 512$ (the paper's scale base).

    The factors are kept as logarithms, $\ell_i(n) = n \ln\zeta_i / \gamma$ (``log_decay``, finite at any
    position), and ``decay_about`` multiplies $q_n$ by $e^{\ell(n) - \ell(c)}$ and $k_m$ by $e^{\ell(c) - \ell(m)}$
    about a centre $c$, which leaves $n - m$ unchanged. Here $c$ is the middle of the sequence (the authors'
    choice: both factors stay near 1); in float32 those factors overflow beyond about 72,500 tokens, so the fast
    path takes each block of queries' last row as its centre instead, where a decoder's factors stay at most
    $e^{\text{rows}\,|\ln\zeta_0|/\gamma}$ at any length (``fast.py``). ``rotations`` is RoPE's."""

    scale_base = 512.0

    def __init__(self, cfg: GPTConfig):
        super().__init__(cfg)
        head_size = cfg.n_embd // cfg.n_head
        zeta = (torch.arange(0, head_size, 2, dtype=torch.float32) / head_size + 0.4) / 1.4
        self.register_buffer("zeta", zeta, persistent=False)

    def log_decay(self, pos):
        r"""$\ell_i(n) = n \ln\zeta_i / \gamma$ (T, d/2): the logarithm of query $n$'s factor on pair $i$."""
        return pos.float()[:, None] * (self.zeta.log() / self.scale_base)


def decay_about(q, k, log_decay, centre):
    r"""xPos's factors about a centre: $q_n e^{\ell(n) - \ell(c)}$ and $k_m e^{\ell(c) - \ell(m)}$, so pair $i$ of
    $q_n^\top k_m$ is multiplied by $e^{\ell_i(n) - \ell_i(m)} = \zeta_i^{(n - m)/\gamma}$. q (batch, nh, Tq, hs) with
    its rows' $\ell$ (Tq, hs/2) and k (batch, nh, Tk, hs) with its rows' $\ell$ (Tk, hs/2): ``log_decay`` is the
    pair (queries' rows, keys' rows); ``centre`` $\ell(c)$ (hs/2,). Channels $i$ and $i + hs/2$ (one pair, see
    ``apply_rotary``) share a factor."""
    query_log, key_log = log_decay
    query_scale = (query_log - centre).exp().repeat(1, 2)  # (Tq, hs)
    key_scale = (centre - key_log).exp().repeat(1, 2)  # (Tk, hs)
    return q * query_scale.to(q.dtype), k * key_scale.to(k.dtype)


@register_pe("hope")
class HoPEEmbedding(RotaryEmbedding):
    r"""HoPE (Chen et al., ACL 2025): RoPE without its low frequencies. A pair whose rotation does not complete a
    full turn within the training length, $2\pi / \theta_i > L$, gets $\theta_i = 0$: those channels carry no
    position at all (position-independent, as in NoPE), at every length. The high-frequency pairs rotate as in
    RoPE; with no slow pair left, no pair ever reaches an angle it did not see in training."""

    def __init__(self, cfg: GPTConfig):
        super().__init__(cfg)
        self.theta = torch.where(2 * math.pi / self.theta <= cfg.block_size, self.theta, 0.0)


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
    r"""For $n$ a power of two: $m_h = 2^{-8h/n}$, $h = 1..n$. Otherwise, with $p = 2^{\lfloor\log_2 n\rfloor}$
    (the largest power of two up to $n$): the $p$ slopes for $p$ heads, then every other slope for $2p$ heads,
    the first $n - p$ of them."""

    def geometric(n):
        start = 2.0 ** (-8.0 / n)
        return [start**h for h in range(1, n + 1)]

    p = 2 ** math.floor(math.log2(n_head))
    slopes = geometric(p) + geometric(2 * p)[0::2][: n_head - p]
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
        diff = q_pos[:, None] - k_pos[None, :]  # i - j
        if self.causal:
            return self.bucket(diff.clamp(min=0), self.num_buckets, self.max_distance)
        half = self.num_buckets // 2  # keys ahead use buckets half..
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
        self.r1 = nn.Parameter(torch.rand(cfg.n_head) * 2)  # U[0, 2)
        self.r2 = nn.Parameter(torch.rand(cfg.n_head))  # U[0, 1)

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
        self.a = nn.Parameter(torch.rand(cfg.n_head))  # U[0, 1)
        self.p = nn.Parameter(torch.rand(cfg.n_head) * 2)  # U[0, 2)

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


# ----------------------------------------------------------------------------------------------------
# Positional encodings: biases that read the data (batch, n_head, Tq, Tk), one module per layer


@register_pe("fox")
class ForgetGateBias(DataDependentBias):
    r"""FoX, the Forgetting Transformer (Lin et al., ICLR 2025): each token $t$ writes a forget gate per head,
    $f_t^{(h)} = \sigma(w_h^\top x_t + b_h)$ (eq. 6), and query $i$ discounts key $j$ by every gate in between:
    $D_{ij} = \sum_{l=j+1}^{i} \ln f_l = c_i - c_j$ with $c_i = \sum_{l \le i} \ln f_l$ (eq. 9). With constant gates
    $f = e^{-m}$ this is ALiBi's $-m (i - j)$: FoX is ALiBi whose slope each token sets. An encoder
    (``causal=False``) counts the gates between the two either way, $D_{ij} = -|c_i - c_j|$.

    ``GPTConfig.fox_gate``: ``"data"`` the gate above; the paper's data-independent ablations ``"constant"``
    $f^{(h)} = \sigma(b_h)$ learned (a learned ALiBi slope per head) and ``"fixed"`` $\sigma(b_h)$ kept at its
    start. ``GPTConfig.fox_gate_init`` sets $b$'s start (``fox_gate_start``): the authors' $b = 0$ by default;
    $w_h$ starts at $N(0, 0.02)$. The authors' Pro block (output gate, output norm, QK-norm, KV-shift) is
    ``GPTConfig.attention_extras``."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.causal, self.kind = cfg.causal, cfg.fox_gate
        start = fox_gate_start(cfg.fox_gate_init, cfg.n_head)
        if self.kind == "data":
            self.gate = _normal_linear(cfg.n_embd, cfg.n_head)
            with torch.no_grad():
                self.gate.bias.copy_(start)
        elif self.kind == "constant":
            self.gate_bias = nn.Parameter(start)  # b_h, learned
        else:
            self.register_buffer("gate_bias", start)  # b_h, fixed

    def log_forget(self, x):
        r"""$\ln f_t$ (batch, n_head, T) from the layer input x (batch, T, C)."""
        if self.kind == "data":
            return F.logsigmoid(self.gate(x)).transpose(1, 2)
        return F.logsigmoid(self.gate_bias).to(x.dtype)[None, :, None].expand(len(x), -1, x.shape[1])

    def forward(self, x, q, k, first_query: int = 0):
        Tq, Tk = q.shape[2], k.shape[2]
        c = self.log_forget(x[:, :Tk]).float().cumsum(-1)  # c_i (batch, nh, Tk)
        D = c[..., first_query : first_query + Tq, None] - c[..., None, :]  # c_i - c_j (batch, nh, Tq, Tk)
        return D if self.causal else -D.abs()


@register_pe("cope")
class ContextualPositionBias(DataDependentBias):
    r"""CoPE, contextual position encoding (Golovneva et al., 2024): a position counts the keys that matter
    instead of the tokens. Gates $g_{ij} = \sigma(S_{ij})$ from the scaled scores $S = QK^\top/\sqrt{d}$; the
    position of key $j$ for query $i$ is the sum of the gates from $j$ to $i$, $p_{ij} = \sum_{t=j}^{i} g_{it}$
    (a real number in $[0, i - j + 1]$), capped at $P - 1$. The bias interpolates the query's reading of learned
    position vectors $e[0..P-1]$ (``(head_size, P)``, shared by the heads, from zeros), with
    $\lfloor p \rfloor$, $\lceil p \rceil$ and $w = p - \lfloor p \rfloor$:
    $z_{ij} = (1 - w)\, q_i^\top e[\lfloor p_{ij} \rfloor] + w\, q_i^\top e[\lceil p_{ij} \rceil]$.
    $P$ = ``GPTConfig.cope_positions``, 64 by default: the paper caps positions well below the context (its
    Wikitext-103 runs: 64 slots for 1,024 tokens, as we read it; x-transformers defaults to 16), so a query counts
    at most $P - 1$ keys back and every farther key shares the last slot, at any length. An encoder counts from
    $i$ to $j$ either way."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.causal = cfg.causal
        self.embeddings = nn.Parameter(torch.zeros(cfg.n_embd // cfg.n_head, cfg.cope_positions))  # e (hs, P)

    def positions(self, q, k, first_query: int = 0):
        r"""$p_{ij}$ (batch, nh, Tq, Tk) in float32: the gates summed from key j to query i."""
        Tq, Tk = q.shape[2], k.shape[2]
        gates = torch.sigmoid((q @ k.transpose(-2, -1)).float() / math.sqrt(q.shape[-1]))  # g (batch, nh, Tq, Tk)
        query = torch.arange(first_query, first_query + Tq, device=q.device)[:, None]
        key = torch.arange(Tk, device=q.device)[None, :]
        before = gates.masked_fill(key > query, 0.0)  # keys j <= i
        counted = before.flip(-1).cumsum(-1).flip(-1)  # sum_{t=j}^{i} g_it
        if self.causal:
            return counted
        after = gates.masked_fill(key < query, 0.0).cumsum(-1)  # keys j >= i: sum_{t=i}^{j} g_it
        return torch.where(key <= query, counted, after)

    def forward(self, x, q, k, first_query: int = 0):
        p = self.positions(q, k, first_query).clamp(max=self.embeddings.shape[1] - 1)
        if p.isnan().any():  # NaN queries or keys: no position to read (gather would take an index of -2^63)
            raise FloatingPointError(
                "pe='cope': its positions are NaN, from NaN queries or keys (a NaN in the input or in a weight)"
            )
        low, high = p.floor(), p.ceil()
        w = (p - low).to(q.dtype)
        read = q @ self.embeddings.to(q.dtype)  # q_i^T e[n] (batch, nh, Tq, P)
        at_low, at_high = read.gather(-1, low.long()), read.gather(-1, high.long())
        return (1 - w) * at_low + w * at_high  # z (batch, nh, Tq, Tk)


# ----------------------------------------------------------------------------------------------------
# Encodings that compute the attention weights themselves (batch, n_head, T, T), one module per layer


@register_pe("stick_breaking")
class StickBreakingAttention(AttentionWeights):
    r"""Stick-breaking attention (Tan et al., ICLR 2025): no softmax. Query $i$ breaks a stick of length 1, from
    its nearest earlier key backwards: with $z_{ij} = q_i^\top k_j/\sqrt{d}$ and $\beta_{ij} = \sigma(z_{ij})$,
    $$A_{ij} = \beta_{ij} \prod_{j < k < i} (1 - \beta_{ik}), \quad j < i, \qquad y_i = \sum_{j<i} A_{ij} v_j,$$
    (the paper's eq. 4-5): key $j$ takes the share $\beta_{ij}$ of what the nearer keys left. The weights sum to at
    most 1 and what is left attends to nothing (query 0 sees no key: $y_0 = 0$). Recency is built in, as in ALiBi,
    but read from the data; no position enters. In log space (as the authors compute it):
    $\ln A_{ij} = \ln\sigma(z_{ij}) + \sum_{j<k<i} \ln\sigma(-z_{ik})$."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()

    def forward(self, x, q, k, v):
        T = q.shape[2]
        z = (q @ k.transpose(-2, -1)).float() / math.sqrt(q.shape[-1])  # z_ij (batch, nh, T, T)
        earlier = torch.ones(T, T, dtype=torch.bool, device=q.device).tril(-1)  # keys j < i
        log_beta = F.logsigmoid(z).masked_fill(~earlier, float("-inf"))  # ln beta_ij
        log_left = F.logsigmoid(-z).masked_fill(~earlier, 0.0)  # ln(1 - beta_ik)
        nearer = log_left.flip(-1).cumsum(-1).flip(-1) - log_left  # sum over j < k < i of ln(1 - beta_ik)
        probs = (log_beta + nearer).exp()  # A_ij, 0 where j >= i
        return probs.to(v.dtype) @ v, {"scores": z, "probs": probs}


@register_pe("path")
class PaTHAttention(AttentionWeights):
    r"""PaTH attention (Yang et al., NeurIPS 2025): between key $j$ and query $i$, a product of data-dependent
    Householder-like transforms $H_t = I - \beta_t w_t w_t^\top$ of the tokens in between (eq. 2-3):
    $$S_{ij} = q_i^\top H_i H_{i-1} \cdots H_{j+1}\, k_j / \sqrt{d}, \qquad y = \mathrm{softmax}(\mathrm{mask}(S))\,V.$$
    Per head, $w_t = \mathrm{normalize}(\mathrm{conv}(W_w x)_t)$ (a causal depthwise convolution of width 3 over
    the positions, then unit length) and $\beta_t = 2\sigma(u^\top x_t + b) \in (0, 2)$: $\beta = 2$ is a reflection,
    smaller values shrink $k$ along $w_t$. RoPE is the special case of fixed rotations; here each token decides
    how it transforms the keys that pass it, which the authors show lets attention track state (flip-flops,
    permutations) that RoPE cannot. $w$'s low-rank factorisation in the authors' layer is left out.

    The form below carries every earlier key through $H_i$ as the query position $i$ advances: $T$ steps of
    $O(T d)$, $O(T^2 d)$ in all (the authors' kernels use a blockwise UT transform instead)."""

    def __init__(self, cfg: GPTConfig, conv_width: int = 3):
        super().__init__()
        self.n_head = cfg.n_head
        self.w_proj = _normal_linear(cfg.n_embd, cfg.n_embd)  # W_w
        self.w_conv = nn.Conv1d(cfg.n_embd, cfg.n_embd, conv_width, groups=cfg.n_embd, padding=conv_width - 1)
        self.beta_proj = _normal_linear(cfg.n_embd, cfg.n_head)  # u, b

    def directions(self, x):
        r"""$w_t$ (batch, nh, T, hs), unit length, and $\beta_t$ (batch, nh, T) from x (batch, T, C)."""
        batch, T, C = x.shape
        w = self.w_conv(self.w_proj(x).transpose(1, 2))[..., :T]  # causal: position t reads t-2..t
        w = F.normalize(w.transpose(1, 2).reshape(batch, T, self.n_head, -1).float(), dim=-1).transpose(1, 2)
        beta = 2 * torch.sigmoid(self.beta_proj(x).float()).transpose(1, 2)
        return w, beta

    def forward(self, x, q, k, v):
        T = q.shape[2]
        w, beta = self.directions(x)
        q, k = q.float(), k.float()
        rows = []
        carried = k[:, :, :0]  # keys j < i carried to position i: H_i ... H_{j+1} k_j
        for i in range(T):
            w_i, beta_i = w[:, :, i, None, :], beta[:, :, i, None, None]  # (batch, nh, 1, hs), (batch, nh, 1, 1)
            carried = carried - beta_i * (carried @ w_i.transpose(-2, -1)) * w_i  # H_i k = k - beta_i (w_i . k) w_i
            carried = torch.cat([carried, k[:, :, i : i + 1]], dim=2)  # k_i joins untransformed
            rows.append(F.pad(q[:, :, i : i + 1] @ carried.transpose(-2, -1), (0, T - i - 1)))  # S_ij, j <= i
        scores = torch.cat(rows, dim=2) / math.sqrt(q.shape[-1])  # S (batch, nh, T, T)
        y, probs = attend(scores, attention_mask(T, True, q.device), v)
        return y, {"scores": scores, "probs": probs}


# Encodings built once per layer (they read the layer's data), not shared by the layers.
LAYER_OWN = (DataDependentBias, AttentionWeights)


def pe_has_bias(pe: str) -> bool:
    """True when ``pe`` (one encoding's name) produces an additive bias B, from positions or from the data
    (refiners then see ``[S, B]``)."""
    return issubclass(PE_REGISTRY[pe], (AdditiveBias, DataDependentBias))


# ----------------------------------------------------------------------------------------------------
# Softmax temperature


class LengthTemperature(nn.Module):
    r"""A softmax temperature that grows with the context (``GPTConfig.temperature``). The refined scores of query
    row $i$, which sees $n_i$ keys ($i + 1$ in a decoder, $T$ in an encoder), are multiplied by $\tau$:
      - ``log_length``: $\tau_i = \max(1, \ln n_i / \ln L)$, $L$ = ``block_size``: nothing changes within the
        training length; beyond it the logits sharpen as $\ln n$, which keeps a softmax over $n$ keys from
        flattening towards uniform as $n$ grows (its entropy would otherwise grow like $\ln n$).
      - ``learned``: $\tau_{h,i} = s_h \ln n_i$, $s_h$ learned per head from $1/\ln L$ (Scalable-Softmax,
        SSMax: $s \ln n$; a learned per-head temperature is also Wang et al.'s (ACL 2024) fix for NoPE).
      - ``llama4``: $\tau_i = 1 + \beta \ln(\lfloor n_i / F \rfloor + 1)$, $\beta = 0.1$ (Llama 4's attention
        temperature tuning, which scales the queries of its NoPE layers only; a per-layer spec's ``@temp=llama4``
        does the same here). Llama 4 has $F = 8192$, its chunk length; here $F$ = ``block_size`` (our choice: the
        length trained at), so $\tau = 1$ within it and grows in steps of $F$ beyond.
    A layer with an attention window (``LayerSpec``) counts the keys in its window: $n_i = \min(i + 1, W)$ sliding,
    $(i \bmod W) + 1$ chunked.
    ``forward(q0, q1, T)`` gives the factors of query rows q0..q1-1 of T tokens: (1 or n_head, q1 - q0, 1)."""

    llama4_beta = 0.1

    def __init__(self, cfg: GPTConfig, kind: str | None = None, window: int = 0, chunked: bool = False):
        super().__init__()
        self.kind, self.causal = cfg.temperature if kind is None else kind, cfg.causal
        self.window, self.chunked, self.train_length = window, chunked, cfg.block_size
        self.register_buffer("log_train_length", torch.tensor(math.log(cfg.block_size)), persistent=False)
        if self.kind == "learned":
            self.scale = nn.Parameter(torch.full((cfg.n_head,), 1 / math.log(cfg.block_size)))  # s_h

    def forward(self, q0: int, q1: int, T: int):
        device = self.log_train_length.device
        keys_seen = (
            torch.arange(q0 + 1, q1 + 1, device=device) if self.causal else torch.full((q1 - q0,), T, device=device)
        )
        if self.window:  # a decoder's window: the keys in it
            keys_seen = (keys_seen - 1) % self.window + 1 if self.chunked else keys_seen.clamp(max=self.window)
        if self.kind == "llama4":  # 1 + beta ln(floor(n / F) + 1)  (1, Tq, 1)
            steps = torch.div(keys_seen, self.train_length, rounding_mode="floor")
            return (1 + self.llama4_beta * torch.log1p(steps.float()))[None, :, None]
        log_n = keys_seen.float().log()[None, :, None]  # ln n_i (1, Tq, 1)
        if self.kind == "log_length":
            return (log_n / self.log_train_length).clamp(min=1)
        return self.scale[:, None, None] * log_n  # s_h ln n_i (nh, Tq, 1)


# ----------------------------------------------------------------------------------------------------
# Refiners: rewrite the scaled scores S (batch, h, Tq, Tk) given the bias B (h, Tq, Tk) or None


LEAKY_SLOPE = 0.01  # LeakyReLU's negative slope in DAPE's MLP and DAPE-V2's convolutions (the authors' code)


class HeadMLP(nn.Module):
    r"""DAPE's $f$: ``Linear(C_in, W) -> LeakyReLU(0.01) -> Linear(W, h)`` applied at every (query, key) cell
    over the channel axis, $f(X)_{:, i, j} = W_2\,\mathrm{LeakyReLU}(W_1 X_{:, i, j} + b_1) + b_2$. The channels
    are the heads' scores (and biases): a cell's refined score reads every head at that cell, and nothing else."""

    def __init__(self, n_in: int, width: int, n_head: int):
        super().__init__()
        # One Sequential, so that checkpoints keep the keys mlp.0 and mlp.2; the names below say what each is.
        self.mlp = nn.Sequential(nn.Linear(n_in, width), nn.LeakyReLU(LEAKY_SLOPE), nn.Linear(width, n_head))

    @property
    def hidden_layer(self) -> nn.Linear:  # W_1, b_1
        return self.mlp[0]

    @property
    def activation(self) -> nn.LeakyReLU:
        return self.mlp[1]

    @property
    def output_layer(self) -> nn.Linear:  # W_2, b_2
        return self.mlp[2]

    def forward(self, x):
        """(batch, C_in, Tq, Tk) -> (batch, h, Tq, Tk)."""
        cells = rearrange(x, "batch channel query key -> batch query key channel")
        return rearrange(self.mlp(cells), "batch query key head -> batch head query key")


def stack_scores_and_bias(scores, bias):
    r"""$[S, B]$: the bias, the same for every sequence, stacked after the scores on the head axis:
    (batch, h, Tq, Tk) and (h, Tq, Tk) -> (batch, 2h, Tq, Tk). Without a bias, $S$ alone."""
    if bias is None:
        return scores
    return torch.cat([scores, bias.expand(len(scores), -1, -1, -1)], dim=1)


@register_refiner("dape")
class DAPERefiner(nn.Module):
    r"""DAPE, Concat_Residual (Zheng et al., 2024, eq. 3): $A = S + B + f([S, B])$, $f$ a two-layer LeakyReLU
    MLP (``HeadMLP``) over the $2h$ channels $[S$ per head, $B$ per head$]$ $\to h$, hidden width
    ``refiner_width``. Without a bias (RoPE, NoPE): $A = S + f(S)$ over $h$ channels. Registered as ``cape``
    too: CAPE (NeurIPS 2024) is the same module -- the authors' repository renamed ``CAPE.py`` to ``DAPE.py``.

    Masked (future) cells go through $f$ like the others and are masked afterwards, as in the authors' code:
    $f$ works per cell, so they cannot reach a visible one."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        n_in = 2 * cfg.n_head if pe_has_bias(cfg.pe) else cfg.n_head
        self.f = HeadMLP(n_in, cfg.refiner_width, cfg.n_head)

    def forward(self, scores, bias, mask):
        refined = scores + self.f(stack_scores_and_bias(scores, bias))  # S + f([S, B])
        return refined if bias is None else refined + bias  # + B


register_refiner("cape")(DAPERefiner)


@register_refiner("dape_concat")
class DAPEConcatRefiner(DAPERefiner):
    r"""DAPE, Concat (eq. 2): $A = S + f([S, B])$: the bias reaches the scores only through $f$."""

    def forward(self, scores, bias, mask):
        return scores + self.f(stack_scores_and_bias(scores, bias))


@register_refiner("dape_add")
class DAPEAddRefiner(nn.Module):
    r"""DAPE, Add_Residual (Figure 5): $A = S + B + f(S + B)$, $f$ over $h$ channels."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.f = HeadMLP(cfg.n_head, cfg.refiner_width, cfg.n_head)

    def forward(self, scores, bias, mask):
        biased = scores if bias is None else scores + bias  # S + B
        return biased + self.f(biased)


@register_refiner("conv")
class ConvRefiner(nn.Module):
    r"""DAPE-V2 (Zheng et al., 2024b, eq. 5): $A = S + B + \mathrm{Conv}(\mathrm{tril}([S, B]))$,
    $\mathrm{Conv} = \mathrm{conv}_2 \circ \mathrm{LeakyReLU} \circ \mathrm{conv}_1$: two ``1 x kernel``
    convolutions along the key axis across the $2h$ channels $[S, B]$ (width ``refiner_width``, padding
    ``kernel // 2``, ``kernel = refiner_kernel``). Without a bias: $h$ channels.

    ``tril`` zeroes the masked (future) cells first: query row $i$ then holds only keys $j \le i$, so the
    key-axis kernel cannot read the future (without it, the padding reads future scores: the paper's
    "cheating" run). We zero exactly the cells the attention mask hides. In a decoder that is ``tril``. In an
    encoder (``causal=False``) nothing is hidden and nothing is zeroed: the authors' listing applies ``tril``
    unconditionally, but there every key is visible, and zeroing the upper triangle would only hide half of
    the visible scores from the convolution (the refined upper triangle would read zeros), so we deviate.
    """

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        n_in = 2 * cfg.n_head if pe_has_bias(cfg.pe) else cfg.n_head
        kernel = cfg.refiner_kernel
        self.conv1 = nn.Conv2d(n_in, cfg.refiner_width, (1, kernel), padding=(0, kernel // 2))
        self.conv2 = nn.Conv2d(cfg.refiner_width, cfg.n_head, (1, kernel), padding=(0, kernel // 2))

    def forward(self, scores, bias, mask):
        lower = stack_scores_and_bias(scores, bias).masked_fill(~mask, 0.0)  # tril([S, B]) (batch, C, Tq, Tk)
        conv = self.conv2(F.leaky_relu(self.conv1(lower), LEAKY_SLOPE))  # (batch, h, Tq, Tk)
        refined = scores + conv
        return refined if bias is None else refined + bias


# ----------------------------------------------------------------------------------------------------
# Attention, block, GPT


def attention_mask(T: int, causal: bool, device=None) -> torch.Tensor:
    """(T, T) bool, True where query i may attend to key j: j <= i in a decoder, everywhere in an encoder."""
    if not causal:
        return torch.ones(T, T, dtype=torch.bool, device=device)
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()


def window_mask(
    q0: int, q1: int, k0: int, k1: int, causal: bool, window: int = 0, chunked: bool = False, device=None
) -> torch.Tensor:
    r"""Queries q0..q1-1 against keys k0..k1-1, (q1 - q0, k1 - k0) bool: ``attention_mask``'s cells, and with a
        ``window`` $W$ only the keys in it: sliding, $i - W < j \le i$ (the $W$ latest keys, the query's own
        included; Mistral, Cohere's RNoPE-SWA); chunked, $\lfloor j/W
    floor = \lfloor i/W
    floor$, $j \le i$ (the
        sequence cut into chunks of $W$ tokens, each attending within itself; Llama 4)."""
    i = torch.arange(q0, q1, device=device)[:, None]
    j = torch.arange(k0, k1, device=device)[None, :]
    allowed = j <= i if causal else torch.ones(q1 - q0, k1 - k0, dtype=torch.bool, device=device)
    if window and chunked:
        allowed = allowed & (torch.div(j, window, rounding_mode="floor") == torch.div(i, window, rounding_mode="floor"))
    elif window:
        allowed = allowed & (j > i - window)
    return allowed


def refiner_view(bias, mask):
    r"""What a refiner sees of the bias $B$ (h, Tq, Tk), and where attention is allowed (h, Tq, Tk) bool.

    A bias of $-\infty$ means "never attend here" (a hard window). Those cells and the masked ones reach the
    refiner as $B = 0$, a finite value chosen through ``where`` (whose gradient there is 0, never NaN): neither
    $-\infty$ nor whatever an encoding leaves on masked cells (NaN included) enters a refiner's arithmetic or its
    gradients. Attention is cut at all of them again after refining. Without a bias: ``(None, mask)``."""
    if bias is None:
        return None, mask
    allowed = mask & (bias != float("-inf"))
    return torch.where(allowed, bias, 0.0), allowed


def attention(q, k, v, bias, mask, refiner=None, dropout: float = 0.0, temperature=None):
    r"""$y = \mathrm{softmax}(\mathrm{mask}(\tau \odot \mathrm{refine}(S, B)))\,V$, $S = QK^\top/\sqrt{d_{head}}$, at
    full size.

    q (batch, nh, Tq, hs), k and v (batch, nh, Tk, hs), bias $B$ (nh, Tq, Tk) from positions, or
    (batch, nh, Tq, Tk) from the data, or None, mask (Tq, Tk) bool (True where a query may attend), temperature
    $\tau$ (1 or nh, Tq, 1) or None (1). $\mathrm{refine}(S, B) = S + B$ without a refiner. Returns y
    (batch, nh, Tq, hs) and the pieces ``scores`` $S$, ``bias`` $B$ (as the encoding gave it), ``refined`` $A$
    (what reaches the mask) and ``probs``, for plots and teaching.
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # S (batch, nh, Tq, Tk)
    seen_bias, allowed = refiner_view(bias, mask)
    if refiner is not None:
        refined = check_refined(refiner, refiner(scores, seen_bias, mask), scores)  # A = refine(S, B)
    else:
        refined = scores if bias is None else scores + seen_bias  # A = S + B
    if temperature is not None:
        refined = refined * temperature  # tau (.) A
    y, probs = attend(refined, allowed, v, dropout)
    return y, {"scores": scores, "bias": bias, "refined": refined, "probs": probs}


def attend(refined, allowed, v, dropout: float = 0.0):
    """softmax(mask(A)) V: (y (batch, nh, Tq, hs), probs (batch, nh, Tq, Tk)). The mask fills with the dtype's
    minimum, as the authors' code does; cells where $B = -\\infty$ are cut the same way (``refiner_view``)."""
    masked = refined.masked_fill(~allowed, torch.finfo(refined.dtype).min)
    probs = F.dropout(F.softmax(masked, dim=-1), p=dropout)
    return probs.to(v.dtype) @ v, probs  # under autocast A may be float32 (bf16 S + float32 B), V bfloat16


class PositionalInputs:
    """What every layer needs from the positions, computed once per forward and shared by all layers (of one
    encoding); a layer whose bias reads the data takes its own copy (``reading``)."""

    def __init__(self, positions, rotary, bias_between, data_bias=None, log_decay=None):
        self.positions = positions  # (T,)
        self.rotary = rotary  # ((cos, sin) for queries, (cos, sin) for keys), each (T, hs/2); or None
        self.log_decay = log_decay  # xPos's logarithms of its factors (T, hs/2), see ``decay_about``; or None
        self.bias_between = bias_between  # (q_pos, k_pos) -> B (nh, Tq, Tk), checked; or None: no such bias
        self.data_bias = data_bias  # (q0, q1, k1) -> B (batch, nh, q1 - q0, k1), checked; or None

    @property
    def has_bias(self) -> bool:
        return self.bias_between is not None or self.data_bias is not None

    def bias_rows(self, q0: int, q1: int, k1: int) -> torch.Tensor:
        """$B$ of the queries at indices q0..q1-1 against the keys 0..k1-1."""
        if self.data_bias is not None:
            return self.data_bias(q0, q1, k1)
        return self.bias_between(self.positions[q0:q1], self.positions[:k1])

    @cached_property
    def full_bias(self) -> torch.Tensor | None:
        """$B$ (nh, T, T) or (batch, nh, T, T), computed at the first layer that asks and reused by the others."""
        T = len(self.positions)
        return self.bias_rows(0, T, T) if self.has_bias else None

    def reading(self, data_bias: Callable) -> PositionalInputs:
        """A layer's own inputs, whose bias reads the layer's data: ``data_bias(q0, q1, k1)``."""
        return PositionalInputs(self.positions, self.rotary, None, data_bias, self.log_decay)

    def decayed(self, q, k):
        """q and k with xPos's factors about the middle of the sequence (``decay_about``), when it has them."""
        if self.log_decay is None:
            return q, k
        return decay_about(q, k, (self.log_decay, self.log_decay), self.log_decay.mean(0))


class SelfAttention(nn.Module):
    r"""One layer's attention. ``GPTConfig.attention_extras`` adds the parts of FoX's "Pro" block (Lin et al.,
    ICLR 2025, section 3.2, as we read it), each usable alone and with any encoding:
      - ``kv_shift``: a data-dependent token shift of keys and values, per head
        $k_t \leftarrow \alpha_t k_{t-1} + (1 - \alpha_t) k_t$ with $\alpha_t = \sigma(w_\alpha^\top x_t)$ (and the same
        for $v$ with its own $w$); $k_{-1} = 0$;
      - ``qk_norm``: $q \leftarrow \mathrm{RMSNorm}(q)$, $k \leftarrow \mathrm{RMSNorm}(k)$ per head, after the
        shift and before any rotation;
      - ``output_norm``: each head's output $\mathrm{RMSNorm}(o^{(h)})$;
      - ``output_gate``: $o \leftarrow o \odot \sigma(W_g x)$ before the output projection.
    """

    # Another implementation of ``attention`` with the same parameters, installed by whoever has one (the
    # package's fast.py does when imported): a function (layer, q, k, v, positional) -> y, used when
    # cfg.fast is True. This file has none: copied alone, every layer runs the form below. ``fast_qkv`` (from
    # fast_encodings.py) likewise stands in for ``qkv``: a function (layer, x, positional) -> q, k, v.
    fast_attention: Callable | None = None
    fast_qkv: Callable | None = None

    def __init__(self, cfg: GPTConfig, spec: LayerSpec | None = None):
        super().__init__()
        self.cfg = cfg
        spec = layer_specs(cfg)[0] if spec is None else spec
        self.pe = spec.pe  # this layer's encoding (a name)
        self.window, self.chunked = spec.window, spec.chunked  # its attention window (0: none), see attention_mask
        self.n_head, self.head_size = cfg.n_head, cfg.n_embd // cfg.n_head
        self.c_attn = _normal_linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = _normal_linear(cfg.n_embd, cfg.n_embd, std=0.02 / math.sqrt(2 * cfg.n_layer))
        self.resid_dropout = nn.Dropout(cfg.dropout)
        encoding = PE_REGISTRY[self.pe]
        self.data_bias = encoding(cfg) if issubclass(encoding, DataDependentBias) else None  # this layer's own
        self.weights = encoding(cfg) if issubclass(encoding, AttentionWeights) else None  # PaTH, stick-breaking
        temperature = cfg.temperature if spec.temperature is None else spec.temperature
        self.temperature = (
            LengthTemperature(cfg, temperature, self.window, self.chunked) if temperature != "none" else None
        )
        refiner_cls = REFINER_REGISTRY[cfg.refiner]  # built for this layer's encoding (its B or none)
        refiner_cfg = cfg if self.pe == cfg.pe else replace(cfg, pe=self.pe)  # the refiner sees one encoding
        self.refiner = refiner_cls(refiner_cfg) if refiner_cls is not None else None
        extras = attention_extras(cfg)
        self.shifts_kv = _normal_linear(cfg.n_embd, 2 * cfg.n_head) if "kv_shift" in extras else None  # w_alpha
        self.q_norm = nn.RMSNorm(self.head_size) if "qk_norm" in extras or spec.qk_norm else None
        self.k_norm = nn.RMSNorm(self.head_size) if "qk_norm" in extras or spec.qk_norm else None
        self.output_norm = nn.RMSNorm(self.head_size) if "output_norm" in extras else None
        self.output_gate = _normal_linear(cfg.n_embd, cfg.n_embd) if "output_gate" in extras else None  # W_g
        self._values_checked = set()  # the blocks of rows whose data-dependent bias was checked in training

    def qkv(self, x, positional: PositionalInputs):
        batch, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        # (batch, T, C) -> (batch, nh, T, hs) each
        q, k, v = (t.view(batch, T, self.n_head, self.head_size).transpose(1, 2) for t in (q, k, v))
        if self.shifts_kv is not None:
            alpha = torch.sigmoid(self.shifts_kv(x)).transpose(1, 2)[..., None]  # (batch, 2 nh, T, 1)
            k, v = (shift_back(t, a) for t, a in zip((k, v), alpha.chunk(2, dim=1)))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if positional.rotary is not None:
            query_rotation, key_rotation = positional.rotary
            q, k = apply_rotary(q, *query_rotation), apply_rotary(k, *key_rotation)
        return q, k, v

    def inputs(self, x, q, k, positional: PositionalInputs) -> PositionalInputs:
        """The positional inputs, plus this layer's bias that reads x, q and k (when its encoding has one)."""
        if self.data_bias is None:
            return positional

        def bias_rows(q0, q1, k1):
            bias = self.data_bias(x, q[:, :, q0:q1], k[:, :, :k1], first_query=q0)  # B (batch, nh, Tq, Tk)
            # the checks of a position-only bias (GPT.positional_inputs), on every block of rows either path asks
            check_bias(self.pe, bias, ("batch", "n_head", "Tq", "Tk"), (len(x), self.n_head, q1 - q0, k1), x)
            if not (self.training and (q0, q1, k1) in self._values_checked):  # a host read: once in training
                rows = torch.arange(q0, q1, device=x.device)
                check_bias_values(self.cfg, self.pe, bias, rows, torch.arange(k1, device=x.device))
                if self.training:
                    self._values_checked.add((q0, q1, k1))
            return bias

        return positional.reading(bias_rows)

    def forward(self, x, positional: PositionalInputs):
        batch, T, C = x.shape
        fast = self.cfg.fast and SelfAttention.fast_attention is not None and self.weights is None
        if fast and SelfAttention.fast_qkv is not None:
            q, k, v = SelfAttention.fast_qkv(self, x, positional)
        else:
            q, k, v = self.qkv(x, positional)
        positional = self.inputs(x, q, k, positional)
        if self.weights is not None:  # PaTH, stick-breaking: their own weights, in their papers' form
            y, _ = check_weights(self.pe, self.weights(x, q, k, v), v)
        elif fast:
            y = SelfAttention.fast_attention(self, q, k, v, positional)
        else:
            dropout = self.cfg.dropout if self.training else 0.0
            q, k = positional.decayed(q, k)
            y, _ = attention(
                q,
                k,
                v,
                positional.full_bias,
                self.mask(T, x.device),
                self.refiner,
                dropout,
                self.temperature_rows(0, T, T),
            )
        if self.output_norm is not None:
            y = self.output_norm(y)  # RMSNorm of each head's output
        y = y.transpose(1, 2).contiguous().view(batch, T, C)  # (batch, T, C)
        if self.output_gate is not None:
            y = y * torch.sigmoid(self.output_gate(x))  # o (.) sigma(W_g x)
        return self.resid_dropout(self.c_proj(y))

    def mask(self, T: int, device=None) -> torch.Tensor:
        """(T, T) bool, True where query i may attend to key j: ``attention_mask`` cut to this layer's window."""
        return window_mask(0, T, 0, T, self.cfg.causal, self.window, self.chunked, device)

    @property
    def reshapes_qk(self) -> bool:
        """Whether ``qkv`` does more than project and rotate (FoX's KV-shift or QK-norm)."""
        return self.shifts_kv is not None or self.q_norm is not None

    def temperature_rows(self, q0: int, q1: int, T: int):
        r"""$\tau$ of query rows q0..q1-1 (1 or nh, rows, 1), or None without a temperature."""
        return None if self.temperature is None else self.temperature(q0, q1, T)

    @torch.no_grad()
    def inspect(self, x, positional: PositionalInputs) -> dict[str, torch.Tensor]:
        """The full-size pieces of this layer's attention (see ``attention``), always in the reference form."""
        q, k, v = self.qkv(x, positional)
        T = q.shape[2]
        positional = self.inputs(x, q, k, positional)
        q, k = positional.decayed(q, k)
        if self.weights is not None:
            pieces = check_weights(self.pe, self.weights(x, q, k, v), v)[1]
            return {"scores": pieces["scores"], "bias": None, "refined": pieces["scores"], "probs": pieces["probs"]}
        return attention(
            q,
            k,
            v,
            positional.full_bias,
            self.mask(T, x.device),
            self.refiner,
            temperature=self.temperature_rows(0, T, T),
        )[1]


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

    def __init__(self, cfg: GPTConfig, spec: LayerSpec | None = None):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(cfg.n_embd), SelfAttention(cfg, spec)
        self.ln_2, self.mlp = nn.LayerNorm(cfg.n_embd), MLP(cfg)

    def forward(self, x, positional: PositionalInputs):
        x = x + self.attn(self.ln_1(x), positional)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """A compact GPT (decoder, or encoder with ``causal=False``) whose attention takes any ``pe`` and any
    ``refiner``. ``logits, loss = model(idx, targets=None)``; targets equal to -1 are ignored. The checks on
    what reaches the model (token ids, targets, a user's bias) follow the class.

    ``model.pe`` is the encoding, one module shared by all layers; a bias that reads the data lives in each
    layer instead (``blocks[l].attn.data_bias``, and ``model.pe`` is NoPE's empty module). With a per-layer
    spec (``pe="rope,none"``, see ``layer_encodings``) ``model.pe`` holds one shared module per name."""

    # Like ``SelfAttention.fast_attention``: installed by fast_encodings.py, (encoding, q_pos, k_pos) -> the bias
    # computed faster, used when cfg.fast is True.
    fast_bias: Callable | None = None

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        nn.init.normal_(self.wte.weight, std=0.02)
        self.layer_pes = layer_encodings(cfg)
        shared = {
            name: PE_REGISTRY[name]
            for name in dict.fromkeys(self.layer_pes)
            if not issubclass(PE_REGISTRY[name], LAYER_OWN)
        }
        if len(set(self.layer_pes)) == 1:  # shared by all layers
            self.pe = shared.get(self.layer_pes[0], NoPositions)(cfg)
        else:
            self.pe = nn.ModuleDict({name: encoding(cfg) for name, encoding in shared.items()})
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, spec) for spec in layer_specs(cfg))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight  # weight tying (GPT-2)
        else:
            nn.init.normal_(self.lm_head.weight, std=0.02)
        self._values_checked = set()  # see check_values

    def forward(self, idx, targets=None):
        check_idx(self, idx)
        if targets is not None:
            check_targets(self, targets, idx)
        x, _ = self.hidden_states(idx)
        logits = self.lm_head(self.ln_f(x))  # (batch, T, vocab)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(
                logits.float().flatten(0, 1), targets.flatten().long().to(logits.device), ignore_index=-1
            )
        return logits, loss

    def hidden_states(self, idx, upto_layer: int | None = None):
        """Embed idx (checked by the caller) and run the first ``upto_layer`` blocks (all by default):
        (x, each layer's positional inputs)."""
        idx = idx.long()
        pos = self.positions(idx.shape[1], idx.device)
        x = self.wte(idx)  # (batch, T, C)
        if isinstance(self.pe, AbsolutePositions):
            x = x + self.pe(pos).to(x.dtype)
        x = self.drop(x)
        encodings = self.pe.items() if isinstance(self.pe, nn.ModuleDict) else [(self.layer_pes[0], self.pe)]
        inputs = {name: self.positional_inputs(pos, encoding) for name, encoding in encodings}
        layer_inputs = [inputs.get(name) or PositionalInputs(pos, None, None) for name in self.layer_pes]
        for block, positional in zip(self.blocks[:upto_layer], layer_inputs):
            x = block(x, positional)
        return x, layer_inputs

    def positions(self, T: int, device) -> torch.Tensor:
        """0..T-1, or in training with ``random_positions=L`` a sorted random subset of [0, L) (Ruoss et al.,
        2023; one draw per batch). Evaluation always uses plain positions."""
        L = self.cfg.random_positions
        if L and self.training:
            if T > L:
                raise ValueError(f"sequence length {T} exceeds random_positions={L}")
            return torch.randperm(L, device=device)[:T].sort().values
        return torch.arange(T, device=device)

    def positional_inputs(self, pos, encoding: nn.Module) -> PositionalInputs:
        """What the layers of one position-only ``encoding`` need: its rotations, or its bias."""
        rotary = encoding.rotations(pos, len(pos)) if isinstance(encoding, RotaryEmbedding) else None
        if not isinstance(encoding, AdditiveBias):
            log_decay = encoding.log_decay(pos) if isinstance(encoding, XPosEmbedding) else None
            return PositionalInputs(pos, rotary, None, log_decay=log_decay)
        checked = set()  # every layer asks for the same query and key positions: check their values once
        fast = self.cfg.fast and GPT.fast_bias is not None

        def bias_between(q_pos, k_pos):
            bias = GPT.fast_bias(encoding, q_pos, k_pos) if fast else encoding(q_pos, k_pos)  # B (nh, Tq, Tk)
            shape = (len(pos), len(q_pos), len(k_pos))
            if shape not in checked:
                check_bias(self.cfg.pe, bias, ("n_head", "Tq", "Tk"), (self.cfg.n_head, *shape[1:]), self.wte.weight)
                self.check_values(
                    ("bias", *shape), lambda: check_bias_values(self.cfg, self.cfg.pe, bias, q_pos, k_pos)
                )
                checked.add(shape)
            return bias.to(self.wte.weight.dtype)

        return PositionalInputs(pos, rotary, bias_between)

    def check_values(self, key: tuple, check: Callable[[], None]) -> None:
        """Run ``check``, a check that reads tensor values on the host. On a GPU such a read waits for all the
        work queued so far, so in training it runs on the first batch of each ``key`` (kind and shape) only
        (the training loop checks its data's range up front and stops at the first non-finite loss); otherwise
        on every call."""
        if self.training and key in self._values_checked:
            return
        check()
        if self.training:
            self._values_checked.add(key)

    @torch.no_grad()
    def attention_maps(self, idx, layer: int) -> dict[str, torch.Tensor]:
        """Scores, bias, refined scores and probabilities of one layer at full size (see ``attention``)."""
        if not _is_int(layer) or not 0 <= layer < self.cfg.n_layer:
            raise ValueError(f"layer must be an integer in [0, {self.cfg.n_layer}); got {layer!r}")
        if isinstance(idx, torch.Tensor):
            idx = idx.to(self.device)
        check_idx(self, idx)
        x, layer_inputs = self.hidden_states(idx, upto_layer=layer)
        block = self.blocks[layer]
        return block.attn.inspect(block.ln_1(x), layer_inputs[layer])

    @torch.no_grad()
    def generate(self, idx, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None):
        """Sample continuations of idx (batch, T) autoregressively (decoders only), on the model's device."""
        check_sampling(self, max_new_tokens, temperature, top_k)
        if isinstance(idx, torch.Tensor):
            idx = idx.to(self.device)
        check_idx(self, idx)
        for _ in range(max_new_tokens):
            logits = self(idx)[0][:, -1] / temperature
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, [-1]]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            idx = torch.cat((idx, torch.multinomial(F.softmax(logits, dim=-1), 1)), dim=1)
        return idx

    @property
    def device(self) -> torch.device:
        return self.wte.weight.device

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


# Checks on what reaches the model: each error names the bad value and what is valid.


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_idx(model: GPT, idx) -> None:
    if not isinstance(idx, torch.Tensor) or idx.dtype not in (
        torch.long,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
    ):
        got = idx.dtype if isinstance(idx, torch.Tensor) else type(idx).__name__
        raise TypeError(f"idx must be an integer tensor of token ids (torch.long); got {got}")
    if idx.dim() != 2:
        raise ValueError(f"idx must have shape (batch, T); got shape {tuple(idx.shape)}")
    if idx.numel() == 0:
        raise ValueError(
            f"idx is empty: shape (batch, T) = {tuple(idx.shape)}; give at least one sequence of at least one token"
        )
    vocab = model.cfg.vocab_size

    def in_range():
        if idx.min() < 0 or idx.max() >= vocab:
            raise ValueError(
                f"token ids must be in [0, vocab_size={vocab}); got values in [{int(idx.min())}, {int(idx.max())}]"
            )

    model.check_values(("idx", *idx.shape), in_range)


def check_targets(model: GPT, targets, idx) -> None:
    if (
        not isinstance(targets, torch.Tensor)
        or targets.is_floating_point()
        or targets.is_complex()
        or targets.dtype == torch.bool
    ):
        got = targets.dtype if isinstance(targets, torch.Tensor) else type(targets).__name__
        raise TypeError(f"targets must be an integer tensor of token ids (torch.long, -1 to ignore); got {got}")
    if targets.shape != idx.shape:
        raise ValueError(
            f"targets must have the shape of idx {tuple(idx.shape)} (one target per input "
            f"token); got shape {tuple(targets.shape)}"
        )
    vocab = model.cfg.vocab_size

    def in_range():
        if targets.min() < -1 or targets.max() >= vocab:
            raise ValueError(
                f"targets must be in [0, vocab_size={vocab}) or -1 (ignored); "
                f"got values in [{int(targets.min())}, {int(targets.max())}]"
            )

    model.check_values(("targets", *targets.shape), in_range)


def check_bias(pe: str, bias, dims: tuple[str, ...], expected: tuple[int, ...], like: torch.Tensor) -> None:
    """A user's bias is a floating tensor of the `expected` shape on the model's device (a list, a NumPy array, a
    bool or int64 tensor was read differently by the two paths, or failed deep inside them)."""
    if not isinstance(bias, torch.Tensor):
        raise TypeError(f"pe={pe!r} returned a {type(bias).__name__}; a bias must be a torch.Tensor {expected}")
    if not bias.is_floating_point():
        raise TypeError(
            f"pe={pe!r} returned a bias of dtype {bias.dtype}; a bias must be a floating tensor (e.g. "
            f"torch.float32: 0 where attention is free, -inf for 'never attend here'), not a mask"
        )
    if bias.device != like.device:
        raise ValueError(f"pe={pe!r} returned a bias on {bias.device}; the model runs on {like.device}")
    if tuple(bias.shape) != expected:
        raise ValueError(
            f"pe={pe!r} returned a bias of shape {tuple(bias.shape)}; expected ({', '.join(dims)}) = {expected}"
        )


def check_weights(pe: str, output, v: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """What an encoding with its own weights (``AttentionWeights``) returns: ``(y, pieces)``, y a floating tensor of
    v's shape on v's device (one of shape (batch, T, n_head, hs), as many numbers, would run and mix the heads up),
    pieces a dict holding the "scores" and "probs" the plots read."""
    y, pieces = output if isinstance(output, tuple) and len(output) == 2 else (output, None)
    if not isinstance(y, torch.Tensor) or not isinstance(pieces, dict) or not {"scores", "probs"} <= pieces.keys():
        raise TypeError(
            f"pe={pe!r} returned {type(output).__name__}; an AttentionWeights module returns (y, pieces): y of "
            f"(batch, n_head, T, head size), pieces a dict holding 'scores' and 'probs'"
        )
    if not y.is_floating_point() or y.device != v.device or y.shape != v.shape:
        raise ValueError(
            f"pe={pe!r} returned y of shape {tuple(y.shape)}, {y.dtype}, on {y.device}; expected (batch, n_head, T, "
            f"head size) = {tuple(v.shape)}, floating, on {v.device}"
        )
    return y, pieces


def check_refined(refiner: nn.Module, refined, scores: torch.Tensor) -> torch.Tensor:
    """A refiner's output is scores: a floating tensor of the scores' shape (one that broadcasts, (..., 1) say,
    would run and attend wrongly)."""
    if not isinstance(refined, torch.Tensor) or not refined.is_floating_point() or refined.shape != scores.shape:
        got = f"shape {tuple(refined.shape)}, {refined.dtype}" if isinstance(refined, torch.Tensor) else type(refined)
        raise ValueError(
            f"refiner {type(refiner).__name__} returned {got}; a refiner returns refined scores of the scores' "
            f"shape {tuple(scores.shape)}, floating"
        )
    return refined


@torch.no_grad()
def check_bias_values(cfg: GPTConfig, pe: str, bias, q_pos, k_pos) -> None:
    """No NaN or +inf where a query may attend, and some key left that is not -inf ("never attend here").
    `bias` is (n_head, Tq, Tk), or (batch, n_head, Tq, Tk) for a bias that reads the data."""
    may_attend = k_pos[None, :] <= q_pos[:, None]  # (Tq, Tk): a decoder's query sees no later key
    if not cfg.causal:
        may_attend = torch.ones_like(may_attend)
    # One pass for the usual case: each row's largest visible value is finite unless the row holds a NaN or
    # +inf (both propagate through amax) or nothing but -inf. Only then look for the culprit.
    if torch.isfinite(bias.masked_fill(~may_attend, float("-inf")).amax(dim=-1)).all():
        return
    bad = may_attend & (bias.isnan() | (bias == float("inf")))
    if bad.any():
        *where, i, j = bad.nonzero()[0].tolist()
        in_batch = f"batch row {where[0]}, " if len(where) == 2 else ""
        raise ValueError(
            f"pe={pe!r} returned a bias of {bias[(*where, i, j)].item()} at {in_batch}head {where[-1]}, query "
            f"{int(q_pos[i])}, key {int(k_pos[j])}, a cell the query may attend to; a bias must be "
            f"finite there, or -inf for 'never attend here' (a hard window)"
        )
    *where, i = (~may_attend | (bias == float("-inf"))).all(dim=-1).nonzero()[0].tolist()
    in_batch = f"batch row {where[0]}, " if len(where) == 2 else ""
    raise ValueError(
        f"pe={pe!r} returned -inf at every key that query {int(q_pos[i])} may attend to ({in_batch}head "
        f"{where[-1]}): its attention would be undefined; leave at least one key finite (e.g. the query's "
        f"own position)"
    )


def check_sampling(model: GPT, max_new_tokens, temperature, top_k) -> None:
    if not model.cfg.causal:
        raise ValueError("generate needs a decoder; this model has causal=False")
    if not _is_int(max_new_tokens) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0; got {max_new_tokens!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 < temperature < math.inf:
        raise ValueError(
            f"temperature must be a number > 0 (1 samples the model's distribution, lower is "
            f"greedier); got {temperature!r}"
        )
    if top_k is not None and (not _is_int(top_k) or top_k < 1):
        raise ValueError(f"top_k must be None (no cut) or an integer >= 1; got {top_k!r}")


@torch.no_grad()
def check_causal(model_or_cfg: GPT | GPTConfig, length: int | None = None, seed: int = 0) -> bool:
    """True when no position's output depends on later tokens (a perturbation test), for any pe x refiner.

    Random token sequences of ``length`` (default ``block_size``) go through the model in eval mode; for several
    positions t the tokens after t are changed, and the outputs at positions <= t must stay the same (to float
    rounding). A ``GPTConfig`` is built into a model with the fixed ``seed`` (the global random state is left as
    it was); a model is checked through a float64 copy on its device, so the model itself is left untouched.
    Float64 because a leak in a freshly initialised model can move the logits by ~1e-6, no more than float32
    rounding moves a causal model's; in float64 rounding stays near 1e-16. An encoder (``causal=False``) is
    expected to fail it.
    """
    if isinstance(model_or_cfg, GPTConfig):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = GPT(model_or_cfg)
    elif isinstance(model_or_cfg, GPT):
        model = copy.deepcopy(model_or_cfg)
    else:
        raise TypeError(f"check_causal expects a GPT or a GPTConfig; got {type(model_or_cfg).__name__}")
    T = model.cfg.block_size if length is None else length
    vocab = model.cfg.vocab_size
    if not _is_int(T) or T < 2 or vocab < 2:
        raise ValueError(
            f"check_causal needs length >= 2 and vocab_size >= 2 to change a later token; got "
            f"length={T!r}, vocab_size={vocab}"
        )
    generator = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, vocab, (2, T), generator=generator)
    model = model.double().eval()
    with torch.no_grad():
        logits = model(idx.to(model.device))[0]
        tolerance = 64 * torch.finfo(logits.dtype).eps * (1 + logits.abs().max().item())
        for t in sorted({0, T // 3, T // 2, T - 2}):
            changed = idx.clone()  # every token after t becomes another one
            shift = torch.randint(1, vocab, (2, T - t - 1), generator=generator)
            changed[:, t + 1 :] = (idx[:, t + 1 :] + shift) % vocab
            other = model(changed.to(model.device))[0]
            if (other[:, : t + 1] - logits[:, : t + 1]).abs().max().item() > tolerance:
                return False
    return True


# Inside the package the fast path (fast.py, fast_encodings.py) installs itself as soon as this file loads, however
# it was reached (`import minidape` loads nothing until first use); copied alone, this file has none.
if __package__:
    import importlib

    importlib.import_module(".fast_encodings", __package__)
