"""Speed and memory of the refiners against their base PE and against their reference (paper) form.

    python -m minidape bench              # the tables of benchmarks/RESULTS.md (CPU: ~10 min on 2 cores)
    python -m minidape bench --quick      # fewer repeats and lengths
    python -m minidape bench --size 125m --device cuda   # the papers' 125M model on a GPU
    python -m minidape bench --device cuda --cape-table  # only the comparison with CAPE's Table 1
    python benchmarks/bench_refiners.py [same flags]      # the same, from a clone of the repository
    python -m minidape bench --threads                    # the thread benchmark (see thread_benchmark)

Timing: warm-up steps, then the variants of one table run interleaved (A, B, C, A, B, C, ...) in the same
process, and each reports its median, so drifting machine load hits every variant alike. A step is
forward + backward of the language-model loss (no optimizer). With `--rounds R` each table is timed in R fresh
processes: a ratio moves between processes by more than within one (memory placement differs), so the table
gives the median ratio of the rounds and their range. Peak memory is measured in a fresh process per case:
peak RSS from `resource` on CPU, `torch.cuda.max_memory_allocated` on CUDA.

**Against CAPE's Table 1** (every run; alone with `--cape-table`): forward and backward timed apart for the base
PE, DAPE and conv at T=512 with a batch of 32 (the table's setting), bf16 autocast on CUDA as in training, tokens/s
and peak memory, and DAPE's and conv's ratios to the base PE beside the table's 2.46x forward and 2.19x backward
(CAPE-Kerple, D_CAPE = 32, against Kerple). On CUDA without `--size` both the tiny and the papers' 125M model.

`dape (reference)` is the same model with `GPTConfig(fast=False)`: minidape/model.py's paper form (stack [S, B]
on the head axis, the MLP over it channels last, over the full (batch, h, T, T) scores, plain autograd), so the
table shows what the fast path (minidape/fast.py) buys.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..model import GPT, PE_REGISTRY, REFINER_REGISTRY, AdditiveBias, GPTConfig
from ..threads import (
    THREADS_VARIABLE,
    WAIT_VARIABLES,
    allowed_cores,
    choose_threads,
    use_threads,
)
from ..utils import resolve_device
from .user_code import import_file, source_file

# CAPE (Zheng et al., NeurIPS 2024), Table 1: ms per step at length 512, batch 32, D_CAPE = 32 (their GPU).
CAPE_TABLE_1 = {
    "Kerple": {"forward": 54.17, "backward": 145.95},
    "CAPE-Kerple": {"forward": 133.36, "backward": 320.44},
}
# The goal on a GPU: a DAPE training step within this multiple of its base PE's.
GPU_GOAL = 1.3

SIZES = {  # the issue's default tiny model, and the papers' 125M configuration
    "tiny": dict(n_layer=4, n_head=4, n_embd=128),
    "125m": dict(n_layer=12, n_head=12, n_embd=768),
}


class PlainRoPEGPT(nn.Module):
    """A plain GPT of the same size for the fast-path check: RoPE written inline, causal SDPA, nothing else."""

    def __init__(self, vocab_size, n_layer, n_head, n_embd, base=10000.0):
        super().__init__()
        self.n_head = n_head
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.layers = nn.ModuleList(
            nn.ModuleDict(
                dict(
                    ln_1=nn.LayerNorm(n_embd),
                    qkv=nn.Linear(n_embd, 3 * n_embd),
                    proj=nn.Linear(n_embd, n_embd),
                    ln_2=nn.LayerNorm(n_embd),
                    fc=nn.Linear(n_embd, 4 * n_embd),
                    out=nn.Linear(4 * n_embd, n_embd),
                )
            )
            for _ in range(n_layer)
        )
        self.ln_f = nn.LayerNorm(n_embd)
        hs = n_embd // n_head
        self.register_buffer("inv_freq", base ** (-torch.arange(0, hs, 2).float() / hs), persistent=False)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx)
        angles = torch.arange(T, device=idx.device)[:, None] * self.inv_freq
        cos, sin = angles.cos(), angles.sin()

        def rotate(t):
            t1, t2 = t.chunk(2, dim=-1)
            return torch.cat([t1 * cos - t2 * sin, t1 * sin + t2 * cos], dim=-1)

        for layer in self.layers:
            q, k, v = layer.qkv(layer.ln_1(x)).view(B, T, 3, self.n_head, -1).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(rotate(q), rotate(k), v, is_causal=True)
            x = x + layer.proj(y.transpose(1, 2).reshape(B, T, -1))
            x = x + layer.out(F.gelu(layer.fc(layer.ln_2(x))))
        logits = self.ln_f(x) @ self.wte.weight.t()
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def build(size: str, pe: str, refiner: str, T: int, device, plain: bool = False, fast: bool = True):
    """md.GPT (its fast path, or with ``fast=False`` its reference form), or with ``plain`` the plain RoPE GPT."""
    dims = SIZES[size]
    if plain:
        return PlainRoPEGPT(256, **dims).to(device)
    cfg = GPTConfig(vocab_size=256, block_size=T, pe=pe, refiner=refiner, fast=fast, **dims)
    return GPT(cfg).to(device)


def train_step(model, x, y):
    model.zero_grad(set_to_none=True)
    _, loss = model(x, y)
    loss.backward()


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def precision(device, autocast: bool):
    """bf16 autocast on CUDA when asked (as `train` does there), else full precision."""
    if autocast and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def time_phases(
    cases: dict, T: int, B: int, size: str, device, repeats: int, warmup: int = 2, autocast: bool = False
) -> dict[str, dict[str, float]]:
    """Median seconds of the forward pass, the backward pass and the whole training step of each case
    ({label: (pe, refiner, plain[, fast])}), the cases run interleaved."""
    torch.manual_seed(0)
    models = {label: build(size, pe, refiner, T, device, *flags) for label, (pe, refiner, *flags) in cases.items()}
    x = torch.randint(0, 256, (B, T), device=device)
    y = torch.randint(0, 256, (B, T), device=device)
    times = {label: {"forward": [], "backward": [], "step": []} for label in models}
    for i in range(warmup + repeats):
        for label, model in models.items():
            model.zero_grad(set_to_none=True)
            synchronize(device)
            start = time.perf_counter()
            with precision(device, autocast):
                _, loss = model(x, y)
            synchronize(device)
            middle = time.perf_counter()
            loss.backward()
            synchronize(device)
            if i >= warmup:
                end = time.perf_counter()
                for phase, seconds in (("forward", middle - start), ("backward", end - middle), ("step", end - start)):
                    times[label][phase].append(seconds)
    return {label: {phase: statistics.median(t) for phase, t in phases.items()} for label, phases in times.items()}


def time_interleaved(
    cases: dict, T: int, B: int, size: str, device, repeats: int, warmup: int = 2, autocast: bool = False
) -> dict[str, float]:
    """Median seconds per training step of each case, run interleaved (see ``time_phases``)."""
    phases = time_phases(cases, T, B, size, device, repeats, warmup, autocast)
    return {label: medians["step"] for label, medians in phases.items()}


def rss_mb(field: str) -> float:
    """Current (VmRSS) or peak (VmHWM) resident memory of this process from /proc; else ru_maxrss (peak).
    /proc is preferred: ru_maxrss survives exec, so a child would inherit its parent's peak."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2**20 if sys.platform == "darwin" else 1024)


def timing_child(spec: dict) -> dict:
    """Time one table in this (fresh) process: its medians in seconds per step."""
    device = torch.device(spec["device"])
    cases = {label: tuple(case) for label, case in spec["cases"].items()}
    return time_interleaved(
        cases, spec["T"], spec["B"], spec["size"], device, spec["repeats"], autocast=spec["autocast"]
    )


def peak_memory_child(spec: dict) -> dict:
    """Run one case in this (fresh) process and report its peak memory in MB."""
    device = torch.device(spec["device"])
    torch.manual_seed(0)
    model = build(spec["size"], spec["pe"], spec["refiner"], spec["block_size"], device, fast=spec["fast"])
    x = torch.randint(0, 256, (spec["batch"], spec["T"]), device=device)
    before = rss_mb("VmRSS")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    with precision(device, spec.get("autocast", False)):
        if spec["train"]:
            train_step(model, x, x)
        else:
            model.eval()
            with torch.no_grad():
                model(x)
    synchronize(device)
    seconds = time.perf_counter() - start
    peak = rss_mb("VmHWM")
    result = {"peak_rss_mb": peak, "before_mb": before, "seconds": seconds}
    if device.type == "cuda":
        result["cuda_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return result


# ----------------------------------------------------------------------------------------------------
# Threads: the default choice (minidape.threads) against fixed choices, idle and under a load


DEMO_SHAPE = dict(n_layer=2, n_embd=64, n_head=4, block_size=128, pe="kerple_log")  # the demo's CPU model
DEMO_BATCH = 16
THREAD_GOAL = 1.15  # the default's step time within this multiple of the best fixed choice's


def threads_child(spec: dict) -> dict:
    """In this (fresh) process: the demo model's training step (forward, backward, fused AdamW) with each
    thread count of ``spec["variants"]`` ({label: threads, "default": None}), interleaved, each timed step after
    an untimed one where the count changed; median seconds and the thread count of each. Rounds stop after
    ``spec["seconds"]`` once 3 are timed (a spinning pool under load takes seconds a step)."""
    T, batch = DEMO_SHAPE["block_size"], DEMO_BATCH
    counts = {
        label: n if n is not None else choose_threads(work=batch * T * DEMO_SHAPE["n_embd"]).threads
        for label, n in spec["variants"].items()
    }
    torch.manual_seed(0)
    model = GPT(GPTConfig(**DEMO_SHAPE))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    x = torch.randint(0, 256, (batch, T))

    def step():
        optimizer.zero_grad(set_to_none=True)
        model(x, x)[1].backward()
        optimizer.step()

    times = {label: [] for label in counts}
    began = time.perf_counter()
    for i in range(spec["warmup"] + spec["repeats"]):
        if i >= spec["warmup"] + 3 and time.perf_counter() - began > spec["seconds"]:
            break
        for label, threads in counts.items():
            if threads != torch.get_num_threads():
                # a new count resizes OpenMP's pool in the next step: untimed, else the column after a change
                # pays for it (the default and the fixed column with its count measured 1.15x apart)
                torch.set_num_threads(threads)
                step()
            start = time.perf_counter()
            step()
            if i >= spec["warmup"]:
                times[label].append(time.perf_counter() - start)
    return {label: {"threads": counts[label], "seconds": statistics.median(t)} for label, t in times.items()}


class BackgroundLoad:
    """``per_core`` busy processes per allowed core, each ending by itself after ``seconds`` (and stopped on
    leaving the ``with``): the other users of a shared machine."""

    def __init__(self, per_core: int = 2, seconds: float = 600.0):
        self.count, self.seconds, self.processes = per_core * allowed_cores(), seconds, []

    def __enter__(self):
        spin = f"import time\nend = time.monotonic() + {self.seconds}\nwhile time.monotonic() < end: pass"
        self.processes = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(self.count)]
        time.sleep(1.0)  # running before the first measurement
        return self

    def __exit__(self, *exc):
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            process.wait()


def thread_benchmark(repeats: int, rounds: int = 1, load_seconds: float = 600.0) -> str:
    """The demo model's training step with minidape's default thread count against 1 thread and against all
    allowed cores, idle and under ``BackgroundLoad``; each in a process where minidape loads torch (idle OpenMP
    threads spin briefly, then sleep: ``threads.short_waits``) and in one where torch loads first (they spin:
    what a notebook that imports torch first gets, and before minidape chose: torch's default of all cores).
    Each row is ``rounds`` fresh processes, one after the other, their columns interleaved; a row gives the
    median of the rounds' step times, and the median (and range) of the rounds' ratios. Returns the markdown
    table (printed as it goes)."""
    cores = allowed_cores()
    env = {
        key: value
        for key, value in os.environ.items()  # what a user's shell gives: no thread setting
        if key not in (THREADS_VARIABLE, "OMP_NUM_THREADS", "MKL_NUM_THREADS", *WAIT_VARIABLES)
    }
    variants = {"default": None, "1": 1, "all": cores}
    spec = dict(warmup=3, repeats=repeats, seconds=60, variants=variants)
    rows = [
        f"**Threads: demo model (2 layers x 64, kerple_log, T=128, batch 16), training step with AdamW, "
        f"{device_name(torch.device('cpu'))}, {cores} cores allowed** (median of up to {repeats}; each row "
        + (f"{rounds} processes, median (range) of their ratios" if rounds > 1 else "one process")
        + ", its columns interleaved)",
        "",
        "| condition | idle OpenMP threads | default (threads) | 1 thread | all cores | default × best | "
        "before × best |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    print("\n".join(rows), flush=True)
    goals = []
    for condition in ("idle", "loaded"):
        with BackgroundLoad(seconds=load_seconds) if condition == "loaded" else contextlib.nullcontext():
            results = {waiting: [] for waiting in ("short waits (minidape first)", "spin (torch first)")}
            for _ in range(rounds):
                for waiting, torch_first in zip(results, (False, True)):
                    results[waiting].append(run_child("threads", torch_first=torch_first, env=env, **spec))
        failed = [r["error"] for runs in results.values() for r in runs if "error" in r]
        if failed:
            raise RuntimeError(f"a thread timing failed: {failed[0]}")
        # before: torch's default, all cores, waiting threads spinning
        befores = [run["all"]["seconds"] for run in results["spin (torch first)"]]
        for waiting, runs in results.items():
            seconds = {label: statistics.median(run[label]["seconds"] for run in runs) for label in variants}
            best = [min(run["1"]["seconds"], run["all"]["seconds"]) for run in runs]
            ratios = [run["default"]["seconds"] / b for run, b in zip(runs, best)]
            ratio = statistics.median(ratios)
            spread = f" ({min(ratios):.2f}–{max(ratios):.2f})" if rounds > 1 else ""
            chosen = "/".join(sorted({str(run["default"]["threads"]) for run in runs}))
            if waiting.startswith("short"):
                goals.append(f"{condition}: {ratio:.2f}× ({'met' if ratio <= THREAD_GOAL else 'not met'})")
            rows.append(
                f"| {condition} | {waiting} | {seconds['default'] * 1e3:.1f} ms ({chosen}) | "
                f"{seconds['1'] * 1e3:.1f} ms | {seconds['all'] * 1e3:.1f} ms ({cores}) | {ratio:.2f}{spread} | "
                f"{statistics.median(before / b for before, b in zip(befores, best)):.2f} |"
            )
            print(rows[-1], flush=True)
    rows += [
        "",
        f"goal: minidape's default (short waits) within {THREAD_GOAL}× of the best fixed choice; " + "; ".join(goals),
    ]
    print(rows[-1], flush=True)
    return "\n".join(rows)


def user_files() -> list[str]:
    """The files of the users' registered encodings and refiners (``--import``), for a child process to load."""
    classes = [*PE_REGISTRY.values(), *REFINER_REGISTRY.values()]
    return sorted({path for path in map(source_file, classes) if path is not None})


def run_child(kind: str, torch_first: bool = False, env: dict | None = None, **spec) -> dict:
    """Run ``kind`` ("timing", "memory" or "threads") in a fresh Python process; its result, or {"error": ...}.
    With ``torch_first`` the child loads torch before minidape, so OpenMP keeps its own wait policy (as before
    minidape set one, see ``minidape.threads``)."""
    spec.update(kind=kind, threads=torch.get_num_threads(), imports=user_files())
    start = (
        ["-c", "import sys, torch; from minidape.lab.bench import main; main(sys.argv[1:])"]
        if torch_first
        else ["-m", "minidape.lab.bench"]
    )
    out = subprocess.run([sys.executable, *start, "--child", json.dumps(spec)], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def timed_rounds(
    cases: dict, T: int, B: int, size: str, device, repeats: int, rounds: int, autocast: bool = False
) -> list[dict[str, float]]:
    """The medians of ``rounds`` timings of one table: in this process for one round, else one fresh process each."""
    if rounds == 1:
        return [time_interleaved(cases, T, B, size, device, repeats, autocast=autocast)]
    results = [
        run_child("timing", cases=cases, T=T, B=B, size=size, device=str(device), repeats=repeats, autocast=autocast)
        for _ in range(rounds)
    ]
    failed = [r["error"] for r in results if "error" in r]
    if failed:
        raise RuntimeError(f"a timing round failed: {failed[0]}")
    return results


def ratio_table(title: str, rounds: list[dict[str, float]], base: str, tokens: int) -> str:
    """Median step time over the rounds, and the median (range) of each round's ratio to ``base``."""
    spread = len(rounds) > 1
    rows = [
        f"**{title}**" + (f" ({len(rounds)} rounds)" if spread else ""),
        "",
        "| variant | ms / step | tokens/s | × " + base + (" (range)" if spread else "") + " |",
        "|---|---:|---:|---:|",
    ]
    for label in rounds[0]:
        seconds = statistics.median(r[label] for r in rounds)
        ratios = [r[label] / r[base] for r in rounds]
        ratio = f"{statistics.median(ratios):.2f}" + (f" ({min(ratios):.2f}–{max(ratios):.2f})" if spread else "")
        rows.append(f"| {label} | {seconds * 1e3:.1f} | {tokens / seconds:,.0f} | {ratio} |")
    return "\n".join(rows)


def memory_row(label: str, result: dict) -> str:
    if "error" in result:
        return f"| {label} | — | — | — | {result['error']} |"
    cuda = f"{result['cuda_peak_mb']:,.0f}" if "cuda_peak_mb" in result else "—"
    return (
        f"| {label} | {result['peak_rss_mb']:,.0f} | {result['peak_rss_mb'] - result['before_mb']:,.0f} | "
        f"{cuda} | {result['seconds']:.1f} s |"
    )


def cape_table(size: str, pe: str, T: int, B: int, device, repeats: int, memory: bool = True) -> str:
    """Base PE, DAPE and conv at CAPE's Table 1 setting: forward and backward ms, tokens/s, peak memory, and the
    ratios to the base PE beside the table's (CAPE-Kerple against Kerple)."""
    autocast = device.type == "cuda"
    cases = {label: (pe, refiner, False) for label, refiner in (("none", "none"), ("dape", "dape"), ("conv", "conv"))}
    medians = time_phases(cases, T, B, size, device, repeats, autocast=autocast)
    peaks = {}
    if memory:  # a fresh process per case: on CUDA its max_memory_allocated, on CPU its resident-set growth
        for label, (_, refiner, _) in cases.items():
            result = run_child(
                "memory",
                size=size,
                pe=pe,
                refiner=refiner,
                block_size=T,
                T=T,
                batch=B,
                train=True,
                device=str(device),
                fast=True,
                autocast=autocast,
            )
            peaks[label] = (
                "—"
                if "error" in result
                else f"{result['cuda_peak_mb']:,.0f}"
                if autocast
                else f"{result['peak_rss_mb'] - result['before_mb']:,.0f}"
            )
    base = medians["none"]
    paper = {
        phase: CAPE_TABLE_1["CAPE-Kerple"][phase] / CAPE_TABLE_1["Kerple"][phase] for phase in ("forward", "backward")
    }
    memory_name = "CUDA peak MB" if autocast else "RSS growth MB"
    rows = [
        f"**Against CAPE's Table 1: {size} model, T={T}, B={B}, pe={pe}, "
        f"{'bf16 autocast' if autocast else 'float32'} on {device_name(device)}** (median of {repeats})",
        "",
        f"| variant | forward ms | backward ms | tokens/s | {memory_name} | forward × none | backward × none | "
        f"step × none |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, phases in medians.items():
        ratios = " | ".join(f"{phases[phase] / base[phase]:.2f}" for phase in ("forward", "backward", "step"))
        rows.append(
            f"| {label} | {phases['forward'] * 1e3:.1f} | {phases['backward'] * 1e3:.1f} | "
            f"{B * T / phases['step']:,.0f} | {peaks.get(label, '—')} | {ratios} |"
        )
    paper_step = sum(CAPE_TABLE_1["CAPE-Kerple"].values()) / sum(CAPE_TABLE_1["Kerple"].values())
    rows.append(
        f"| CAPE Table 1 (CAPE-Kerple, D=32) | | | | | {paper['forward']:.3f} | {paper['backward']:.3f} | "
        f"{paper_step:.3f} |"
    )
    dape = medians["dape"]["step"] / base["step"]
    goal = (
        f"goal on a GPU: dape ≤ {GPU_GOAL}× none per step: {'met' if dape <= GPU_GOAL else 'not met'} ({dape:.2f}×)"
        if device.type == "cuda"
        else f"(the goal, dape ≤ {GPU_GOAL}× none per step, is set for a GPU; here {dape:.2f}×)"
    )
    return "\n".join(rows + ["", goal])


def bias_pes() -> list[str]:
    """minidape's own encodings that add a bias from positions, read from the registry: a new one is measured too."""
    return [
        name
        for name, cls in PE_REGISTRY.items()
        if cls.__module__.split(".")[0] == "minidape" and issubclass(cls, AdditiveBias)
    ]


BIAS_GOAL = 1.15  # on CUDA: a bias encoding's step within this multiple of plain SDPA's without a bias


def bias_table(size: str, T: int, B: int, device, repeats: int, warmup: int = 3) -> str:
    """On CUDA: the training step (forward + backward, bf16 autocast) of each bias encoding through FlexAttention
    and through SDPA with the dense mask (``fast.FLEX_ON_CUDA`` off), against pe="none" (SDPA without a bias),
    all interleaved."""
    from .. import fast

    cases = {"none (SDPA, no bias)": ("none", False)}
    for pe in bias_pes():
        cases.update({f"{pe} (FlexAttention)": (pe, True), f"{pe} (SDPA, dense mask)": (pe, False)})
    torch.manual_seed(0)
    models = {label: build(size, pe, "none", T, device) for label, (pe, _) in cases.items()}
    x = torch.randint(0, 256, (B, T), device=device)
    times = {label: [] for label in cases}
    flex_setting = fast.FLEX_ON_CUDA
    try:
        for i in range(warmup + repeats):
            for label, model in models.items():
                fast.FLEX_ON_CUDA = cases[label][1]
                synchronize(device)
                start = time.perf_counter()
                model.zero_grad(set_to_none=True)
                with precision(device, True):
                    _, loss = model(x, x)
                loss.backward()
                synchronize(device)
                if i >= warmup:
                    times[label].append(time.perf_counter() - start)
    finally:
        fast.FLEX_ON_CUDA = flex_setting
    base = statistics.median(times["none (SDPA, no bias)"])
    rows = [
        f"**Bias encodings on {device_name(device)}: {size} model, T={T}, B={B}, bf16 autocast, training step "
        f"(fwd+bwd)** (median of {repeats}, interleaved)",
        "",
        "| variant | ms / step | × none |",
        "|---|---:|---:|",
    ]
    for label, seconds in times.items():
        rows.append(f"| {label} | {statistics.median(seconds) * 1e3:.1f} | {statistics.median(seconds) / base:.2f} |")
    worst = max(statistics.median(times[f"{pe} (FlexAttention)"]) / base for pe in bias_pes())
    rows += [
        "",
        f"goal: each bias ≤ {BIAS_GOAL}× none (FlexAttention): {'met' if worst <= BIAS_GOAL else 'not met'} "
        f"(worst {worst:.2f}×)",
    ]
    return "\n".join(rows)


def device_name(device) -> str:
    """The card's name on CUDA; the CPU's model name (from /proc/cpuinfo where there is one) otherwise."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            names = [line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")]
        return f"{names[0]} ({len(names)} cores)"
    except (OSError, IndexError):
        return str(device)


def refiner_tables(size: str, pe: str, device, repeats: int, rounds: int, eval_length: int, memory: bool) -> None:
    """The tables of RESULTS.md for one model size: step time against `none` and the reference form, RoPE against
    a plain SDPA GPT, and peak memory; each printed as it is measured."""
    sections = []
    reference = {"dape (reference)": (pe, "dape", False, False)}  # model.py's paper form, fast=False
    if size == "tiny":
        configs = [
            (T, B, {"none": (pe, "none", False), "dape": (pe, "dape", False), "conv": (pe, "conv", False), **reference})
            for T, B in ((128, 32), (512, 8))
        ]
    else:
        configs = [(512, 8, {"none": (pe, "none", False), "dape": (pe, "dape", False), **reference})]
    for T, B, cases in configs:
        timings = timed_rounds(cases, T, B, size, device, repeats, rounds, autocast=size != "tiny")
        sections.append(ratio_table(f"training step (fwd+bwd), T={T}, B={B}", timings, "none", B * T))
        print(sections[-1] + "\n", flush=True)
    T, B = (128, 32) if size == "tiny" else (512, 8)
    timings = timed_rounds(
        {"md.GPT rope": ("rope", "none", False), "plain SDPA GPT": ("rope", "none", True)},
        T,
        B,
        size,
        device,
        repeats,
        rounds,
    )
    sections.append(ratio_table(f"RoPE fast path vs a plain SDPA GPT, T={T}, B={B}", timings, "plain SDPA GPT", B * T))
    print(sections[-1] + "\n", flush=True)
    if not memory:
        return

    header = ["| case | peak RSS MB | RSS growth MB | CUDA peak MB | time |", "|---|---:|---:|---:|---:|"]
    rows = []
    for label, refiner, fast in (("none", "none", True), ("dape", "dape", True), ("dape (reference)", "dape", False)):
        result = run_child(
            "memory",
            size=size,
            pe=pe,
            refiner=refiner,
            block_size=512,
            T=512,
            batch=8,
            train=True,
            device=str(device),
            fast=fast,
        )
        rows.append(memory_row(f"train step T=512 B=8, {label}", result))
        print(rows[-1], flush=True)
    for refiner in ("none", "dape"):
        result = run_child(
            "memory",
            size=size,
            pe=pe,
            refiner=refiner,
            block_size=128,
            T=eval_length,
            batch=1,
            train=False,
            device=str(device),
            fast=True,
        )
        rows.append(memory_row(f"eval forward T={eval_length} B=1, {refiner}", result))
        print(rows[-1], flush=True)
    sections.append("\n".join(["**peak memory (fresh process per case)**", "", *header, *rows]))
    print("\n" + "\n\n".join(sections))


def main(argv: list[str] | None = None) -> None:
    """`python -m minidape.lab.bench --child SPEC`, as `run_child` starts it: one measurement of a parent benchmark,
    in this fresh process. The benchmark's command line is `python -m minidape bench` (flags in minidape.flags)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] != ["--child"] or len(argv) != 2:
        raise SystemExit(
            "python -m minidape.lab.bench runs one --child measurement; the benchmark is: python -m minidape bench"
        )
    spec = json.loads(argv[1])
    torch.set_num_threads(spec.pop("threads"))  # the parent's, so a child times what the parent would
    for path in spec.pop("imports"):  # the parent's --import files: their names register here
        import_file(path)
    child = {"timing": timing_child, "memory": peak_memory_child, "threads": threads_child}[spec.pop("kind")]
    print(json.dumps(child(spec)))


def benchmark(args: argparse.Namespace) -> None:
    """`python -m minidape bench ...`: the tables for the flags the command line read (see `minidape.flags`)."""
    repeats = 3 if args.quick else args.repeats
    if args.threads == 0:
        thread_benchmark(repeats=5 if args.quick else 2 * args.repeats, rounds=args.rounds)
        return
    use_threads(args.threads)  # the count is in each table's header
    device = resolve_device(args.device)
    if args.bias_table and device.type != "cuda":
        raise ValueError(f"--bias-table compares FlexAttention with SDPA on CUDA; the device is {device}")
    eval_length = 4096 if args.quick else args.eval_length
    sizes = args.size or (["tiny", "125m"] if device.type == "cuda" else ["tiny"])
    for size in sizes:
        print(
            f"# refiner benchmark: {size} model {SIZES[size]}, pe={args.pe}, refiner_width=32, device "
            f"{device} ({device_name(device)}, {torch.get_num_threads()} threads), torch {torch.__version__}, "
            f"median of {repeats}" + (f", {args.rounds} rounds" if args.rounds > 1 else "") + "\n",
            flush=True,
        )
        if args.bias_table or device.type == "cuda" and not args.cape_table:
            print("\n" + bias_table(size, args.length, 8, device, repeats) + "\n", flush=True)
        if args.bias_table:
            continue
        if not args.cape_table:
            refiner_tables(size, args.pe, device, repeats, args.rounds, eval_length, not args.no_memory)
        print(
            "\n" + cape_table(size, args.pe, args.length, args.batch, device, repeats, not args.no_memory) + "\n",
            flush=True,
        )


if __name__ == "__main__":
    main()
