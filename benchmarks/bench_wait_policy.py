"""OpenMP's wait policy against the thread count: the demo model's training step (2 layers x 64, kerple_log,
T = 128, batch 16, AdamW) with 1 thread, 2 sleeping threads (``OMP_WAIT_POLICY=PASSIVE``, what minidape sets),
and 2 threads that spin ``GOMP_SPINCOUNT`` times before they sleep (GNU OpenMP, the thread pool of torch's Linux
CPU wheels), idle and under a load this script starts itself (2 busy processes per core, ended with it).

    python benchmarks/bench_wait_policy.py [--rounds 2]

Each setting runs in a fresh process (OpenMP reads its variables once, when torch loads), the settings of a round
in a shuffled order; each figure is the median step time of a process, the rounds' figures side by side.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import random
import statistics
import subprocess
import sys
import time

STEP = """
import statistics, sys, time, torch
import minidape as md
torch.set_num_threads(int(sys.argv[1]))
torch.manual_seed(0)
model = md.GPT(md.GPTConfig(n_layer=2, n_head=4, n_embd=64, block_size=128, pe="kerple_log"))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randint(256, (16, 128)), torch.randint(256, (16, 128))
times = []
for step in range(25):
    start = time.perf_counter()
    _, loss = model(x, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    times.append(time.perf_counter() - start)
print(statistics.median(times[5:]) * 1000)
"""
# (label, threads, OMP_WAIT_POLICY, GOMP_SPINCOUNT); None: unset (GNU OpenMP's default spin)
SETTINGS = [
    ("1 thread", 1, "PASSIVE", None),
    ("2, sleep (PASSIVE)", 2, "PASSIVE", None),
    ("2, spin 1e2", 2, None, "100"),
    ("2, spin 1e3", 2, None, "1000"),
    ("2, spin 1e4", 2, None, "10000"),
    ("2, spin 1e5", 2, None, "100000"),
    ("2, spin (default)", 2, None, None),
]


def step_ms(threads: int, policy: str | None, spin: str | None) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
    env.update({"OMP_WAIT_POLICY": policy} if policy else {})
    env.update({"GOMP_SPINCOUNT": spin} if spin else {})
    # torch first, then minidape: the variables above stand (minidape sets PASSIVE only before torch loads)
    code = "import torch\n" + STEP
    done = subprocess.run([sys.executable, "-c", code, str(threads)], env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(done.stderr[-2000:])
    return float(done.stdout)


def busy(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            return next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    results = {(condition, label): [] for condition in ("idle", "loaded") for label, *_ in SETTINGS}
    for condition in ("idle", "loaded"):
        load = []
        if condition == "loaded":  # bounded in time: the processes end by themselves even if this one is killed
            load = [multiprocessing.Process(target=busy, args=(900,), daemon=True) for _ in range(2 * cores)]
            for process in load:
                process.start()
        try:
            for _ in range(args.rounds):
                for label, threads, policy, spin in random.sample(SETTINGS, len(SETTINGS)):
                    results[condition, label].append(step_ms(threads, policy, spin))
        finally:
            for process in load:
                process.terminate()
    title = f"Wait policy: demo model's training step, {cpu_name()} ({cores} cores), ms per step, one figure per round"
    print(f"**{title}**\n")
    print("| setting | idle | loaded (2 busy processes per core) |\n|---|---|---|")
    for label, *_ in SETTINGS:
        idle, loaded = (" / ".join(f"{ms:.1f}" for ms in results[c, label]) for c in ("idle", "loaded"))
        print(f"| {label} | {idle} | {loaded} |")
    best = {c: min(statistics.median(results[c, label]) for label, *_ in SETTINGS) for c in ("idle", "loaded")}
    print(f"\nbest median: idle {best['idle']:.1f} ms, loaded {best['loaded']:.1f} ms")


if __name__ == "__main__":
    main()
