"""Chomsky-hierarchy length generalisation (CHE): train an encoder on a task, test it at longer inputs.

The protocol of Ruoss et al. (2023) and the DAPE papers (Appendix D): train on inputs of length
``n ~ U{1..40}``, test on every length up to 500, report the mean accuracy beyond the training lengths::

    model, history, results = train_task("reverse_string", GPTConfig(pe="kerple_log", refiner="dape"),
                                         steps=2000, test_lengths=range(1, 501))
    results["mean_beyond_train"]            # mean accuracy over the test lengths 41..500
    print(accuracy_table({"DAPE-Kerple": results}))
    md.plots.plot_accuracy({"DAPE-Kerple": results["accuracy"]}, chance=get_task("reverse_string").chance_accuracy)

Training runs through :func:`minidape.lab.train.train`, the package's one training loop, with a batch function
that draws each step's task batch and Adam, as the benchmark does. The task generators and the accuracy
they are scored by are :mod:`minidape.lab.tasks`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import numbers
import time
from collections.abc import Iterable

import torch
from torch import nn

from ..model import GPTConfig
from ..threads import api_call, api_entry
from ..utils import autocast_for, check_number, model_device, model_label, resolve_device
from .tasks import TASK_NAMES, Task, accuracy, encoder_inputs, encoder_targets, get_task, output_mask
from .train import seed_everything, step_seed, train

__all__ = ["task_config", "train_task", "evaluate_task", "accuracy_table", "sequence_length"]


def _resolve_task(task) -> Task:
    if isinstance(task, Task):
        return task
    if isinstance(task, str):
        return get_task(task)
    raise TypeError(f"task must be a task name (one of {', '.join(TASK_NAMES)}) or a Task, got {type(task).__name__}")


def _valid_lengths(task: Task, lengths, what: str) -> list[int]:
    """The distinct lengths the task generates for the requested ones (see ``Task.valid_length``), sorted;
    requests below ``task.min_length`` are dropped."""
    lengths = list(lengths)
    bad = [n for n in lengths if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1]
    if bad or not lengths:
        raise ValueError(f"{what} must be a non-empty collection of positive integers, got {bad or lengths}")
    valid = sorted({task.valid_length(int(n)) for n in lengths if n >= task.min_length})
    if not valid:
        raise ValueError(f"{what} holds no length {task.name} can generate: it needs {task.length_rule}")
    return valid


def sequence_length(task: Task, n: int) -> int:
    """Tokens the encoder reads for an input of length ``n``: the input and its answer placeholders."""
    return n + task.output_length(n)


def task_config(task, cfg: GPTConfig | None = None, max_train_length: int = 40) -> GPTConfig:
    """``cfg`` (default: ``GPTConfig()``) made fit for ``task``: ``causal=False`` (an encoder),
    ``vocab_size = task.model_vocab_size``, ``block_size`` = the longest training sequence (input +
    placeholders), and ``tie_embeddings=False``: the benchmark's classifier is its own output layer, not the
    input embedding (Delétang et al., 2023). The one place where the CHE encoder's config is made."""
    task = _resolve_task(task)
    cfg = GPTConfig() if cfg is None else cfg
    if not isinstance(cfg, GPTConfig):
        raise TypeError(f"cfg must be a GPTConfig, got {type(cfg).__name__}")
    block_size = sequence_length(task, task.valid_length(max_train_length))
    return dataclasses.replace(
        cfg, causal=False, vocab_size=task.model_vocab_size, block_size=block_size, tie_embeddings=False
    )


def _check_config(cfg: GPTConfig, task: Task) -> None:
    """An encoder whose vocabulary covers the task's inputs, placeholder and answers."""
    if not isinstance(cfg, GPTConfig):
        raise TypeError(f"the model must carry a GPTConfig as .cfg (an md.GPT), got {type(cfg).__name__}")
    if cfg.causal or cfg.vocab_size < task.model_vocab_size:
        raise ValueError(
            f"a model for {task.name} needs causal=False and vocab_size >= {task.model_vocab_size}; "
            f"got causal={cfg.causal}, vocab_size={cfg.vocab_size} (build it from "
            f"md.che.task_config({task.name!r}, cfg))"
        )


def _check_positions_cover(cfg: GPTConfig, task: Task, lengths: list[int]) -> None:
    """Fail before training when a test sequence cannot be encoded: beyond a learned table, or beyond the
    range of random positions (which evaluation draws too)."""
    longest = sequence_length(task, max(lengths))
    if cfg.random_positions and longest > cfg.random_positions:
        raise ValueError(
            f"random_positions={cfg.random_positions} is shorter than the longest test sequence "
            f"({longest} tokens = input + answer placeholders); raise it or test shorter lengths"
        )
    table = max(cfg.block_size, cfg.random_positions)
    if cfg.pe == "learned" and longest > table:
        raise ValueError(
            f"pe='learned' has {table} positions but the longest test sequence has {longest} tokens; "
            f"use random_positions >= {longest} (Ruoss et al.) or shorter test lengths"
        )


@contextlib.contextmanager
def _test_positions(model: nn.Module):
    """Eval mode; with ``random_positions`` the positions are still drawn at random, as Ruoss et al. (2023)
    do at test time. ``GPT.positions`` draws them while the top-level module is in training mode, so only
    that one flag is set: every submodule stays in eval mode (no dropout)."""
    was_training = model.training
    model.eval()
    model.training = bool(model.cfg.random_positions)
    try:
        yield
    finally:
        model.train(was_training)


@api_entry
@torch.no_grad()
def evaluate_task(
    model: nn.Module, task, lengths: Iterable[int], samples: int = 64, seed: int = 0, batch_tokens: int = 16384
) -> dict[int, float]:
    """Accuracy of an encoder ``model`` on ``samples`` fresh sequences of each length: ``{n: accuracy}``.

    Each length's sequences come from a generator seeded by ``(seed, n)``, so every model meets the same test
    set whatever the order of lengths. Forward passes hold at most ``batch_tokens`` tokens (length 500
    runs on a CPU). Accuracy per length is the benchmark's: correct scored answer tokens over scored ones.
    """
    task = _resolve_task(task)
    if not isinstance(getattr(model, "cfg", None), GPTConfig):
        raise TypeError(f"the model must carry a GPTConfig as .cfg (an md.GPT), got {type(model).__name__}")
    _check_config(model.cfg, task)
    lengths = _valid_lengths(task, lengths, "lengths")
    check_number("samples", samples, 1, allow_none=False)
    check_number("batch_tokens", batch_tokens, 1, allow_none=False)
    _check_positions_cover(model.cfg, task, lengths)
    device = model_device(model)
    results = {}
    with _test_positions(model):
        for n in lengths:
            length_seed = step_seed(seed, 0, n)
            seed_everything(length_seed)  # random test positions, if any, come from the global RNG
            inputs, targets = task.sample(samples, n, torch.Generator().manual_seed(length_seed))
            batch_size = max(1, batch_tokens // sequence_length(task, n))
            correct = scored = 0
            for x, y in zip(inputs.split(batch_size), targets.split(batch_size)):
                with autocast_for(device):
                    logits, _ = model(encoder_inputs(x, task).to(device))
                y = y.to(device)
                mask = output_mask(y, task)
                answers = logits[:, -y.shape[1] :, : task.output_vocab].argmax(dim=-1)
                correct += int(((answers == y) & mask).sum())
                scored += int(mask.sum())
            results[n] = correct / scored
    return results


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


class _TaskBatches:
    r"""The batch function of one training run: each step draws one input length
    :math:`n \sim U\{\text{min\_length}..\text{max\_train\_length}\}` (made valid by ``task.valid_length``)
    for the whole batch, from the step's generator; the encoder reads the input and its placeholders and is
    trained on the answer positions (the input positions carry the ignore label -1)."""

    def __init__(self, task: Task, batch_size: int, max_train_length: int):
        self.task, self.batch_size, self.max_train_length = task, batch_size, max_train_length
        self.length = 0  # the input length of the latest batch, read by `metrics`

    def __call__(self, step: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        drawn = torch.randint(self.task.min_length, self.max_train_length + 1, (1,), generator=generator)
        self.length = self.task.valid_length(int(drawn))
        inputs, targets = self.task.sample(self.batch_size, self.length, generator)
        return encoder_inputs(inputs, self.task), encoder_targets(targets, self.length)

    def metrics(self, logits: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor) -> dict:
        """The history entry's extras: the batch's input length and its accuracy on the answer positions."""
        answers = slice(self.length, None)
        return {"length": self.length, "accuracy": accuracy(logits[:, answers], targets[:, answers], self.task).item()}


def train_task(
    task,
    model_or_cfg: GPTConfig | nn.Module | None = None,
    *,
    steps: int = 1000,
    batch_size: int = 32,
    lr: float = 1e-3,
    warmup: int | None = None,
    min_lr: float | None = None,
    grad_clip: float = 1.0,
    max_train_length: int = 40,
    test_lengths: Iterable[int] = range(1, 501),
    eval_samples: int = 64,
    eval_batch_tokens: int = 16384,
    device: str | torch.device = "auto",
    seed: int = 0,
    log_every: int | None = None,
    progress: bool = True,
) -> tuple[nn.Module, list[dict], dict]:
    r"""Train an encoder on ``task`` as Ruoss et al. (2023) and the DAPE paper (Appendix D), then test it.

    - Model: a ``GPTConfig`` (made fit by :func:`task_config`: encoder, the task's vocabulary), a model
      built that way, or ``None`` for ``task_config(task)``. ``random_positions=L`` in the config gives
      randomized positional encodings, drawn at training and at test time.
    - Training: :func:`minidape.lab.train.train` with a batch function: each step one input length
      :math:`n \sim U\{1..	ext{max\_train\_length}\}` (mapped by ``task.valid_length``; from
      ``task.min_length``) for the whole batch, cross-entropy on the answer positions. Adam (betas 0.9,
      0.999, no weight decay), linear warmup (default 5% of steps) then cosine decay to ``min_lr`` (default
      ``lr / 10``), gradient norm clipped to ``grad_clip``.
    - Test: :func:`evaluate_task` at every valid length of ``test_lengths`` with ``eval_samples`` sequences.

    Seeds: ``seed`` fixes the initialisation, the training lengths and batches, and the test sets.
    Returns ``(model, history, results)``: the model in eval mode; ``history`` one dict per logged step
    (``step``, ``loss``, ``lr``, ``length``, ``accuracy`` of that step's batch; the last entry, at ``steps``,
    measures the trained model on a fresh batch); ``results`` a dict with ``accuracy`` ``{n: acc}``,
    ``mean_beyond_train`` (mean over test lengths > ``max_train_length``, the papers' score),
    ``mean_within_train``, ``chance`` and the budget (steps, batch size, parameters, seconds).
    """
    task = _resolve_task(task)
    for name, value in (("steps", steps), ("batch_size", batch_size), ("max_train_length", max_train_length)):
        check_number(name, value, 1, allow_none=False)
    if max_train_length < task.min_length:
        raise ValueError(
            f"max_train_length={max_train_length} is below the shortest {task.name} input "
            f"({task.min_length}: it needs {task.length_rule})"
        )
    lengths = _valid_lengths(task, test_lengths, "test_lengths")
    device = resolve_device(device)
    if model_or_cfg is None or isinstance(model_or_cfg, GPTConfig):
        model_or_cfg = task_config(task, model_or_cfg, max_train_length)
    cfg = getattr(model_or_cfg, "cfg", model_or_cfg)
    _check_config(cfg, task)
    _check_positions_cover(cfg, task, lengths)

    batches = _TaskBatches(task, batch_size, max_train_length)
    # the threads the CLI's `che` takes for this work, kept by the train and evaluate_task calls inside
    with api_call(batch_size * max_train_length * cfg.n_embd):
        started = time.perf_counter()
        model, history = train(
            model_or_cfg,
            batches,
            steps=steps,
            lr=lr,
            warmup=warmup,
            min_lr=min_lr,
            weight_decay=0.0,
            grad_clip=grad_clip,
            optimizer="adam",
            log_every=log_every,
            metrics=batches.metrics,
            device=device,
            seed=seed,
            progress=progress,
        )
        train_seconds = time.perf_counter() - started

        started = time.perf_counter()
        curve = evaluate_task(model, task, lengths, samples=eval_samples, seed=seed, batch_tokens=eval_batch_tokens)
    results = {
        "task": task.name,
        "level": task.level,
        "model": model_label(model.cfg),
        "accuracy": curve,
        "mean_beyond_train": _mean([acc for n, acc in curve.items() if n > max_train_length]),
        "mean_within_train": _mean([acc for n, acc in curve.items() if n <= max_train_length]),
        "chance": task.chance_accuracy,
        "max_train_length": max_train_length,
        "steps": steps,
        "batch_size": batch_size,
        "lr": lr,
        "eval_samples": eval_samples,
        "seed": seed,
        "device": str(device),
        "parameters": sum(p.numel() for p in model.parameters()),
        "config": dataclasses.asdict(model.cfg),
        "train_seconds": round(train_seconds, 1),
        "eval_seconds": round(time.perf_counter() - started, 1),
    }
    return model, history, results


# --------------------------------------------------------------------------------------- tables


def _length_bins(lengths: list[int], train_length: int) -> list[tuple[int, int]]:
    """``(1, train_length)``, then hundreds: ``(train_length + 1, 100)``, ``(101, 200)``, ..., the last one
    ending at the longest length; bins holding no length are left out."""
    bins = [(1, train_length)] if lengths[0] <= train_length else []
    low = train_length + 1
    while low <= lengths[-1]:
        high = min(lengths[-1], (low - 1) // 100 * 100 + 100)
        bins.append((low, high))
        low = high + 1
    return [(low, high) for low, high in bins if any(low <= n <= high for n in lengths)]


def accuracy_table(results: dict[str, dict], train_length: int = 40) -> str:
    r"""Markdown table of accuracies (%), one row per entry of ``results`` (``{label: train_task results or
    {n: accuracy}}``): the mean over training lengths, over each hundred of test lengths, and the mean over
    every length beyond training (the papers' score, in bold for the best row)."""
    if not results:
        raise ValueError("results is empty: pass {label: results} with at least one model")
    curves = {label: entry["accuracy"] if "accuracy" in entry else entry for label, entry in results.items()}
    lengths = sorted({int(n) for curve in curves.values() for n in curve})
    bins = _length_bins(lengths, train_length)
    header = ["model"] + [f"{low}–{high}" + (" (train)" if high <= train_length else "") for low, high in bins]
    header.append(f"mean {train_length + 1}–{lengths[-1]}")
    means = {}
    rows = []
    for label, curve in curves.items():
        curve = {int(n): acc for n, acc in curve.items()}
        cells = [_mean([acc for n, acc in curve.items() if low <= n <= high]) for low, high in bins]
        means[label] = _mean([acc for n, acc in curve.items() if n > train_length])
        rows.append((label, cells + [means[label]]))
    best = max((value for value in means.values() if not math.isnan(value)), default=None)
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for label, cells in rows:
        text = ["n/a" if math.isnan(value) else f"{100 * value:.1f}" for value in cells]
        if best is not None and means[label] == best and len(rows) > 1:
            text[-1] = f"**{text[-1]}**"
        lines.append("| " + " | ".join([label] + text) + " |")
    return "\n".join(lines) + "\n"
