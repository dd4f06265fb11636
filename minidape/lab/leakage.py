"""Models that read the future: a decoder whose outputs depend on later tokens (`decoder_leaks`), refused by
`train`, `compare` and `reproduce` unless `allow_leakage` (then a warning), as is an encoder on next-token
prediction (`train`); and the refiner broken on purpose to show one (`ConvRefinerWithoutTril`: the study's C4,
notebook 05's leaky_conv)."""

from __future__ import annotations

import dataclasses
import warnings

import torch

from ..model import ConvRefiner, GPTConfig, check_causal
from ..utils import model_label


def decoder_leaks(cfg: GPTConfig, allow_leakage: bool = False) -> bool:
    """Whether a decoder's outputs depend on later tokens (``check_causal`` on a model of the same PE and refiner
    with one layer per encoding of a per-layer spec, at up to 64 tokens: a few milliseconds). A leaking one is
    refused (ValueError) unless ``allow_leakage``, then only warned about. Encoders (``causal=False``) see every
    token by design: False (`train` refuses one on next-token prediction by itself)."""
    if not cfg.causal:
        return False
    layers = min(cfg.n_layer, len(cfg.pe.split(",")))  # each encoding of a per-layer spec in a layer of its own
    small = dataclasses.replace(cfg, n_layer=layers, block_size=min(cfg.block_size, 64), dropout=0.0)
    if check_causal(small):
        return False
    culprit = "the encoding" if cfg.refiner == "none" else "the refiner (or the encoding)"
    return refuse_leak(
        f"{model_label(cfg)} reads the future: with pe {cfg.pe!r} and refiner {cfg.refiner!r} a position's "
        f"output changes when later tokens change (md.check_causal), so its losses and perplexities mean "
        f"nothing",
        f"fix {culprit}",
        allow_leakage,
        stacklevel=5,
    )


def refuse_leak(message: str, fix: str, allow_leakage: bool, stacklevel: int) -> bool:
    """A model that reads the future: refused, or with `allow_leakage` a warning (and True) at `stacklevel`, the
    line that called train or compare."""
    if not allow_leakage:
        raise ValueError(
            f"{message}; {fix}, or pass allow_leakage=True (CLI: --allow-leakage) for a deliberate leakage experiment"
        )
    warnings.warn(f"{message} (allowed: allow_leakage=True)", stacklevel=stacklevel)
    return True


class ConvRefinerWithoutTril(ConvRefiner):
    """BROKEN ON PURPOSE (claim C4, and the grader's copy of notebook 05's leaky_conv): DAPE-V2's conv refiner
    without ``tril``, the paper's "cheating" run (§4.5, Figure 6). The masked (future) scores are NOT zeroed
    before the convolutions, so the score $q_i \\cdot k_{i+1}$, computed from the very token position $i$ must
    predict, is moved onto the diagonal cell by the 1 x k kernel. Never use it for a real model."""

    row_local = True  # 1 x k convolutions along the keys: each row alone, so the fast path's blocks run it

    def __init__(self, cfg: GPTConfig):
        super().__init__(cfg)
        # Two stacked 1 x k convolutions read k//2 keys each past the diagonal: the blocked attention must hand
        # this refiner that many future keys, or the leak it is meant to show would be cut off at block edges.
        self.key_margin = 2 * (cfg.refiner_kernel // 2)

    def forward(self, scores, bias, mask):
        return super().forward(scores, bias, torch.ones_like(mask))  # every cell "allowed": no tril
