"""Training loop: device and precision, cosine schedule, checkpoints, exact resume, DDP through torchrun.

```python
model, history = md.train(md.GPTConfig(pe="alibi"), "austen", steps=500, out="runs/alibi")
model, history = md.train(None, "austen", steps=1000, out="runs/alibi", resume=True)  # continue it
```

Reproducibility: every step re-seeds `random`, numpy and torch from `(seed, rank, step)`, so the batch and
the dropout noise of step `s` do not depend on what ran before it. A run resumed from a checkpoint therefore
continues exactly where the checkpoint left it (on CPU: bitwise), on one process or under DDP, without
saving any generator state.

DDP: launch the same script with `torchrun --nproc_per_node=N`; `train` notices the torchrun environment,
joins the process group (nccl on CUDA, gloo on CPU), gives each rank its own batches (`batch_size` is per
rank), averages gradients, and lets rank 0 alone show progress and write checkpoints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import numbers
import os
import random
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm   # text bars: tqdm.auto warns in Jupyter without ipywidgets

from .data import check_tokens, fixed_windows, get_batch, load_corpus
from .model import GPT, GPTConfig

CHECKPOINT_NAME = "checkpoint.pt"
CHECKPOINT_KEYS = ("model", "config", "optimizer", "step", "seed", "history")
DEVICE_CHOICES = ("auto", "cpu", "cuda", "mps")
TOKENS_EXPECTED = "a 1-D integer token tensor or a corpus name/path"


# ----------------------------------------------------------------------------- devices, seeds, schedule


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """`"auto"` picks CUDA, then Apple's MPS, then the CPU; anything else is checked and returned."""
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    kind = str(device).split(":")[0]
    if kind not in DEVICE_CHOICES:
        raise ValueError(f"unknown device {device!r}; valid choices: {', '.join(DEVICE_CHOICES)} (cuda:N too)")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available; use 'auto' or 'cpu'")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {device!r} requested but MPS is not available; use 'auto' or 'cpu'")
    return torch.device(device)


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


def autocast_for(device: torch.device):
    """bf16 autocast on CUDA; full precision elsewhere (CPU bf16 is slower than fp32 for these sizes)."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


# ----------------------------------------------------------------------------- checkpoints


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path beside `path`; on success move it over `path` in one step (`os.replace`).

    Readers therefore see either the old file or the complete new one, never a half-written file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)               # mkstemp makes the file private; give it the usual mode
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def save_checkpoint(path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                    step: int = 0, seed: int = 0, history: list[dict] | None = None, **extra) -> Path:
    """Write a checkpoint of plain state (tensors, numbers, strings) that loads with `weights_only=True`.

    Keys: `model` (state dict), `config` (`asdict(model.cfg)`), `optimizer`, `step` (updates done), `seed`,
    `history`, plus any JSON-like `extra` (e.g. `corpus`).
    """
    checkpoint = {
        "model": model.state_dict(),
        "config": dataclasses.asdict(model.cfg),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "step": step,
        "seed": seed,
        "history": list(history or []),
        **extra,
    }
    with atomic_path(path) as tmp:
        torch.save(checkpoint, tmp)
    return Path(path)


def read_checkpoint(path: str | os.PathLike, device: str | torch.device = "cpu") -> dict:
    """Load a checkpoint dict (a directory means its `checkpoint.pt`), with clear errors for bad files."""
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT_NAME
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        checkpoint = torch.load(path, map_location=device, weights_only=True)
    except Exception as err:  # torch raises several types (EOFError, RuntimeError, UnpicklingError, ...)
        raise ValueError(f"cannot read checkpoint {path}: the file is truncated or corrupt "
                         f"({type(err).__name__}: {err})") from err
    missing = [key for key in CHECKPOINT_KEYS if not isinstance(checkpoint, dict) or key not in checkpoint]
    if missing:
        raise ValueError(f"{path} is not a minidape checkpoint: missing {', '.join(missing)}")
    return checkpoint


def config_from_dict(config: dict) -> GPTConfig:
    """`GPTConfig(**config)`, with an error naming any field this version of GPTConfig does not know."""
    known = {f.name for f in dataclasses.fields(GPTConfig)}
    unknown = sorted(set(config) - known)
    if unknown:
        raise ValueError(f"checkpoint config has fields unknown to GPTConfig: {', '.join(unknown)}; "
                         f"known fields: {', '.join(sorted(known))}")
    return GPTConfig(**config)


def load_checkpoint(path: str | os.PathLike, device: str | torch.device = "cpu") -> tuple[GPT, dict]:
    """Rebuild the model of a checkpoint on `device`, in eval mode; returns `(model, checkpoint)`.

    The checkpoint dict carries `step`, `history`, `config` and whatever else training stored
    (e.g. `corpus`).
    """
    device = resolve_device(device)
    checkpoint = read_checkpoint(path, device)
    model = GPT(config_from_dict(checkpoint["config"])).to(device)
    model.load_state_dict(checkpoint["model"])
    return model.eval(), checkpoint


# ----------------------------------------------------------------------------- distributed


@dataclasses.dataclass
class DistributedContext:
    """Where this process sits in a torchrun job (rank 0 of 1 when not launched by torchrun)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    created_group: bool = False

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup_distributed(device: str | torch.device) -> tuple[DistributedContext, torch.device]:
    """Join the torchrun process group when `WORLD_SIZE > 1` (nccl on CUDA, gloo otherwise)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistributedContext(), resolve_device(device)
    context = DistributedContext(rank=int(os.environ["RANK"]), world_size=world_size,
                                 local_rank=int(os.environ.get("LOCAL_RANK", "0")))
    if device == "auto":  # MPS has no collective backend: DDP runs on CUDA or on the CPU
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = resolve_device(device)
    if device.type == "cuda":
        device = torch.device("cuda", context.local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        context.created_group = True
    return context, device


# ----------------------------------------------------------------------------- training


def _resolve_data(data, val_data) -> tuple[torch.Tensor, torch.Tensor | None, str | None]:
    """Token tensors for training and validation; a corpus name/path loads its two splits."""
    corpus = None
    if isinstance(data, (str, os.PathLike)):
        corpus = str(data)
        if val_data is None:
            val_data = load_corpus(corpus, "val")
        data = load_corpus(corpus, "train")
    if isinstance(val_data, (str, os.PathLike)):
        val_data = load_corpus(str(val_data), "val")
    val_data = None if val_data is None else check_tokens(val_data, "val_data", TOKENS_EXPECTED)
    return check_tokens(data, "data", TOKENS_EXPECTED), val_data, corpus


def _resolve_model(model_or_cfg, checkpoint: dict | None) -> nn.Module:
    if checkpoint is not None:
        saved = config_from_dict(checkpoint["config"])
        given = getattr(model_or_cfg, "cfg", model_or_cfg)
        if given is not None and given != saved:
            changed = [f.name for f in dataclasses.fields(saved) if getattr(given, f.name) != getattr(saved, f.name)]
            raise ValueError(f"the model to resume differs from the checkpoint's in: {', '.join(changed)}; "
                             f"pass None to use the checkpoint's config")
        model = model_or_cfg if isinstance(model_or_cfg, nn.Module) else GPT(saved)
        model.load_state_dict(checkpoint["model"])
        return model
    if isinstance(model_or_cfg, GPTConfig):
        return GPT(model_or_cfg)
    if isinstance(model_or_cfg, nn.Module) and isinstance(getattr(model_or_cfg, "cfg", None), GPTConfig):
        return model_or_cfg
    raise TypeError(f"model_or_cfg must be a GPTConfig or a model with a .cfg GPTConfig "
                    f"(None only with resume), got {type(model_or_cfg).__name__}")


def _optimizer(model: nn.Module, lr: float, weight_decay: float, device: torch.device) -> torch.optim.AdamW:
    """AdamW with betas (0.9, 0.95); weight decay on matrices only (not on biases, norms, per-head scalars)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=device.type == "cuda")


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


def _check_number(name: str, value, minimum: float, integer: bool = True) -> None:
    """Raise a ValueError naming `name` unless `value` is None (use the default) or a number >= `minimum`."""
    kind = numbers.Integral if integer else numbers.Real
    if value is not None and (isinstance(value, bool) or not isinstance(value, kind) or value < minimum):
        raise ValueError(f"{name} must be {'an integer' if integer else 'a number'} >= {minimum}, got {value!r}")


def train(model_or_cfg: GPTConfig | nn.Module | None, data="austen", *, steps: int = 1000, batch_size: int = 32,
          lr: float = 1e-3, min_lr: float | None = None, warmup: int | None = None, weight_decay: float = 0.1,
          grad_clip: float = 1.0, val_data=None, eval_every: int | None = None, eval_windows: int = 32,
          log_every: int | None = None, device: str | torch.device = "auto", seed: int = 0,
          compile: bool = False, out: str | os.PathLike | None = None, checkpoint_every: int | None = None,
          resume: bool | str | os.PathLike = False, progress: bool = True) -> tuple[nn.Module, list[dict]]:
    """Train a GPT on random `block_size` windows of `data`; returns `(model, history)`.

    - `model_or_cfg`: a `GPTConfig` (the model is built after seeding, so its init is reproducible), a model
      with a `.cfg`, or `None` when resuming (the checkpoint's config is used).
    - `data`: a 1-D token tensor, or a corpus name/path whose `train` split is trained on and whose `val`
      split gives the validation loss (unless `val_data` is given).
    - Schedule: AdamW (betas 0.9, 0.95), `warmup` linear steps (default 5% of `steps`), cosine decay to
      `min_lr` (default `lr / 10`), gradient norm clipped to `grad_clip` (0 disables).
    - `history`: one dict per logged step with `step` (updates done), `loss` (training loss of that step's
      batch, averaged over ranks), `lr`, and `val_loss` every `eval_every` steps; the first entry is at
      step 0, the last at `steps`.
    - `out`: directory for `checkpoint.pt`, written at the end and every `checkpoint_every` steps.
    - `resume`: `True` continues from `out/checkpoint.pt`, a path continues from that file; the seed and
      step come from the checkpoint, and the same arguments continue the run exactly.
    The model is returned in eval mode, unwrapped (no DDP, no compile).
    """
    for name, value, minimum in (("steps", steps, 1), ("batch_size", batch_size, 1), ("warmup", warmup, 0),
                                 ("eval_every", eval_every, 1), ("eval_windows", eval_windows, 1),
                                 ("log_every", log_every, 1), ("checkpoint_every", checkpoint_every, 0)):
        _check_number(name, value, minimum)
    for name, value in (("min_lr", min_lr), ("weight_decay", weight_decay), ("grad_clip", grad_clip)):
        _check_number(name, value, 0.0, integer=False)
    if isinstance(lr, bool) or not isinstance(lr, numbers.Real) or not lr > 0:
        raise ValueError(f"lr must be a number > 0, got {lr!r}")
    context, device = setup_distributed(device)
    checkpoint = None
    if resume:
        if resume is True:
            if out is None:
                raise ValueError("resume=True needs out= (the run directory holding checkpoint.pt)")
            resume = Path(out) / CHECKPOINT_NAME
        checkpoint = read_checkpoint(resume, device)
        seed = int(checkpoint["seed"])
    seed_everything(seed)
    model = _resolve_model(model_or_cfg, checkpoint).to(device)
    cfg = model.cfg
    train_data, val_data, corpus = _resolve_data(data, val_data)
    for name, tokens in (("data", train_data), ("val_data", val_data)):
        if tokens is not None and len(tokens) <= cfg.block_size + 1:
            raise ValueError(f"{name} has {len(tokens)} tokens; training needs more than block_size + 1 = "
                             f"{cfg.block_size + 1}")
        if tokens is not None and int(tokens.max()) >= cfg.vocab_size:
            raise ValueError(f"{name} holds token {int(tokens.max())}, outside vocab_size {cfg.vocab_size}")

    warmup = max(1, steps // 20) if warmup is None else warmup
    min_lr = lr / 10 if min_lr is None else min_lr
    log_every = max(1, steps // 100) if log_every is None else log_every
    eval_every = max(1, steps // 10) if eval_every is None else eval_every
    optimizer = _optimizer(model, lr, weight_decay, device)
    start, history = 0, []
    if checkpoint is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
        start = int(checkpoint["step"])
        history = [entry for entry in checkpoint["history"] if entry["step"] < start]
        if start > steps:
            raise ValueError(f"the checkpoint is at step {start}, beyond steps={steps}")
    val_windows = None
    if val_data is not None and context.is_main:
        val_windows = fixed_windows(val_data, cfg.block_size + 1, eval_windows, seed)

    model.train()
    step_model = model
    if context.enabled:
        step_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if compile:
        step_model = torch.compile(step_model)
    extra = {"corpus": corpus}

    def save(step_done: int) -> None:
        if out is not None and context.is_main:
            save_checkpoint(Path(out) / CHECKPOINT_NAME, model, optimizer, step_done, seed, history, **extra)

    bar = tqdm(total=steps, initial=start, disable=not (progress and context.is_main), unit="step",
               desc=f"{cfg.pe}+{cfg.refiner}", dynamic_ncols=True)
    generator = torch.Generator()
    tokens_per_step = batch_size * cfg.block_size * context.world_size
    clock, eval_seconds, timed_steps, postfix = time.perf_counter(), 0.0, 0, {}
    for step in range(start, steps + 1):
        if checkpoint_every and start < step < steps and step % checkpoint_every == 0:
            save(step)
        step_rng = step_seed(seed, context.rank, step)
        seed_everything(step_rng)
        generator.manual_seed(step_rng)
        x, y = get_batch(train_data, batch_size, cfg.block_size, generator=generator, device=device)
        if step == steps:  # the final entry measures the trained model; no update follows
            with torch.no_grad(), autocast_for(device):
                _, loss = model(x, y)
        else:
            learning_rate = lr_at(step, steps, lr, min_lr, warmup)
            for group in optimizer.param_groups:
                group["lr"] = learning_rate
            with autocast_for(device):
                _, loss = step_model(x, y)
            loss.backward()
            if grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            timed_steps += 1
            bar.update(1)
        if step % log_every == 0 or step == steps:
            loss = loss.detach().float()
            if context.enabled:  # SUM then divide: gloo has no AVG
                dist.all_reduce(loss, op=dist.ReduceOp.SUM)
                loss /= context.world_size
            entry = {"step": step, "loss": loss.item(), "lr": lr_at(step, steps, lr, min_lr, warmup)}
            if val_windows is not None and (step % eval_every == 0 or step == steps):
                eval_start = time.perf_counter()
                entry["val_loss"] = validation_loss(model, val_windows, batch_size, device)
                eval_seconds += time.perf_counter() - eval_start
                postfix["val"] = f"{entry['val_loss']:.3f}"
            history.append(entry)
            # tokens/s of training alone: the validation passes are not counted
            rate = timed_steps * tokens_per_step / max(time.perf_counter() - clock - eval_seconds, 1e-9)
            postfix.update(loss=f"{entry['loss']:.3f}", tok_s=f"{rate:,.0f}")
            bar.set_postfix(postfix, refresh=False)
    bar.close()
    save(steps)
    if context.enabled:
        dist.barrier()  # every rank returns only once rank 0's final checkpoint is on disk
        if context.created_group:
            dist.destroy_process_group()
    return model.eval(), history
