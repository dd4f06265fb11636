"""What a training or evaluation step needs in memory, estimated before it runs from the model's config and the
fast path's way of computing attention, and the refusal of a step that cannot fit (`check_memory`, called by
`train` and by `evaluate` for each length)."""

from __future__ import annotations

import torch

from .. import fast
from ..model import GPT, PE_REGISTRY, REFINER_REGISTRY, DataDependentBias, layer_encodings
from ..utils import model_label


def available_memory(device: torch.device) -> int | None:
    """Bytes that new tensors on `device` may take: on CUDA the free memory plus what PyTorch's allocator keeps
    cached but unused; on the CPU the kernel's MemAvailable (/proc/meminfo), or psutil's figure where there is
    no /proc (macOS) and psutil is installed; else None."""
    if device.type == "cuda":
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return torch.cuda.mem_get_info(device)[0] + cached
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the file gives kB
    except OSError:
        pass
    try:
        import psutil
    except ImportError:
        return None
    return psutil.virtual_memory().available


def parameter_count(cfg) -> int:
    """The parameters of `GPT(cfg)`, counted on the meta device: nothing is allocated, so a model far too large
    is counted as quickly as a small one. A user's class that cannot be built there counts as nothing."""
    try:
        with torch.device("meta"):
            return sum(parameter.numel() for parameter in GPT(cfg).parameters())
    except Exception:  # the real build raises the same error, in the user's own words
        return 0


# Bytes per parameter of a model not built yet: the fp32 weights, and in training their gradients and Adam's two
# moments.
BYTES_PER_PARAMETER = {False: 4, True: 16}


def memory_estimate(cfg, batch: int, T: int, training: bool, device: torch.device, weights: bool = False) -> int:
    r"""Bytes one step of `batch` sequences of `T` tokens needs at least, from its largest tensors: a lower
    bound, so that only a step that cannot fit is refused. `weights`: the model is not built yet, so its
    parameters (and in training their gradients and optimizer state, `BYTES_PER_PARAMETER`) count too.

    - Per token: training keeps about $16\,C$ activations per layer for backward and the logits (3 copies:
      logits, softmax, gradient); evaluation holds one layer's $8\,C$ and the logits.
    - Attention cells $T^2$ (half of them in a decoder's query blocks): a refiner the fast path runs in blocks
      keeps, in training, $S$, the refined scores, the probabilities and the refiner's input, about $4h$ values
      per cell and layer; evaluation holds one block at a time (``fast.QUERY_BLOCK_ELEMENTS``, counted as nothing),
      and so does the fused kernel without a refiner. The reference form (``fast=False``, or a refiner the fast
      path does not run in blocks) holds all $T^2$ cells at once: $3h$ of scores, the refiner's hidden width
      $W$ twice, in every layer for backward. A bias that reads the data adds its $h$ values per cell and layer
      in training.
    Element size: 2 bytes under CUDA's bf16 autocast, else 4.
    """
    size = 2 if device.type == "cuda" else 4
    h, layers, tokens = cfg.n_head, cfg.n_layer, batch * T
    per_token = layers * 16 * cfg.n_embd + 3 * cfg.vocab_size if training else 8 * cfg.n_embd + cfg.vocab_size
    refiner = REFINER_REGISTRY[cfg.refiner]
    if not attends_all_cells(cfg):
        cells = batch * T * T * (0.5 if cfg.causal else 1.0)  # query blocks: a decoder's lower half
        attention = layers * 4 * h * cells if training and refiner is not None else 0
    else:  # the reference form: all cells at once
        width = 3 * h + (2 * cfg.refiner_width if refiner is not None else 0)
        attention = (layers if training else 1) * width * batch * T * T
    if training:  # a bias that reads the data (FoX, CoPE) is (batch, nh, Tq, Tk) per layer, kept for backward
        reading = sum(issubclass(PE_REGISTRY[name], DataDependentBias) for name in layer_encodings(cfg))
        attention += reading * h * batch * T * T * (0.5 if cfg.causal else 1.0)
    parameters = BYTES_PER_PARAMETER[training] * parameter_count(cfg) if weights else 0
    return int(size * (tokens * per_token + attention) + parameters)


def attends_all_cells(cfg) -> bool:
    """Whether attention of this config is computed over all T x T cells at once: `fast=False`, or a refiner
    the fast path does not run in query blocks (`fast.runs_in_query_blocks`)."""
    refiner = REFINER_REGISTRY[cfg.refiner]
    return not (cfg.fast and (refiner is None or fast.runs_in_query_blocks(refiner)))


def check_memory(cfg, batch: int, T: int, training: bool, device: torch.device, weights: bool = False) -> None:
    """Refuse, before it starts, a step that cannot fit: a MemoryError in one line with the estimate (see
    `memory_estimate`; `weights`: of a model not built yet), the memory available and what to change."""
    available = available_memory(device)
    needed = memory_estimate(cfg, batch, T, training, device, weights)
    if available is None or needed <= available:
        return
    what = "a training step" if training else "evaluating"
    change = (
        "a smaller --batch-size, a shorter --block-size, or evaluation instead of training"
        if training
        else "shorter --lengths"
    )
    share = ""
    if weights:
        parameters = BYTES_PER_PARAMETER[training] * parameter_count(cfg)
        share = f" ({parameters / 2**30:.1f} GiB of it the weights{', gradients and Adam state' if training else ''})"
        change = f"a smaller --n-embd or --n-layer, {change}"
    if attends_all_cells(cfg):
        change += (
            " (this model computes all T x T attention cells at once: fast=False, or a refiner without "
            "row_local = True)"
        )
    raise MemoryError(
        f"{what} of {batch} x {T} tokens ({model_label(cfg)}, {cfg.n_layer} layers, {cfg.n_head} "
        f"heads) needs at least {needed / 2**30:.1f} GiB{share}, but {device.type} has "
        f"{available / 2**30:.1f} GiB available; use {change}"
    )
