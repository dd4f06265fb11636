"""minidape's training step against a plain nanoGPT-style model of the same shape, for every encoding, in one process.

    python benchmarks/bench_nanogpt.py                      # demo shape and the README's 4 x 128, this checkout only
    git worktree add --detach /tmp/before 39321ad
    python benchmarks/bench_nanogpt.py --before /tmp/before # the same, with that commit's minidape beside it
    python benchmarks/bench_nanogpt.py --steps 5 --shapes demo   # a quick look

The plain model (``PlainGPT`` below, ~60 lines) is GPT-2 as nanoGPT writes it: learned positions, causal SDPA,
pre-norm blocks, tied embeddings, the same parameter count as ``md.GPT(pe="learned")``. A step is what training
does: zero the gradients, forward, backward, fused AdamW. On one thread (as the issue measured), every model's
steps interleaved (plain, then each encoding of this checkout, then of ``--before``), the order reversed at every
step, so drifting load hits all alike; each figure is the median step time as a multiple of the plain model's
in the same run; with ``--rounds N`` the median of the N rounds' ratios and their range. Prints a markdown table for
benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from bench_before_after import cpu_name, import_before

import minidape as after

SHAPES = {
    "demo": dict(n_layer=2, n_embd=64, n_head=4, batch=16),  # python -m minidape demo (CPU)
    "readme": dict(n_layer=4, n_embd=128, n_head=4, batch=32),
}  # GPTConfig's defaults, train's batch
T = 128
GOALS = {"learned": 1.05, "none": 1.05, "rope": 1.05, "alibi": 1.10, "kerple_log": 1.10, "t5": 1.10, "fire": 1.10}


class PlainGPT(nn.Module):
    """nanoGPT's model, trimmed: learned positions, causal SDPA, GELU MLP, weights tied."""

    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_embd: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(PlainBlock(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * n_layer) if name.endswith("c_proj.weight") else 0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))  # (batch, T, C)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class PlainBlock(nn.Module):
    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.c_attn, self.c_proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
        self.c_fc, self.mlp_proj = nn.Linear(n_embd, 4 * n_embd), nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        batch, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(batch, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (batch, nh, T, hs)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(batch, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class Trainee:
    """A model, its fused AdamW (as minidape's `train` builds it) and the step times it took."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), fused=True)
        self.seconds: list[float] = []

    def step(self, x, timed: bool) -> None:
        start = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        self.model(x, x)[1].backward()
        self.optimizer.step()
        if timed:
            self.seconds.append(time.perf_counter() - start)


def minidape_model(package, shape: dict, pe: str):
    torch.manual_seed(0)
    cfg = package.GPTConfig(
        vocab_size=256, block_size=T, pe=pe, n_layer=shape["n_layer"], n_embd=shape["n_embd"], n_head=shape["n_head"]
    )
    return package.GPT(cfg)


def measure(shape: dict, packages: dict, steps: int, warmup: int) -> dict[str, float]:
    """Median step seconds of the plain model and of each (package, encoding), all interleaved."""
    torch.manual_seed(0)
    trainees = {"plain": Trainee(PlainGPT(256, T, shape["n_layer"], shape["n_embd"], shape["n_head"]))}
    for code, package in packages.items():
        for pe in GOALS:
            trainees[f"{code} {pe}"] = Trainee(minidape_model(package, shape, pe))
    x = torch.randint(0, 256, (shape["batch"], T), generator=torch.Generator().manual_seed(0))
    order = list(trainees.values())
    for i in range(warmup + steps):
        for trainee in order if i % 2 else reversed(order):
            trainee.step(x, timed=i >= warmup)
    return {label: statistics.median(trainee.seconds) for label, trainee in trainees.items()}


def table(results: dict[str, list[dict[str, float]]], codes: list[str]) -> str:
    """One row per encoding: the median over rounds of each round's ratio to the plain model (with more than one
    round, their range in brackets)."""
    rows = [
        "| shape | encoding | " + " | ".join(f"{code} × plain" for code in codes) + " | goal | met |",
        "|---|---|" + "---:|" * len(codes) + "---|---|",
    ]
    for shape, rounds in results.items():
        plain = statistics.median(medians["plain"] for medians in rounds)
        rows.append(f"| {shape} | plain SDPA GPT: {plain * 1e3:.1f} ms | " + " | " * len(codes) + " |")
        for pe, goal in GOALS.items():
            cells, verdict = [], None
            for code in codes:
                ratios = sorted(medians[f"{code} {pe}"] / medians["plain"] for medians in rounds)
                ratio = statistics.median(ratios)
                verdict = verdict or ("yes" if ratio <= goal else "no")  # the first column's
                spread = f" ({ratios[0]:.2f}–{ratios[-1]:.2f})" if len(ratios) > 1 else ""
                cells.append(f"{ratio:.2f}{spread}")
            rows.append(f"| {shape} | {pe} | " + " | ".join(cells) + f" | ≤ {goal:.2f} | {verdict} |")
    return "\n".join(rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="folder of another checkout (a git worktree) to time beside")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per model (default 30)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--rounds", type=int, default=1, help="rounds per shape, fresh models each (default 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    packages = {"after": after}
    if args.before:
        packages["before"] = import_before(args.before)
    print(
        f"CPU: {cpu_name()}; torch {torch.__version__}, 1 thread; T={T}; {args.warmup} warm-up and {args.steps} "
        f"timed steps per model, all interleaved; step = zero_grad + forward + backward + fused AdamW",
        flush=True,
    )
    results = {}
    for name in args.shapes:
        shape = SHAPES[name]
        label = f"{name}: {shape['n_layer']} x {shape['n_embd']}, {shape['n_head']} heads, batch {shape['batch']}"
        results[label] = []
        for i in range(args.rounds):
            results[label].append(measure(shape, packages, args.steps, args.warmup))
            print(f"measured {label}, round {i + 1} of {args.rounds}", flush=True)
    print(table(results, list(packages)))


if __name__ == "__main__":
    main()
