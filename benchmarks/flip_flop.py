"""PaTH's state-tracking argument, briefly: a flip-flop task (Liu et al. 2023) at a CPU budget.

    python benchmarks/flip_flop.py                       # path, rope, none; 300 steps; T = 64, tested at 64 and 256
    python benchmarks/flip_flop.py --pes path rope --steps 100

Each token is an instruction: write 0, write 1, ignore 0, ignore 1 (with a bit the model must not store) or read;
at each read the model predicts the bit of the latest write (targets elsewhere are ignored). Writes are sparse
(10 %), reads 20 %, so the answer sits at a data-dependent distance. Printed: accuracy at the reads at the training
length and at 4x, one seed per model.
"""

from __future__ import annotations

import argparse
import time

import torch

import minidape as md

WRITE0, WRITE1, IGNORE0, IGNORE1, READ = range(5)


def flip_flop(batch: int, T: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    kind = torch.multinomial(torch.tensor([0.1, 0.7, 0.2]), batch * T, replacement=True, generator=generator)
    kind = kind.view(batch, T)  # 0 write, 1 ignore, 2 read
    kind[:, 0] = 0  # the first token writes
    bits = torch.randint(0, 2, (batch, T), generator=generator)
    idx = torch.where(kind == 0, WRITE0 + bits, torch.where(kind == 1, IGNORE0 + bits, READ))
    written = torch.where(kind == 0, bits, -1)
    positions = torch.arange(T).expand(batch, T)
    last_write = torch.where(kind == 0, positions, 0).cummax(dim=1).values
    answer = written.gather(1, last_write)
    targets = torch.where(kind == 2, answer, -1)  # the bit as token id 0 or 1
    return idx, targets


def accuracy(model, T: int, generator) -> float:
    idx, targets = flip_flop(64, T, generator)
    with torch.no_grad():
        predicted = model(idx)[0].argmax(-1)
    reads = targets >= 0
    return (predicted[reads] == targets[reads]).float().mean().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pes", nargs="+", default=["path", "rope", "none"])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--length", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| pe | reads right at T (train) | at 4T | training time |")
    print("|---|---:|---:|---:|")
    for pe in args.pes:
        torch.manual_seed(0)
        cfg = md.GPTConfig(vocab_size=5, n_layer=2, n_head=2, n_embd=32, block_size=args.length, pe=pe)
        model = md.GPT(cfg)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        generator = torch.Generator().manual_seed(0)
        start = time.perf_counter()
        for _ in range(args.steps):
            idx, targets = flip_flop(32, args.length, generator)
            loss = model(idx, targets)[1]
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        seconds = time.perf_counter() - start
        model.eval()
        test = torch.Generator().manual_seed(1)
        short, long = accuracy(model, args.length, test), accuracy(model, 4 * args.length, test)
        print(f"| {pe} | {short:.3f} | {long:.3f} | {seconds:.0f} s |")


if __name__ == "__main__":
    main()
