"""The cost of positions that read the data: training-step time of each new encoding against ALiBi, in one process.

    python benchmarks/bench_new_encodings.py                    # the demo's shape: 2 layers x 64, T=128, batch 8
    python benchmarks/bench_new_encodings.py --rounds 1 --steps 4

For each model and ALiBi (same shape, same batch), training steps (forward + backward + AdamW) are interleaved, the
order reversed at every step, so drifting machine load hits both alike. Each figure is the median over rounds of the
per-round median ratio model / ALiBi, the range over rounds in brackets.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from bench_before_after import cpu_name

import minidape as md

MODELS = {
    "FoX": dict(pe="fox"),
    "DAPE-FoX": dict(pe="fox", refiner="dape"),
    "CoPE": dict(pe="cope"),
    "RoPE/NoPE hybrid": dict(pe="rope,none", temperature="learned"),
    "rope_pi": dict(pe="rope_pi"),
    "rope_ntk": dict(pe="rope_ntk"),
    "xpos": dict(pe="xpos"),
    "hope": dict(pe="hope"),
    "Kerple-log": dict(pe="kerple_log"),
    "DAPE-Kerple": dict(pe="kerple_log", refiner="dape"),
}


def trainer(T: int, **overrides):
    torch.manual_seed(0)
    model = md.GPT(md.GPTConfig(vocab_size=256, n_layer=2, n_head=4, n_embd=64, block_size=T, **overrides))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(idx):
        start = time.perf_counter()
        _, loss = model(idx, idx)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return time.perf_counter() - start

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round")
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"# step time against ALiBi: 2 layers x 64 wide, 4 heads, T={args.length}, batch {args.batch}, "
        f"{cpu_name()}, 1 thread, torch {torch.__version__}"
    )
    print("| model | step time / ALiBi's | ALiBi's step (ms) |\n|---|---|---|")
    idx = torch.randint(0, 256, (args.batch, args.length), generator=torch.Generator().manual_seed(0))
    for name, overrides in MODELS.items():
        model, alibi = trainer(args.length, **overrides), trainer(args.length, pe="alibi")
        for _ in range(2):  # warm-up
            model(idx), alibi(idx)
        ratios, alibi_times = [], []
        for _ in range(args.rounds):
            per_step = []
            for step in range(args.steps):
                pair = (model, alibi) if step % 2 == 0 else (alibi, model)
                times = dict(zip(pair, (run(idx) for run in pair)))
                per_step.append(times[model] / times[alibi])
                alibi_times.append(times[alibi])
            ratios.append(statistics.median(per_step))
        print(
            f"| {name} | {statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}] | "
            f"{1000 * statistics.median(alibi_times):.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
