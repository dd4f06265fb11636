r"""Length-extrapolation protocols and per-position loss.

Perplexity (per byte, for the bundled byte-level corpora) is $\exp$ of the mean next-token cross-entropy over
the scored tokens, $\mathrm{ppl} = \exp\big(-\frac{1}{N}\sum_t \ln p(x_{t+1} \mid x_{\le t})\big)$.

A curve across lengths must show length, not text: both protocols score **the same tokens at every length**
of one call, and only the context before them changes.

- `last_k` (DAPE's protocol): `n_windows` scored stretches of $k = \min(\text{last\_k}, \text{shortest
  length})$ tokens, disjoint, at positions drawn once (by `seed`) from the whole token stream. At every length
  $T$ the model reads the $T$ tokens that end at a stretch's last token and the stretch's $k$ predictions are
  scored: the same targets at every length, with $T - k \ldots T - 1$ tokens of context each. (At lengths
  above `last_k` DAPE scores the last `last_k`; when the shortest length is below it, all lengths score its
  $k$, so the training length does not add short-context tokens that the longer lengths lack.)
- `nonoverlap` (ALiBi's and Kerple's protocol): the first `n_tokens` predictions (default: all) cut into
  consecutive windows of `length` tokens and every prediction scored (early tokens of each window see little
  context). A length that does not divide the stretch ends with one shorter window holding the remainder, so
  nothing is dropped and every length scores exactly the same predictions.

So curves of different models, and of one model at different lengths, compare like with like. The scored
positions depend on the longest length of the call (the first `max(lengths)` tokens cannot end a window):
compare numbers from calls with the same lengths, `seed` and tokens. A model that cannot run at some length
(`pe="learned"` beyond its table) gets NaN there and a warning, not a crash.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import warnings
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from ..threads import api_entry
from ..utils import autocast_for, check_number, model_device
from .data import check_tokens, fixed_windows
from .memory import check_memory

PROTOCOLS = ("last_k", "nonoverlap")
TOKENS_EXPECTED = "a 1-D integer tensor (e.g. md.load_corpus(name, 'val'))"
MAX_BATCH_TOKENS = 16384  # tokens per forward: the batch shrinks as the evaluation length grows


def _check_length(length, what: str = "length") -> int:
    if isinstance(length, bool) or not isinstance(length, numbers.Integral) or length < 1:
        raise ValueError(f"{what} must be a positive integer, got {length!r}")
    return int(length)


def _check_lengths(lengths) -> list[int]:
    """`lengths` as a list of positive integers: one integer, or an iterable of them (not a string)."""
    if isinstance(lengths, numbers.Integral) and not isinstance(lengths, bool):
        return [_check_length(lengths, "lengths")]
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Iterable):
        raise TypeError(
            f"lengths must be a positive integer or a list of them, got {lengths!r} ({type(lengths).__name__})"
        )
    return [_check_length(length, "each length") for length in lengths]


def _check_vocabulary(model: nn.Module, tokens: torch.Tensor) -> None:
    """A model that is one; too few tokens, or tokens outside the model's vocabulary, are a data error, not a
    length the model cannot run."""
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"model must be a torch model (e.g. md.GPT or md.load_checkpoint(path)[0]), got {type(model).__name__}"
        )
    if len(tokens) < 2:
        raise ValueError(
            f"tokens holds {len(tokens)} token(s); evaluation needs at least 2 (an input and the "
            f"next token it predicts)"
        )
    vocab_size = getattr(getattr(model, "cfg", None), "vocab_size", None)
    if vocab_size is not None and len(tokens) and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        raise ValueError(
            f"tokens must lie in [0, vocab_size={vocab_size}); got values in [{int(tokens.min())}, {int(tokens.max())}]"
        )


@torch.inference_mode()
def _token_losses(
    model: nn.Module, windows: torch.Tensor, score_last: int, max_batch_tokens: int, bar=None
) -> torch.Tensor:
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


def scored_ends(n_tokens: int, longest: int, scored: int, n_windows: int, seed: int = 0) -> torch.Tensor:
    """End positions of `last_k`'s scored stretches: `n_windows` sorted indices `e` into a stream of `n_tokens`
    tokens, drawn by `seed` alone. Stretch `tokens[e - scored + 1 : e + 1]` is scored; every window, of any
    length up to `longest`, ends at `e`. The candidates lie `scored` apart, so the stretches never overlap."""
    if n_tokens < longest + 1:
        raise ValueError(
            f"need windows of {longest + 1} tokens (length {longest} plus its next-token target) but "
            f"the tokens number only {n_tokens}; use shorter lengths or more tokens"
        )
    candidates = (n_tokens - 1 - longest) // scored + 1  # e = longest + j * scored, j < candidates
    if n_windows > candidates:
        raise ValueError(
            f"{n_tokens} tokens hold {candidates} disjoint stretches of {scored} scored tokens after "
            f"a context of {longest}; ask for n_windows <= {candidates}, shorter lengths or more tokens"
        )
    generator = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(candidates, generator=generator)[:n_windows].sort().values
    return longest + chosen * scored


@api_entry
def perplexity_by_length(
    model: nn.Module,
    tokens: torch.Tensor,
    lengths,
    last_k: int = 256,
    protocol: str = "last_k",
    n_windows: int = 32,
    n_tokens: int | None = None,
    seed: int = 0,
    max_batch_tokens: int = MAX_BATCH_TOKENS,
    progress: bool = False,
) -> dict[int, float]:
    """Perplexity at each evaluation length: `{length: ppl}` (NaN where the model cannot run that length).
    Every length scores the same tokens (see the module docstring); only their context grows with the length.

    - `protocol="last_k"`: `n_windows` disjoint stretches of `k = min(last_k, min(lengths))` tokens, placed by
      `seed` anywhere in `tokens` after its first `max(lengths)` tokens (`scored_ends`); at each length the
      window of `length` inputs ending at a stretch is run and the stretch's `k` predictions are scored:
      `n_windows * k` scored tokens per length (32 x 128 = 4,096 with the defaults and lengths from 128).
    - `protocol="nonoverlap"`: the first `n_tokens` predictions (default: all `len(tokens) - 1`) cut into
      consecutive windows of `length` inputs, the remainder in one shorter last window; every prediction is
      scored. `n_windows`, `last_k` and `seed` play no part.
    - `progress`: a progress bar of the tokens read (the CLI's `eval` shows one).
    A length whose batch cannot fit in memory raises MemoryError before it runs (`memory.check_memory`).
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; valid choices: {', '.join(PROTOCOLS)}")
    tokens = check_tokens(tokens, "tokens", TOKENS_EXPECTED)
    _check_vocabulary(model, tokens)
    lengths = _check_lengths(lengths)
    check_number("seed", seed, 0, allow_none=False)
    if not lengths:
        raise ValueError("lengths is empty: give at least one evaluation length")
    _check_length(last_k, "last_k")
    _check_length(n_windows, "n_windows")
    _check_length(max_batch_tokens, "max_batch_tokens")
    longest = max(lengths)
    if protocol == "last_k":
        if n_tokens is not None:  # last_k draws from the whole stream: a cut-off would go unnoticed
            raise ValueError(
                f"n_tokens={n_tokens!r} applies to protocol='nonoverlap' only; last_k places its "
                f"windows over all of tokens (pass tokens[:n] to restrict it)"
            )
        scored = min(last_k, min(lengths))
        ends = scored_ends(len(tokens), longest, scored, n_windows, seed)
    else:
        n_scored = len(tokens) - 1 if n_tokens is None else _check_length(n_tokens, "n_tokens")
        if n_scored > len(tokens) - 1:
            raise ValueError(
                f"n_tokens={n_scored} predictions asked for, but {len(tokens)} tokens hold {len(tokens) - 1}"
            )
        if n_scored < longest:
            raise ValueError(
                f"{n_scored + 1} tokens hold no window of length {longest} plus its next-token "
                f"target; use shorter lengths or more tokens"
            )
    results = {}
    from tqdm import tqdm  # here: `import minidape` stays free of tqdm

    bar = tqdm(total=0, disable=not progress, unit="tok", desc="eval", dynamic_ncols=True)
    with _evaluation_mode(model), bar:
        for length in lengths:
            if protocol == "last_k":
                batches = [(tokens[ends[:, None] - length + torch.arange(length + 1)], scored)]
            else:
                count, remainder = divmod(n_scored, length)
                batches = [(tokens[(torch.arange(count) * length)[:, None] + torch.arange(length + 1)], length)]
                if remainder:
                    batches.append((tokens[count * length : n_scored + 1][None], remainder))
            bar.total += sum(windows.numel() - len(windows) for windows, _ in batches)
            bar.set_description(f"eval at {length}")
            try:
                losses = torch.cat(
                    [
                        _token_losses(model, windows, score_last, max_batch_tokens, bar).flatten()
                        for windows, score_last in batches
                    ]
                )
            except ValueError as err:  # a PE that cannot run this length, e.g. "learned" beyond its table
                warnings.warn(f"length {length} skipped (reported as NaN): {err}", stacklevel=2)
                results[length] = math.nan
                continue
            results[length] = math.exp(losses.double().mean().item())
            if not math.isfinite(results[length]):  # shown as "n/a" in a table: say why here
                warnings.warn(
                    f"length {length}: perplexity {results[length]}: the model's outputs are not finite (a NaN "
                    f"or inf weight, or an encoding that overflows at this length)",
                    stacklevel=2,
                )
    return results


@api_entry
def loss_by_position(
    model: nn.Module,
    tokens: torch.Tensor,
    length: int,
    n_windows: int = 16,
    seed: int = 0,
    max_batch_tokens: int = MAX_BATCH_TOKENS,
) -> torch.Tensor:
    """Kerple's position-wise loss: a `(length,)` tensor whose entry `i` is the mean loss of predicting
    token `i + 1` from tokens `0..i`, over `n_windows` seeded windows of `length + 1` tokens.
    `exp` of it is the position-wise perplexity."""
    tokens = check_tokens(tokens, "tokens", TOKENS_EXPECTED)
    _check_vocabulary(model, tokens)
    length = _check_length(length)
    check_number("seed", seed, 0, allow_none=False)
    _check_length(n_windows, "n_windows")
    _check_length(max_batch_tokens, "max_batch_tokens")
    windows = fixed_windows(tokens, length + 1, n_windows, seed)
    with _evaluation_mode(model):
        return _token_losses(model, windows, length, max_batch_tokens).mean(dim=0)
