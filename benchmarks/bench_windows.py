"""The cost of an attention window: forward + backward time of a sliding-window RoPE layer against full attention.

    python benchmarks/bench_windows.py                      # window 64, T = 256 ... 4096, one sequence
    python benchmarks/bench_windows.py --window 32 --lengths 256 1024 --rounds 1

One layer (64 wide, 4 heads), RoPE, batch 1, the fast path; full attention (``pe="rope"``, PyTorch's fused kernel)
and the same layer with ``pe="rope@sliding=W"`` (``fast.windowed_attention``: blocks of W query rows against at
most 2W keys). Steps of the two are interleaved, the order reversed at every step, so drifting machine load hits
both alike. Printed per length: each one's median time and the window's time per token relative to its time per
token at the first length (flat when the cost grows with T W, not T^2), and the full model's the same way.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from bench_before_after import cpu_name

import minidape as md


def stepper(pe: str, T: int):
    torch.manual_seed(0)
    model = md.GPT(md.GPTConfig(vocab_size=256, n_layer=1, n_head=4, n_embd=64, block_size=T, pe=pe))
    idx = torch.randint(0, 256, (1, T))

    def step():
        start = time.perf_counter()
        model(idx, idx)[1].backward()
        return time.perf_counter() - start

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    parser.add_argument("--rounds", type=int, default=5, help="timed steps of each model per length")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{cpu_name()}, 1 thread, window {args.window}, batch 1, forward + backward of one layer")
    print("| T | full (ms) | window (ms) | window / full | full per token vs first T | window per token vs first T |")
    print("|---:|---:|---:|---:|---:|---:|")
    first = None
    for T in args.lengths:
        steps = {"full": stepper("rope", T), "window": stepper(f"rope@sliding={args.window}", T)}
        for step in steps.values():
            step()  # warm-up
        times = {name: [] for name in steps}
        for round_ in range(args.rounds):
            for name in sorted(steps, reverse=bool(round_ % 2)):
                times[name].append(steps[name]())
        full, window = (statistics.median(times[name]) * 1e3 for name in ("full", "window"))
        first = first or (full / T, window / T)
        print(
            f"| {T} | {full:.2f} | {window:.2f} | {window / full:.2f} | "
            f"{full / T / first[0]:.2f} | {window / T / first[1]:.2f} |"
        )


if __name__ == "__main__":
    main()
