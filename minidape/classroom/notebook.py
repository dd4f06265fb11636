"""What every notebook sets up first, in one place: quick mode, seed and threads, the device, and the training
budget that the books notebooks (03–06) share.

    RUN = notebook.start()              # first cell; QUICK = RUN.quick
    DEVICE = notebook.device()          # the DEVICE cell
    BUDGET = notebook.books_budget(QUICK)
    ...
    print(f"notebook run time: {RUN.seconds():.0f} s")
"""

from __future__ import annotations

import dataclasses
import time

import torch

from ..threads import use_threads
from ..utils import quick_mode, resolve_device


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
    free now. Quick mode comes from the environment (`utils.quick_mode`)."""
    torch.manual_seed(seed)
    threads = use_threads(work=0 if one_thread else None).threads
    return Run(quick=quick_mode(), started=time.perf_counter(), threads=threads)


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
