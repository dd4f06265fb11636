"""A refactor keeps the speed: training-step times of this checkout's minidape against another commit's, in one process.

    git worktree add --detach /tmp/before <commit>
    python benchmarks/bench_before_after.py /tmp/before            # T=128 B=32 and T=512 B=8, 3 rounds
    python benchmarks/bench_before_after.py /tmp/before --rounds 1 --steps 4 --cases 128x32   # a quick look
    python benchmarks/bench_before_after.py /tmp/before --cpu-time   # on a loaded machine: the thread's CPU time
    python benchmarks/bench_before_after.py /tmp/before --threads 2  # on two threads (wall clock)

The other commit's package is copied to a temporary folder as ``minidape_before`` and imported beside this one
(its modules import each other relatively, so both live in one process). For each case and refiner the two
models get the same weights (checked: the same loss), then their training steps (forward + backward, no optimizer)
are interleaved, the order reversed at every step, so drifting machine load hits both alike. Each figure is the
median over rounds of the per-round median ratio after / before, the range over rounds in brackets, and the
refiner's step time as a multiple of ``none`` in each package.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import minidape as after

REFINERS = ("none", "dape", "conv")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def import_before(checkout: Path):
    """The package of another checkout, imported as ``minidape_before``."""
    source = checkout / "minidape"
    if not (source / "model.py").is_file():
        raise SystemExit(f"{checkout} holds no minidape/model.py; give the folder of a checkout (git worktree)")
    folder = Path(tempfile.mkdtemp(prefix="minidape-before-"))
    shutil.copytree(source, folder / "minidape_before", ignore=shutil.ignore_patterns("__pycache__", "data"))
    sys.path.insert(0, str(folder))
    return importlib.import_module("minidape_before")


def models(package, T: int, refiner: str):
    cfg = package.GPTConfig(
        vocab_size=256, n_layer=4, n_head=4, n_embd=128, block_size=T, pe="kerple_log", refiner=refiner
    )
    torch.manual_seed(0)
    return package.GPT(cfg)


def step_seconds(model, x, clock=time.perf_counter) -> float:
    model.zero_grad(set_to_none=True)
    start = clock()
    _, loss = model(x, x)
    loss.backward()
    return clock() - start


def one_round(before, T: int, batch: int, steps: int, warmup: int, clock) -> dict[str, dict[str, float]]:
    """Median step seconds of each refiner in each package, all interleaved."""
    x = torch.randint(0, 256, (batch, T), generator=torch.Generator().manual_seed(T))
    pairs = {}
    for refiner in REFINERS:
        new, old = models(after, T, refiner), models(before, T, refiner)
        old.load_state_dict(new.state_dict())
        with torch.no_grad():
            same = torch.allclose(new(x, x)[1], old(x, x)[1], rtol=1e-5)
        if not same:
            raise SystemExit(f"{refiner}: the two packages give different losses for the same weights")
        pairs[refiner] = {"after": new.train(), "before": old.train()}
    times = {refiner: {"after": [], "before": []} for refiner in REFINERS}
    for i in range(warmup + steps):
        for refiner, pair in pairs.items():
            order = ("after", "before") if i % 2 else ("before", "after")
            for which in order:
                seconds = step_seconds(pair[which], x, clock)
                if i >= warmup:
                    times[refiner][which].append(seconds)
    return {refiner: {which: statistics.median(t) for which, t in sides.items()} for refiner, sides in times.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, help="folder of the other checkout (e.g. a git worktree)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--cases", nargs="+", default=["128x32", "512x8"], help="TxBATCH")
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time the thread's CPU time instead of the wall clock: on a machine shared with other jobs it leaves "
        "out the time the process waits for a core (not the cache other jobs take)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch's CPU threads (default 1); with more, the wall clock (a thread's CPU time misses the others')",
    )
    args = parser.parse_args(argv)
    if args.cpu_time and args.threads != 1:
        parser.error(f"--cpu-time times one thread; with --threads {args.threads} time the wall clock")
    clock = time.thread_time if args.cpu_time else time.perf_counter
    torch.set_num_threads(args.threads)
    before = import_before(args.before)
    print(
        f"CPU: {cpu_name()}; torch {torch.__version__}, {args.threads} thread{'s' * (args.threads > 1)}; "
        f"{args.rounds} rounds of {args.warmup} warm-up "
        f"and {args.steps} timed steps ({'thread CPU time' if args.cpu_time else 'wall clock'}); kerple_log, "
        f"4 layers x 4 heads x 128; load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}"
    )
    print(
        "| case | after / before: "
        + " | ".join(REFINERS)
        + " | x none before -> after: "
        + " | ".join(REFINERS[1:])
        + " | load after the case |"
    )
    print("|---|" + "---:|" * (2 * len(REFINERS) - 1) + "---|")
    for case in args.cases:
        T, batch = (int(n) for n in case.split("x"))
        rounds = [one_round(before, T, batch, args.steps, args.warmup, clock) for _ in range(args.rounds)]
        ratios = []
        for refiner in REFINERS:
            values = [r[refiner]["after"] / r[refiner]["before"] for r in rounds]
            ratios.append(f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")
        multiples = []
        for refiner in REFINERS[1:]:
            old = statistics.median(r[refiner]["before"] / r["none"]["before"] for r in rounds)
            new = statistics.median(r[refiner]["after"] / r["none"]["after"] for r in rounds)
            multiples.append(f"{old:.2f} -> {new:.2f}")
        load = " ".join(f"{v:.1f}" for v in os.getloadavg())
        print(
            f"| T={T}, B={batch} | " + " | ".join(ratios) + " | " + " | ".join(multiples) + f" | {load} |", flush=True
        )


if __name__ == "__main__":
    main()
