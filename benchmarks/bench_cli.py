"""How long the command line takes to answer `--help` (the banner's, bench's) and to refuse a mistake (train's own
rule of `--block-size`, a per-layer `--pe` longer than `--n-layer`, an unknown `@` option: GPTConfig's rules; the
same per-layer mistake in compare's model, bench's `--bias-table` on the CPU, a notebook or a checkpoint that is not
there), this
checkout against another one (by default none; e.g. `--before /path/to/older/checkout`), each command line a fresh
process, the checkouts interleaved in every round so that both meet the same load.

    python benchmarks/bench_cli.py [--rounds 5] [--before CHECKOUT]

Prints a markdown table (median and range of the wall time per command line and checkout, and the ratio of the
medians) with the CPU, the cores and the load average before and after. A warm start: the first round's files are
in the page cache for the rounds after it (a cold start, the first after a reboot, also reads torch's 1 GB from
disk when torch is imported).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
COMMAND_LINES = (
    ["--help"],
    ["bench", "--help"],
    ["train", "--block-size", "1", "--out", "unused"],
    ["train", "--n-layer", "2", "--pe", "rope,none,alibi", "--out", "unused"],
    ["train", "--pe", "rope@window=64", "--out", "unused"],
    ["compare", "--pe", "rope,none,alibi", "--n-layer", "2"],
    ["bench", "--bias-table", "--device", "cpu"],
    ["grade", "no/such/notebook.ipynb"],
    ["eval", "no/such/checkpoint.pt"],
)


def answer_time(checkout: Path, argv: list[str]) -> float:
    """Seconds from start to exit of `python -m minidape ARGV` run from `checkout`'s package."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "minidape", *argv], env=env, capture_output=True, cwd=checkout, check=False)
    return time.perf_counter() - start


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--before", type=Path, help="another checkout to time in the same rounds")
    args = parser.parse_args()
    checkouts = {"this checkout": HERE} | ({"before": args.before.resolve()} if args.before else {})
    load_before = os.getloadavg()
    times = {(name, " ".join(argv)): [] for name in checkouts for argv in COMMAND_LINES}
    for _ in range(args.rounds):
        for argv in COMMAND_LINES:
            for name, checkout in checkouts.items():
                times[name, " ".join(argv)].append(answer_time(checkout, argv))
    load_after = os.getloadavg()
    print(f"{cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}, {args.rounds} rounds")
    print(f"load average (1, 5, 15 min) before {load_before}, after {load_after}\n")
    print("| command line | checkout | median s | range s | median / this checkout's |")
    print("|---|---|---:|---:|---:|")
    for (name, command), seconds in times.items():
        median = statistics.median(seconds)
        ratio = median / statistics.median(times["this checkout", command])
        print(
            f"| `python -m minidape {command}` | {name} | {median:.2f} | {min(seconds):.2f}–{max(seconds):.2f} "
            f"| {ratio:.1f} |"
        )


if __name__ == "__main__":
    main()
