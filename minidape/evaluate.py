r"""Length-extrapolation protocols and per-position loss.

Perplexity is $\exp$ of the mean next-token cross-entropy over the scored tokens,
$\mathrm{ppl} = \exp\big(-\frac{1}{N}\sum_t \ln p(x_{t+1} \mid x_{\le t})\big)$.

- `last_k` (DAPE's protocol): run the model on whole windows of `length` tokens and score only the final
  `min(last_k, length)` predictions, so every length is judged on the same number of tokens, each of which
  sees a long context.
- `nonoverlap` (ALiBi's and Kerple's protocol): cut the token stream into consecutive, non-overlapping
  windows of `length` tokens and score every prediction (early tokens of each window see little context).

Windows are fixed by a seed (`data.fixed_windows`), so curves of different models are comparable. A model
that cannot run at some length (`pe="learned"` beyond its table) gets NaN there and a warning, not a crash.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from .data import check_tokens, fixed_windows
from .utils import autocast_for, check_memory, model_device

PROTOCOLS = ("last_k", "nonoverlap")
TOKENS_EXPECTED = "a 1-D integer tensor (e.g. md.load_corpus(name, 'val'))"
MAX_BATCH_TOKENS = 16384  # tokens per forward: the batch shrinks as the evaluation length grows


def _check_length(length, what: str = "length") -> int:
    if isinstance(length, bool) or not isinstance(length, numbers.Integral) or length < 1:
        raise ValueError(f"{what} must be a positive integer, got {length!r}")
    return int(length)


def _check_vocabulary(model: nn.Module, tokens: torch.Tensor) -> None:
    """Too few tokens, or tokens outside the model's vocabulary, are a data error, not a length the model
    cannot run."""
    if len(tokens) < 2:
        raise ValueError(f"tokens holds {len(tokens)} token(s); evaluation needs at least 2 (an input and the "
                         f"next token it predicts)")
    vocab_size = getattr(getattr(model, "cfg", None), "vocab_size", None)
    if vocab_size is not None and len(tokens) and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        raise ValueError(f"tokens must lie in [0, vocab_size={vocab_size}); got values in "
                         f"[{int(tokens.min())}, {int(tokens.max())}]")


@torch.inference_mode()
def _token_losses(model: nn.Module, windows: torch.Tensor, score_last: int, max_batch_tokens: int,
                  bar=None) -> torch.Tensor:
    """Cross-entropy of the last `score_last` predictions of each window `(N, length + 1)`: `(N, score_last)`.

    The model reads `window[:-1]` and predicts `window[1:]`; batches hold at most `max_batch_tokens` tokens. A
    batch that cannot fit in memory is refused before the first one runs; `bar` (tqdm) counts the tokens read.
    """
    device = model_device(model)
    length = windows.shape[1] - 1
    batch_size = max(1, max_batch_tokens // length)
    if hasattr(model, "cfg"):
        check_memory(model.cfg, min(batch_size, len(windows)), length, False, device)
    losses = []
    for batch in windows.split(batch_size):
        batch = batch.to(device=device, dtype=torch.long)
        with autocast_for(device):
            logits, _ = model(batch[:, :-1])
        logits = logits[:, -score_last:].float()
        targets = batch[:, -score_last:]
        losses.append(F.cross_entropy(logits.transpose(1, 2), targets, reduction="none").cpu())
        if bar is not None:
            bar.update(batch.shape[0] * length)
    return torch.cat(losses)


@contextlib.contextmanager
def _evaluation_mode(model: nn.Module):
    """Eval mode inside (no dropout, plain positions); the model's previous mode is restored after."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def perplexity_by_length(model: nn.Module, tokens: torch.Tensor, lengths, last_k: int = 256,
                         protocol: str = "last_k", n_windows: int = 16, n_tokens: int | None = None,
                         seed: int = 0, max_batch_tokens: int = MAX_BATCH_TOKENS,
                         progress: bool = False) -> dict[int, float]:
    """Perplexity at each evaluation length: `{length: ppl}` (NaN where the model cannot run that length).

    - `protocol="last_k"`: `n_windows` seeded windows of `length + 1` tokens from `tokens`; the model reads
      `length` tokens and the last `min(last_k, length)` predictions are scored.
    - `protocol="nonoverlap"`: the first `n_tokens` tokens (default: all) cut into consecutive windows of
      `length` inputs (each window's targets are its inputs shifted by one); every prediction is scored.
      The same stretch of text is scored at every length, up to the remainder of the last window.
    - `progress`: a progress bar of the tokens read (the CLI's `eval` shows one).
    A length whose batch cannot fit in memory raises MemoryError before it runs (`utils.check_memory`).
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; valid choices: {', '.join(PROTOCOLS)}")
    tokens = check_tokens(tokens, "tokens", TOKENS_EXPECTED)
    _check_vocabulary(model, tokens)
    if isinstance(lengths, numbers.Integral):
        lengths = [lengths]
    lengths = [_check_length(length) for length in lengths]
    if not lengths:
        raise ValueError("lengths is empty: give at least one evaluation length")
    _check_length(last_k, "last_k")
    _check_length(n_windows, "n_windows")
    _check_length(max_batch_tokens, "max_batch_tokens")
    if n_tokens is not None:
        tokens = tokens[: _check_length(n_tokens, "n_tokens") + 1]
    results = {}
    from tqdm import tqdm  # here: `import minidape` stays free of tqdm
    bar = tqdm(total=0, disable=not progress, unit="tok", desc="eval", dynamic_ncols=True)
    with _evaluation_mode(model), bar:
        for length in lengths:
            if protocol == "last_k":
                windows = fixed_windows(tokens, length + 1, n_windows, seed)
                score_last = min(last_k, length)
            else:
                count = (len(tokens) - 1) // length
                if count == 0:
                    raise ValueError(f"{len(tokens)} tokens hold no window of length {length} plus its "
                                     f"next-token target; use shorter lengths or more tokens")
                starts = torch.arange(count) * length
                windows = tokens[starts[:, None] + torch.arange(length + 1)]
                score_last = length
            bar.total += windows.shape[0] * length
            bar.set_description(f"eval at {length}")
            try:
                losses = _token_losses(model, windows, score_last, max_batch_tokens, bar)
            except ValueError as err:  # a PE that cannot run this length, e.g. "learned" beyond its table
                warnings.warn(f"length {length} skipped (reported as NaN): {err}", stacklevel=2)
                results[length] = math.nan
                continue
            results[length] = math.exp(losses.double().mean().item())
    return results


def loss_by_position(model: nn.Module, tokens: torch.Tensor, length: int, n_windows: int = 16, seed: int = 0,
                     max_batch_tokens: int = MAX_BATCH_TOKENS) -> torch.Tensor:
    """Kerple's position-wise loss: a `(length,)` tensor whose entry `i` is the mean loss of predicting
    token `i + 1` from tokens `0..i`, over `n_windows` seeded windows of `length + 1` tokens.
    `exp` of it is the position-wise perplexity."""
    tokens = check_tokens(tokens, "tokens", TOKENS_EXPECTED)
    _check_vocabulary(model, tokens)
    length = _check_length(length)
    _check_length(n_windows, "n_windows")
    _check_length(max_batch_tokens, "max_batch_tokens")
    windows = fixed_windows(tokens, length + 1, n_windows, seed)
    with _evaluation_mode(model):
        return _token_losses(model, windows, length, max_batch_tokens).mean(dim=0)
