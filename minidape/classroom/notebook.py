"""What every notebook sets up first, in one place: quick mode, seed and threads, the device, and the training
budget that the books notebooks (03–06) share.

    RUN = notebook.start()              # first cell; QUICK = RUN.quick
    DEVICE = notebook.device()          # the DEVICE cell
    BUDGET = notebook.books_budget(QUICK)
    ...
    print(f"notebook run time: {RUN.seconds():.0f} s")

Quick mode trains too little to show what some cells are about (a flat extrapolation curve teaches nothing);
those cells draw the teacher's full-mode run beside the quick one, read with `reference`:

    shown = notebook.reference("03/last_k", last_k)        # full mode: records last_k; quick: the full run's
    notebook.beside_reference(md.plots.plot_extrapolation, last_k, shown, train_length=64)
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from importlib import resources
from pathlib import Path

import torch

from ..threads import use_threads
from ..utils import atomic_path, quick_mode, resolve_device

# The teacher's full-mode results that quick mode shows beside its own, stored inside the package (the wheel and
# Colab have them); `make notebooks` writes them during its full-mode run, naming this file in RECORD_FIGURES.
REFERENCE_RUNS = "reference_runs.json"
RECORD_FIGURES = "MINIDAPE_RECORD_FIGURES"


@dataclasses.dataclass(frozen=True)
class Run:
    """One run of a notebook: CI's quick run or the full one, and when it started."""

    quick: bool
    started: float  # time.perf_counter() at start()
    threads: int  # torch's CPU threads (minidape.threads)

    def seconds(self) -> float:
        """Seconds since the notebook started."""
        return time.perf_counter() - self.started

    def __str__(self) -> str:
        return "quick mode" if self.quick else "full mode"


def start(seed: int = 0, one_thread: bool = True) -> Run:
    """A notebook's first call: seeds torch's global random state and sets torch's CPU threads
    (`minidape.threads`: MINIDAPE_THREADS or OMP_NUM_THREADS when set). With `one_thread` the notebook's models
    are tiny: one thread is nearly as fast as several, and stays fast when other programs share the cores
    (threads that wait on each other make such small operations up to 10x slower); else as many as the cores
    free now. Quick mode comes from the environment (`utils.quick_mode`). Also sets the look of every figure
    (`plots.use_style`) and the rules they are held to (`figure_rules`)."""
    torch.manual_seed(seed)
    threads = use_threads(work=0 if one_thread else None).threads
    from ..lab import figure_rules, plots  # matplotlib only for the notebooks, not for every import of minidape

    plots.use_style()
    figure_rules.install()
    return Run(quick=quick_mode(), started=time.perf_counter(), threads=threads)


def _int_keys(value):
    """JSON's string keys back to ints where they were ints (evaluation lengths, steps)."""
    if isinstance(value, dict):
        return {int(k) if k.lstrip("-").isdigit() else k: _int_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_int_keys(v) for v in value]
    return value


def stored_references(path=None) -> dict:
    """Every reference stored with the package (or in the file `path`): {"NN/name": value}."""
    path = resources.files(__package__) / REFERENCE_RUNS if path is None else Path(path)
    return _int_keys(json.loads(path.read_text())) if path.is_file() else {}


def reference(key: str, value):
    """The teacher's full-mode result `key` (e.g. "03/last_k"). In full mode: `value` itself, also recorded in the
    file RECORD_FIGURES names when it is set (`make notebooks`). In quick mode: the stored full-mode value, or
    None when none is stored."""
    if quick_mode():
        return stored_references().get(key)
    target = os.environ.get(RECORD_FIGURES, "").strip()
    if target:
        path = Path(target)
        stored = json.loads(path.read_text()) if path.exists() else {}
        stored[key] = value
        with atomic_path(path) as tmp:
            Path(tmp).write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
    return value


def beside_reference(draw, mine, shown, title: str = "", figsize=(7, 4.5), **kwargs):
    """Draw `mine` with `draw(data, ax=..., title=..., **kwargs)`; in quick mode with a stored reference `shown`,
    the teacher's full-mode result beside it, on a shared y axis (the quick run's values against the full run's),
    each panel labelled for what it is. Returns the figure."""
    import matplotlib.pyplot as plt

    if not quick_mode() or shown is None:
        fig, ax = plt.subplots(figsize=figsize)
        note = " (quick mode: no teacher's reference stored)" if quick_mode() else ""
        draw(mine, ax=ax, title=title + note, **kwargs)
        return fig
    if isinstance(mine, dict) and isinstance(shown, dict):  # the stored file sorts its keys: legends in mine's order
        shown = {**{key: shown[key] for key in mine if key in shown}, **shown}
    fig, (left, right) = plt.subplots(1, 2, figsize=(2 * figsize[0], figsize[1]), sharey=True)
    draw(mine, ax=left, title=f"your run, quick mode: too short to show the effect\n{title}", **kwargs)
    draw(shown, ax=right, title=f"teacher's reference: the full-mode run\n{title}", **kwargs)
    return fig


def device() -> str:
    """Where a notebook's models and tensors live: "cuda" if there is a GPU, then Apple's "mps", then "cpu"."""
    return resolve_device("auto").type


@dataclasses.dataclass(frozen=True)
class BooksBudget:
    """The training budget of the books notebooks (03–06): byte-level models on Jane Austen's novels."""

    train_length: int  # block_size: the training length of every model
    steps: int  # optimizer steps per model
    batch: int  # sequences per step
    lr: float  # peak learning rate (AdamW, cosine schedule)
    lengths: tuple[int, ...]  # evaluation lengths, from the training length up
    eval_windows: int  # seeded validation windows per evaluation length (last_k)
    val_windows: int  # windows of the validation loss logged during training

    def __str__(self) -> str:
        return f"steps {self.steps}, batch {self.batch}, training length {self.train_length}"


def books_budget(quick: bool) -> BooksBudget:
    """Full mode: 400 steps of 16 x 64 bytes, evaluated up to 16x the training length. Quick mode (CI): the same
    code on 8 steps of 8 sequences, evaluated up to 4x."""
    if quick:
        return BooksBudget(
            train_length=64, steps=8, batch=8, lr=3e-3, lengths=(64, 128, 256), eval_windows=4, val_windows=8
        )
    return BooksBudget(
        train_length=64,
        steps=400,
        batch=16,
        lr=3e-3,
        lengths=(64, 128, 256, 512, 1024),
        eval_windows=32,
        val_windows=32,
    )


def time_models(models: dict, idx: torch.Tensor, repeats: int = 5, backward: bool = False) -> dict[str, float]:
    """Milliseconds per forward pass (with `backward`: per forward and backward, as in one training step) of each
    model on the batch `idx`: one warm-up pass each first (lazy set-up, caches), then `repeats` rounds in which
    every model runs once, so that a change of the machine's load meanwhile hits all of them alike; the median
    round. `{name: ms}`."""

    def one_pass(model):
        if backward:
            _, loss = model(idx, targets=idx)
            loss.backward()
            model.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                model(idx)
        if idx.device.type == "cuda":
            torch.cuda.synchronize()  # a GPU runs asynchronously: wait before reading the clock

    for model in models.values():
        one_pass(model)  # warm-up, not timed
    times = {name: [] for name in models}
    for _ in range(repeats):
        for name, model in models.items():
            start = time.perf_counter()
            one_pass(model)
            times[name].append(1000 * (time.perf_counter() - start))
    return {name: statistics.median(values) for name, values in times.items()}
