"""Training loop: device and precision, cosine schedule, checkpoints (`checkpoints.py`), exact resume, DDP through
torchrun (`distributed.py`).

```python
model, history = md.train(md.GPTConfig(pe="alibi"), "austen", steps=500, out="runs/alibi")
model, history = md.train(None, steps=1000, out="runs/alibi", resume=True)    # continue it, on its corpus
```

The same loop trains language models on a corpus (random windows, AdamW) and encoders on generated batches
(`data` a batch function, e.g. the CHE tasks of `minidape.lab.che`, with Adam).

Runs are never lost: a folder that already holds a checkpoint is refused unless `resume=True` or
`overwrite=True`, and so is a folder another process is training into (an OS lock held for the whole run);
`out` is checked before the first step; the first non-finite loss or gradient stops the run before it reaches
the weights, and Ctrl-C (or SIGTERM, SIGHUP) stops it with a message saying which checkpoint survives.

Nothing is trained that cannot mean anything: a decoder whose refiner reads the future (`check_causal`) is
refused unless `allow_leakage=True` (a deliberate leakage experiment), and a step that cannot fit in memory
is refused before it starts (`memory.check_memory`).

Reproducibility: every step re-seeds `random`, numpy and torch from `(seed, rank, step)`, so the batch and
the dropout noise of step `s` do not depend on what ran before it. A run resumed from a checkpoint therefore
continues exactly where the checkpoint left it (on CPU: bitwise), on one process or under DDP, without
saving any generator state.

DDP: launch the same script with `torchrun --nproc_per_node=N`; `train` notices the torchrun environment,
joins the process group (nccl when each process has a GPU of its own, else gloo on the CPU), gives each rank its
own batches (`batch_size` is per rank), averages gradients, and lets rank 0 alone show progress and write
checkpoints.

On a GPU a step queues its work without waiting for it: nothing is read back to the host between logging steps
(the model's value checks run on the first batch of each shape only; a non-finite loss is read at the next
logging step or checkpoint, its update and those after it skipped on the device).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ..model import GPT, GPTConfig
from ..threads import choose_for_api
from ..utils import (
    autocast_for,
    check_number,
    check_writable_folder,
    holds_out_folder,
    model_label,
    remove_stale_temporaries,
)
from .checkpoints import CHECKPOINT_NAME, RUN_FILES, checkpoint_config, load_weights, read_checkpoint, save_checkpoint
from .data import check_tokens, corpus_identity, corpus_to_read, fixed_windows, get_batch, load_corpus
from .distributed import DistributedContext, mean_over_ranks, setup_distributed, wrap
from .leakage import decoder_leaks, refuse_leak
from .memory import check_memory

OPTIMIZERS = ("adamw", "adam")
TOKENS_EXPECTED = "a 1-D integer token tensor, a corpus name/path, or a batch function (step, generator) -> (x, y)"
NON_FINITE_CAUSES = (
    "a learning rate too high for this model",
    "a config value out of range (e.g. rope_base <= 0)",
    "a PE or refiner returning NaN or inf",
    "no gradient clipping (grad_clip=0)",
)


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C, SIGTERM or SIGHUP during `train`; the message says which checkpoint survives and how to resume
    from it, `exit_code` is the shell's for that signal (130 for Ctrl-C, 128 + its number for the others)."""

    def __init__(self, message: str, exit_code: int = 130):
        super().__init__(message)
        self.exit_code = exit_code


class _Stopped(KeyboardInterrupt):
    """Raised in the training loop by a SIGTERM or SIGHUP, so that it ends as Ctrl-C does."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# A `kill`, a batch system's stop, a closed terminal: stop training as Ctrl-C does (Windows has no SIGHUP).
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


def _stop_on_signals() -> tuple[list[int], Callable[[], None]]:
    """From now on `STOP_SIGNALS` are noted in the list returned, and the loop raises `_Stopped` at its next step
    (raised where it landed, inside a weak reference's callback, Python printed it and went on: training ran on);
    also returns the function that puts the handlers back. Only in the main thread (elsewhere: no handlers)."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        return received, lambda: None
    previous = {number: signal.signal(number, lambda signum, frame: received.append(signum)) for number in STOP_SIGNALS}

    def restore() -> None:
        for number, handler in previous.items():
            signal.signal(number, handler)

    return received, restore


# ----------------------------------------------------------------------------- seeds and schedule


def seed_everything(seed: int) -> None:
    """Seed `random`, numpy and torch (all devices) with one integer."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def step_seed(seed: int, rank: int, step: int) -> int:
    """A well-mixed seed for one step of one rank (numpy's SeedSequence hashes the three integers)."""
    if seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed}")
    state = np.random.SeedSequence([seed, rank, step]).generate_state(2, dtype=np.uint32)
    return int(state[0]) << 31 | int(state[1]) >> 1


def lr_at(step: int, steps: int, lr: float, min_lr: float, warmup: int) -> float:
    r"""Learning rate of update `step` (0-based): linear warmup, then cosine decay to `min_lr`.

    $\eta_s = \eta\,\frac{s+1}{W}$ for $s < W$, else
    $\eta_s = \eta_{min} + \tfrac12(\eta - \eta_{min})\,(1 + \cos(\pi\,\frac{s - W}{S - W}))$.
    """
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * min(progress, 1.0)))


# ----------------------------------------------------------------------------- training


# The settings that make a run what it is: a resumed run takes them from its checkpoint (key `settings`).
RUN_SETTINGS = ("steps", "batch_size", "lr", "min_lr", "warmup", "weight_decay", "grad_clip", "optimizer", "seed")
DEFAULT_SETTINGS = dict(steps=1000, batch_size=32, lr=1e-3, weight_decay=0.1, grad_clip=1.0, optimizer="adamw", seed=0)


def _run_settings(given: dict, checkpoint: dict | None, resume_from, is_main: bool) -> dict:
    """The run's `RUN_SETTINGS`, every one resolved. A new run: those given, else the defaults (`warmup` 5% of
    `steps`, `min_lr` a tenth of `lr`). A resumed run: its checkpoint's; one given that differs is refused,
    except `steps`, which extends the run (said on stderr). A checkpoint of an earlier version, without
    `settings`, keeps its seed and takes the rest as a new run does."""
    saved = {} if checkpoint is None else checkpoint.get("settings", {"seed": int(checkpoint["seed"])})
    differing = [
        f"{name}={given[name]!r} (the run's own: {saved[name]!r})"
        for name in RUN_SETTINGS
        if name != "steps" and given[name] is not None and name in saved and given[name] != saved[name]
    ]
    if differing:
        raise ValueError(
            f"resume of {resume_from}: {', '.join(differing)}; a resumed run continues with the run's "
            f"own settings: drop the differing ones, or start a new run (overwrite=True / --overwrite)"
        )
    settings = {**DEFAULT_SETTINGS, **{name: value for name, value in given.items() if value is not None}, **saved}
    if given["steps"] is not None:
        if is_main and "steps" in saved and given["steps"] != saved["steps"]:
            print(
                f"resume of {resume_from}: from {saved['steps']} to {given['steps']} steps (the cosine schedule "
                f"continues over the new length)",
                file=sys.stderr,
            )
        settings["steps"] = given["steps"]
    settings["warmup"] = max(1, settings["steps"] // 20) if settings.get("warmup") is None else settings["warmup"]
    settings["min_lr"] = settings["lr"] / 10 if settings.get("min_lr") is None else settings["min_lr"]
    return settings


def _run_folder(out, resume, overwrite) -> Path | None:
    """The run folder, checked before any work: a folder we can write, not holding a checkpoint that this
    run would silently replace."""
    if not isinstance(resume, (bool, str, os.PathLike)):
        raise TypeError(f"resume must be True, False or a checkpoint's path, got {resume!r} ({type(resume).__name__})")
    if resume and overwrite:
        raise ValueError(
            "resume and overwrite exclude each other: resume continues the checkpoint in out, overwrite replaces it"
        )
    if out is None:
        if resume is True:
            raise ValueError("resume=True needs out= (the run directory holding checkpoint.pt)")
        return None
    out = check_writable_folder(out)
    existing = out / CHECKPOINT_NAME
    # resuming another run's checkpoint into this folder would replace this folder's run
    continues_it = resume is True or (resume and Path(resume).resolve() in (existing.resolve(), out.resolve()))
    if existing.exists() and not (continues_it or overwrite):
        raise ValueError(
            f"{out} already holds a checkpoint; pass resume=True to continue it or overwrite=True "
            f"to replace it (CLI: --resume or --overwrite), or choose another out"
        )
    return out


def _resolve_data(data, val_data, checkpoint: dict | None, resume_from) -> tuple:
    """`(train, val, corpus)`: token tensors (or the batch function) and the corpus identity to record.

    A corpus name/path loads its two splits. On resume, `data=None` means the checkpoint's corpus, and a
    named corpus must be the one the checkpoint was trained on.
    """
    recorded = None if checkpoint is None else checkpoint.get("corpus")
    if data is None:
        if checkpoint is not None and recorded is None:
            raise ValueError(
                f"resume of {resume_from}: the checkpoint was trained on data given as a tensor or "
                f"function, not a corpus; pass the same data again"
            )
        data = "austen" if checkpoint is None else None
    if recorded is not None and (data is None or isinstance(data, (str, os.PathLike))):
        data = corpus_to_read(recorded, data, f"resume of {resume_from}")
    corpus = None
    if isinstance(data, (str, os.PathLike)):
        corpus = corpus_identity(data)
        if val_data is None:
            val_data = load_corpus(data, "val")
        data = load_corpus(data, "train")
    if isinstance(val_data, (str, os.PathLike)):
        val_data = load_corpus(val_data, "val")
    val_data = None if val_data is None else check_tokens(val_data, "val_data", TOKENS_EXPECTED)
    return data if callable(data) else check_tokens(data, "data", TOKENS_EXPECTED), val_data, corpus


def _resolve_config(model_or_cfg, checkpoint: dict | None, resume_from) -> GPTConfig:
    """The config of the model to train, known before it is built (so that its memory can be checked)."""
    if checkpoint is not None:
        saved = checkpoint_config(checkpoint, resume_from)
        given = getattr(model_or_cfg, "cfg", model_or_cfg)
        if given is not None and given != saved:
            changed = [f.name for f in dataclasses.fields(saved) if getattr(given, f.name) != getattr(saved, f.name)]
            raise ValueError(
                f"the model to resume differs from the checkpoint's in: {', '.join(changed)}; "
                f"pass None to use the checkpoint's config"
            )
        return saved
    if isinstance(model_or_cfg, GPTConfig):
        return model_or_cfg
    if isinstance(model_or_cfg, nn.Module) and isinstance(getattr(model_or_cfg, "cfg", None), GPTConfig):
        return model_or_cfg.cfg
    raise TypeError(
        f"model_or_cfg must be a GPTConfig or a model with a .cfg GPTConfig "
        f"(None only with resume), got {type(model_or_cfg).__name__}"
    )


def _build_model(model_or_cfg, cfg: GPTConfig, checkpoint: dict | None, resume_from) -> nn.Module:
    """The model given, or one built from `cfg`; a resumed run's weights loaded into it."""
    model = model_or_cfg if isinstance(model_or_cfg, nn.Module) else GPT(cfg)
    if checkpoint is not None:
        load_weights(model, checkpoint["model"], resume_from)
    return model


def _optimizer(model: nn.Module, kind: str, lr: float, weight_decay: float, device: torch.device):
    """AdamW with betas (0.9, 0.95), the GPT recipe; or Adam with betas (0.9, 0.999), the CHE benchmark's.
    Weight decay on matrices only (not on biases, norms, per-head scalars). Fused (one kernel for all
    parameters, on CPU, CUDA and MPS alike): it also skips an update on the device when told to (`found_inf`),
    which is how `train` keeps a non-finite gradient out of the weights without a host sync per step."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    if kind == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=True)
    return torch.optim.Adam(groups, lr=lr, betas=(0.9, 0.999), fused=True)


# How an optimizer computes, chosen for the device it runs on; not part of the training state.
OPTIMIZER_IMPLEMENTATION = ("fused", "foreach", "capturable", "differentiable")


def _load_optimizer_state(optim: torch.optim.Optimizer, saved: dict) -> None:
    """Load a checkpoint's moments, step counts and hyperparameters into `optim`, keeping `optim`'s own
    implementation: `load_state_dict` would restore the flags of the device the state was saved on (a state
    saved by a per-tensor CPU optimizer would turn a fused CUDA one back into a per-tensor one)."""
    groups = [
        {**saved_group, **{key: group[key] for key in OPTIMIZER_IMPLEMENTATION if key in group}}
        for saved_group, group in zip(saved["param_groups"], optim.param_groups)
    ]
    optim.load_state_dict({**saved, "param_groups": groups})


@torch.no_grad()
def validation_loss(model: nn.Module, windows: torch.Tensor, batch_size: int, device: torch.device) -> float:
    """Mean next-token loss of `model` over fixed token windows `(N, block_size + 1)`, in eval mode."""
    was_training = model.training
    model.eval()
    total = 0.0
    for batch in windows.split(batch_size):
        batch = batch.to(device=device, dtype=torch.long)
        with autocast_for(device):
            _, loss = model(batch[:, :-1], batch[:, 1:])
        total += loss.item() * len(batch)
    model.train(was_training)
    return total / len(windows)


def _draw_batch(
    data, step: int, generator: torch.Generator, batch_size: int, block_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of one step: random windows of token data, or whatever the batch function returns."""
    if not callable(data):
        batch = get_batch(data, batch_size, block_size, generator=generator)
    else:
        batch = data(step, generator)
        if not (isinstance(batch, tuple) and len(batch) == 2 and all(torch.is_tensor(part) for part in batch)):
            raise TypeError(
                f"the batch function must return a tuple (inputs, targets) of tensors, got {type(batch).__name__}"
            )
    return _to_device(batch[0], device), _to_device(batch[1], device)


def _to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` on `device`; from the CPU to a GPU through pinned memory, without waiting: a copy from ordinary
    (pageable) memory makes the CPU wait until the GPU has done all the work queued before it."""
    if tensor.device.type == "cpu" and device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def _non_finite_message(
    step: int,
    loss: float,
    grad_norm: float,
    last_loss: float | None,
    lr: float,
    out: Path | None,
    saved_step: int | None,
) -> str:
    """One line: what went non-finite and where, the last finite loss, the checkpoint kept, the usual causes."""
    what = f"loss {loss}" if not math.isfinite(loss) else f"gradient norm {grad_norm} (loss {loss:.4f})"
    last = f"the last finite loss was {last_loss:.4f} at step {step - 1}" if last_loss is not None else "at the start"
    kept = (
        f"; {out / CHECKPOINT_NAME} (step {saved_step}) is untouched"
        if out is not None and saved_step is not None
        else ""
    )
    return (
        f"training stopped at step {step}: non-finite {what}; {last}{kept}. Usual causes: "
        f"{', '.join(NON_FINITE_CAUSES)} (lr={lr:g})"
    )


def _interrupted_message(step: int, out: Path | None, saved_step: int | None, signum: int | None = None) -> str:
    where = f"at step {step}" + ("" if signum is None else f" by {signal.Signals(signum).name}")
    if out is None:
        return f"training interrupted {where}; nothing was saved (out=None)"
    if saved_step is None:
        return (
            f"training interrupted {where} before its first checkpoint; nothing was saved in {out} "
            f"(checkpoint_every=N keeps progress)"
        )
    return (
        f"training interrupted {where}; {out / CHECKPOINT_NAME} holds step {saved_step}: continue it "
        f"with resume=True (CLI: --resume)"
    )


@holds_out_folder()
def train(
    model_or_cfg: GPTConfig | nn.Module | None,
    data=None,
    *,
    steps: int | None = None,
    batch_size: int | None = None,
    lr: float | None = None,
    min_lr: float | None = None,
    warmup: int | None = None,
    weight_decay: float | None = None,
    grad_clip: float | None = None,
    optimizer: str | None = None,
    val_data=None,
    eval_every: int | None = None,
    eval_windows: int = 32,
    log_every: int | None = None,
    metrics: Callable | None = None,
    device: str | torch.device = "auto",
    seed: int | None = None,
    compile: bool = False,
    out: str | os.PathLike | None = None,
    checkpoint_every: int | None = None,
    resume: bool | str | os.PathLike = False,
    overwrite: bool = False,
    allow_leakage: bool = False,
    progress: bool = True,
) -> tuple[nn.Module, list[dict]]:
    """Train a GPT; returns `(model, history)`. The one training loop of the package.

    - `model_or_cfg`: a `GPTConfig` (the model is built after seeding, so its init is reproducible), a model
      with a `.cfg`, or `None` when resuming (the checkpoint's config is used).
    - `data`: a 1-D token tensor or a corpus name/path (default `"austen"`; on resume, the checkpoint's
      corpus): random `block_size` windows of it, whose `val` split gives the validation loss unless
      `val_data` is given. Or a batch function `data(step, generator) -> (inputs, targets)` drawing with the
      `torch.Generator` it is given (seeded per step, so a resumed run draws the same batches); `batch_size`
      is then the function's business.
    - Schedule: `steps` updates (default 1000) of `batch_size` windows (default 32), `optimizer="adamw"`
      (betas 0.9, 0.95; the default) or `"adam"` (betas 0.9, 0.999), weight decay `weight_decay` (default 0.1)
      on matrices only, `warmup` linear steps (default 5% of `steps`), cosine decay from `lr` (default 1e-3) to
      `min_lr` (default `lr / 10`), gradient norm clipped to `grad_clip` (default 1; 0 disables); `seed`
      (default 0) draws the initial weights, the batches and the dropout.
    - `history`: one dict per logged step with `step` (updates done), `loss` (training loss of that step's
      batch, averaged over ranks), `lr`, `val_loss` every `eval_every` steps, and whatever
      `metrics(logits, inputs, targets) -> dict` returns for that batch; the first entry is at step 0, the
      last at `steps` (measured on a fresh batch, after the last update).
    - `out`: directory for `checkpoint.pt`, written at the end and every `checkpoint_every` steps. A folder
      already holding one is refused unless `resume` (continue it) or `overwrite` (replace it).
    - `resume`: `True` continues from `out/checkpoint.pt`, a path continues from that file, exactly (see
      Reproducibility): the step and the run's own schedule settings (`RUN_SETTINGS`) come from the checkpoint,
      so none needs repeating. One given with a value other than the run's is refused (a run continued with
      another learning rate or batch is not that run); `steps` may grow, which extends the run (said on stderr).
    - A folder another process is training into is refused; so is a decoder that reads the future
      (`decoder_leaks`) unless `allow_leakage=True`, and a step that cannot fit in memory (`check_memory`).
    - The first non-finite loss or gradient norm raises `FloatingPointError` before it reaches the weights (at
      the next logging step or checkpoint, naming the step it happened at; the updates in between are skipped);
      Ctrl-C, SIGTERM and SIGHUP raise `TrainingInterrupted`. Either way the last checkpoint written stays as
      it was.
    The model is returned in eval mode, unwrapped (no DDP, no compile).
    """
    given = dict(
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        min_lr=min_lr,
        warmup=warmup,
        weight_decay=weight_decay,
        grad_clip=grad_clip,
        optimizer=optimizer,
        seed=seed,
    )
    check_arguments(
        **given,
        eval_every=eval_every,
        eval_windows=eval_windows,
        log_every=log_every,
        checkpoint_every=checkpoint_every,
        metrics=metrics,
    )
    out = _run_folder(out, resume, overwrite)
    context, device = setup_distributed(device)
    if out is not None and context.is_main:  # rank 0 holds the folder: no one else writes there
        remove_stale_temporaries(out, RUN_FILES)
    resume_from = (out / CHECKPOINT_NAME if resume is True else Path(resume)) if resume else None
    checkpoint = None if resume_from is None else read_checkpoint(resume_from, device)
    settings = _run_settings(given, checkpoint, resume_from, context.is_main)
    steps, batch_size, lr, min_lr, warmup, weight_decay, grad_clip, optimizer, seed = (
        settings[name] for name in RUN_SETTINGS
    )
    cfg = _resolve_config(model_or_cfg, checkpoint, resume_from)
    choose_for_api(batch_size * cfg.block_size * cfg.n_embd)
    train_data, val_data, corpus = _resolve_data(data, val_data, checkpoint, resume_from)
    _check_run(cfg, train_data, val_data, batch_size, device, allow_leakage, built=isinstance(model_or_cfg, nn.Module))
    seed_everything(seed)
    model = _build_model(model_or_cfg, cfg, checkpoint, resume_from).to(device)

    log_every = max(1, steps // 100) if log_every is None else log_every
    eval_every = max(1, steps // 10) if eval_every is None else eval_every
    optim = _optimizer(model, optimizer, lr, weight_decay, device)
    start, history = _restore_optimizer(optim, checkpoint, steps)
    saved_step = start if checkpoint is not None and out is not None and resume is True else None
    val_windows = None
    if val_data is not None and context.is_main:
        val_windows = fixed_windows(val_data, cfg.block_size + 1, eval_windows, seed)
    model.train()
    step_model = wrap(model, context, device, compile)
    watch = NonFiniteWatch(optim, device, context)

    def read_health() -> None:  # raises at the first non-finite step since the last read, naming the checkpoint kept
        watch.read(lambda *values: _non_finite_message(*values, lr, out, saved_step))

    def save(step_done: int) -> None:
        nonlocal saved_step
        read_health()
        if out is not None and context.is_main:
            try:
                save_checkpoint(
                    out / CHECKPOINT_NAME, model, optim, step_done, seed, history, corpus=corpus, settings=settings
                )
            except OSError as err:
                kept = "nothing was saved" if saved_step is None else f"it still holds step {saved_step}"
                raise OSError(f"training stopped at step {step_done}: {err}; {kept}") from err
            saved_step = step_done

    from tqdm import tqdm  # here, not at the top: `import minidape` stays free of tqdm (text bars, not tqdm.auto)

    bar = tqdm(
        total=steps,
        initial=start,
        disable=not (progress and context.is_main),
        unit="step",
        desc=model_label(cfg),
        dynamic_ncols=True,
    )
    generator = torch.Generator()
    clock, eval_seconds, tokens_trained, postfix = time.perf_counter(), 0.0, 0, {}
    step = start
    stop_signals, restore_signals = _stop_on_signals()
    try:
        for step in range(start, steps + 1):
            if stop_signals:  # a SIGTERM or SIGHUP since the last step
                raise _Stopped(stop_signals[0])
            if checkpoint_every and start < step < steps and step % checkpoint_every == 0:
                save(step)
            step_rng = step_seed(seed, context.rank, step)
            seed_everything(step_rng)
            generator.manual_seed(step_rng)
            x, y = _draw_batch(train_data, step, generator, batch_size, cfg.block_size, device)
            if step < steps:
                learning_rate = lr_at(step, steps, lr, min_lr, warmup)
                logits, loss = _update(step_model, model, optim, x, y, learning_rate, grad_clip, device, watch, step)
                tokens_trained += x.numel() * context.world_size
                bar.update(1)
            else:  # the final entry measures the trained model; no update follows
                with torch.no_grad(), autocast_for(device):
                    logits, loss = model(x, y)
                watch.record(step, loss, torch.zeros((), device=device), update=False)
            if step % log_every == 0 or step == steps:
                read_health()
                entry = {
                    "step": step,
                    "loss": mean_over_ranks(loss, context),
                    "lr": lr_at(step, steps, lr, min_lr, warmup),
                }
                if metrics is not None:
                    entry.update(metrics(logits.detach().float(), x, y))
                if val_windows is not None and (step % eval_every == 0 or step == steps):
                    eval_start = time.perf_counter()
                    entry["val_loss"] = validation_loss(model, val_windows, batch_size, device)
                    eval_seconds += time.perf_counter() - eval_start
                    postfix["val"] = f"{entry['val_loss']:.3f}"
                history.append(entry)
                # tokens/s of training alone: the validation passes are not counted
                rate = tokens_trained / max(time.perf_counter() - clock - eval_seconds, 1e-9)
                postfix.update(loss=f"{entry['loss']:.3f}", tok_s=f"{rate:,.0f}")
                bar.set_postfix(postfix, refresh=False)
        save(steps)
    except KeyboardInterrupt as interrupt:
        signum = getattr(interrupt, "signum", None)
        raise TrainingInterrupted(
            _interrupted_message(step, out, saved_step, signum), 130 if signum is None else 128 + signum
        ) from None
    finally:
        restore_signals()
        bar.close()
    if context.enabled:
        dist.barrier()  # every rank returns only once rank 0's final checkpoint is on disk
        if context.created_group:
            dist.destroy_process_group()
    return model.eval(), history


def _update(step_model, model, optim, x, y, learning_rate: float, grad_clip: float, device, watch, step: int):
    """One optimizer step on the batch (x, y): forward under autocast, backward, clip, then the update, which
    the fused optimizer skips on the device once ``watch`` has seen a non-finite value."""
    for group in optim.param_groups:
        group["lr"] = learning_rate
    with autocast_for(device):
        logits, loss = step_model(x, y)
    loss.backward()
    # the norm is needed to catch a non-finite gradient; an infinite bound leaves it unclipped
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0 else math.inf)
    watch.record(step, loss, grad_norm, update=True)  # before the update: a NaN never reaches the weights
    optim.step()
    optim.zero_grad(set_to_none=True)
    return logits, loss


class NonFiniteWatch:
    """Catches the first non-finite loss or gradient without reading it on the host every step: ``broken``
    turns 1 on the device at the first bad step, the fused optimizer then skips every update (``found_inf``, as
    under a GradScaler), and each step's (loss, gradient norm, health) waits until ``read`` (at the next logging
    step or checkpoint) reads them all at once and raises at the first bad one."""

    def __init__(self, optim: torch.optim.Optimizer, device: torch.device, context: DistributedContext):
        self.broken = torch.zeros((), device=device)
        optim.found_inf = self.broken
        self.context, self.unread, self.last_loss = context, [], None

    def record(self, step: int, loss, grad_norm, update: bool) -> None:
        healthy = (torch.isfinite(loss.detach()) & torch.isfinite(grad_norm)).float()
        if self.context.enabled:  # every rank stops together (gradients are shared, losses are not)
            dist.all_reduce(healthy, op=dist.ReduceOp.MIN)
        self.unread.append((step, (loss.detach().float(), grad_norm.float(), healthy)))
        if update:
            torch.maximum(self.broken, 1 - healthy, out=self.broken)

    def read(self, message: Callable[[int, float, float, float | None], str]) -> None:
        """Raise FloatingPointError(message(step, loss, grad_norm, last finite loss)) at the first bad step."""
        if not self.unread:
            return
        values = torch.stack([torch.stack(record) for _, record in self.unread]).tolist()  # the one host sync
        for (step, _), (loss, grad_norm, healthy) in zip(self.unread, values):
            if not healthy:  # the same on every rank (all-reduced), so every rank stops here
                raise FloatingPointError(message(step, loss, grad_norm, self.last_loss))
            self.last_loss = loss
        self.unread.clear()


def _restore_optimizer(optim: torch.optim.Optimizer, checkpoint: dict | None, steps: int) -> tuple[int, list[dict]]:
    """(first step, history so far): (0, []) for a new run; a resumed one's optimizer state is loaded."""
    if checkpoint is None:
        return 0, []
    _load_optimizer_state(optim, checkpoint["optimizer"])
    start = int(checkpoint["step"])
    if start > steps:
        raise ValueError(f"the checkpoint is at step {start}, beyond steps={steps}")
    return start, [entry for entry in checkpoint["history"] if entry["step"] < start]


# ----------------------------------------------------------------------------- checks before the first step


def check_arguments(*, lr, min_lr, weight_decay, grad_clip, optimizer, metrics, **counts) -> None:
    """`train`'s arguments, each error naming the bad value and what is valid. Needs no torch: the command line
    checks its flags with it before torch loads (`declared.code_without_torch`)."""
    minimum = {
        "steps": 1,
        "batch_size": 1,
        "warmup": 0,
        "eval_every": 1,
        "eval_windows": 1,
        "log_every": 1,
        "checkpoint_every": 0,
        "seed": 0,
    }
    for name, value in counts.items():
        check_number(name, value, minimum[name])
    for name, value in (("min_lr", min_lr), ("weight_decay", weight_decay), ("grad_clip", grad_clip)):
        check_number(name, value, 0.0, integer=False)
    if lr is not None and (isinstance(lr, bool) or not isinstance(lr, numbers.Real) or not lr > 0):
        raise ValueError(f"lr must be a number > 0, got {lr!r}")
    if optimizer is not None and optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; valid choices: {', '.join(OPTIMIZERS)}")
    if metrics is not None and not callable(metrics):
        raise TypeError(f"metrics must be a function (logits, inputs, targets) -> dict, got {type(metrics).__name__}")


def _check_run(
    cfg: GPTConfig, train_data, val_data, batch_size: int, device: torch.device, allow_leakage: bool, built: bool
) -> None:
    """Before the first step: a decoder's windows of 2 tokens or more, token data longer than a window and
    within the vocabulary, a training step that fits in memory (with the weights of a model not `built` yet),
    and no leak (`decoder_leaks`)."""
    if cfg.causal and cfg.block_size < 2:
        raise ValueError(
            f"block_size={cfg.block_size} is too short for a language model: it must be >= 2, so that "
            f"a window holds a token that can read an earlier one"
        )
    for name, tokens in (("data", train_data), ("val_data", val_data)):
        if tokens is None or callable(tokens):
            continue
        if len(tokens) <= cfg.block_size + 1:
            raise ValueError(
                f"{name} has {len(tokens)} tokens; training needs more than block_size + 1 = {cfg.block_size + 1}"
            )
        if int(tokens.max()) >= cfg.vocab_size or int(tokens.min()) < 0:
            raise ValueError(
                f"{name} holds tokens in [{int(tokens.min())}, {int(tokens.max())}], outside "
                f"[0, vocab_size={cfg.vocab_size})"
            )
    # a batch function's batch size and lengths are its own business: then the weights alone are counted
    check_memory(cfg, 0 if callable(train_data) else batch_size, cfg.block_size, True, device, weights=not built)
    decoder_leaks(cfg, allow_leakage)  # after the memory check: it builds a one-layer model of this width
    if not cfg.causal and not callable(train_data):  # next-token prediction on a text, by an encoder
        refuse_leak(
            "an encoder (causal False) on next-token prediction: every position attends to the token it is to "
            "predict, so its losses and perplexities mean nothing",
            "train a decoder (the default; CLI: without --no-causal)",
            allow_leakage,
            stacklevel=4,
        )
