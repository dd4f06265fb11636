"""`python -m minidape demo` (`make demo`): seven of the study's models trained at length 128 on one corpus and
evaluated up to 16x that length with the `last_k` protocol; a table and a plot in a few minutes on a CPU.

The models are the study's (`MODELS`, same labels and configs) and the budget is one of its `Budget`s with
more steps and windows, so a model here is the study's model of that name, trained once with one seed.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import torch

from ..lab.checkpoints import CHECKPOINT_NAME, read_checkpoint
from ..lab.data import load_corpus
from ..lab.evaluate import perplexity_by_length
from ..lab.plots import write_extrapolation
from ..lab.train import train
from ..threads import api_entry
from ..utils import RESULT_FILES, folder_lock, quick_mode, refuse_to_replace, resolve_device
from .budgets import BUDGETS, Budget, eval_lengths, lm_config, resolve_budget
from .claims import MODELS

# Labels of `MODELS`: the positional encodings the papers start from, then the two refiners on Kerple-log (DAPE's
# MLP across heads and DAPE-V2's 1x3 convolution).
DEMO_MODELS = ("NoPE", "RoPE", "ALiBi", "Kerple-log", "FIRE", "DAPE-Kerple", "DAPE1x3-Kerple")

# CPU: about half a minute of training per model on 2 cores, so the 7 models and their evaluation fit in 10 min.
# 32 windows: last_k scores the same 32 x 128 = 4,096 tokens at every length (128 x 1, 2, 4, 8, 16).
CPU_BUDGET = dataclasses.replace(BUDGETS["default"], steps=500, batch_size=16, eval_windows=32)
# CUDA: the study's CUDA model (4 layers x 256), longer training, evaluation to 64x (8192 tokens).
CUDA_BUDGET = dataclasses.replace(
    resolve_budget("default", torch.device("cuda")), steps=4000, batch_size=64, eval_windows=32
)
# MINIDAPE_QUICK=1 (tests, CI): the same code paths with a token budget.
QUICK_BUDGET = dataclasses.replace(CPU_BUDGET, steps=4, batch_size=4, eval_windows=2)


def demo_budget(device: torch.device) -> Budget:
    if quick_mode():
        return QUICK_BUDGET
    return CUDA_BUDGET if device.type == "cuda" else CPU_BUDGET


@api_entry
def run_demo(
    corpus: str = "austen",
    out="runs/demo",
    steps: int | None = None,
    seed: int = 0,
    device: str | torch.device = "auto",
    overwrite: bool = False,
) -> dict[str, dict[int, float]]:
    """Train and evaluate `DEMO_MODELS`; write ``out/results.md``, ``results.json``, ``extrapolation.png`` and a
    checkpoint per model (``out/LABEL/checkpoint.pt``). An ``out`` holding a finished demo (its results) is
    refused unless ``overwrite``; an interrupted one is resumed: the models it finished are kept (`train`
    refuses one of another config, seed or corpus), the others trained. Returns ``{label: {length: perplexity}}``."""
    device = resolve_device(device)
    budget = demo_budget(device)
    steps = steps or budget.steps
    out = refuse_to_replace(out, RESULT_FILES, overwrite)
    with folder_lock(out):
        for label in DEMO_MODELS:
            done = out / label / CHECKPOINT_NAME
            if not overwrite and done.exists() and read_checkpoint(done)["step"] != steps:
                raise ValueError(
                    f"--out {str(out)!r} holds an interrupted demo whose {label} was trained "
                    f"{read_checkpoint(done)['step']} steps, not {steps}; run it with the same --steps "
                    f"to resume it, or pass --overwrite to start over"
                )
        return _demo_into(out, corpus, budget, steps, seed, device, overwrite)


def _demo_into(
    out: Path, corpus: str, budget: Budget, steps: int, seed: int, device: torch.device, overwrite: bool
) -> dict[str, dict[int, float]]:
    val_tokens = load_corpus(corpus, "val")
    train_length = budget.train_lengths[0]
    lengths = eval_lengths(budget, train_length)
    scored = min(budget.last_k, train_length)
    what_is_scored = (
        f"last_k: the same {budget.eval_windows} x {scored} = {budget.eval_windows * scored} tokens "
        f"scored at every length, only their context grows"
    )
    quick = " in quick mode (MINIDAPE_QUICK=1)" if quick_mode() else ""
    print(
        f"minidape demo on {device}{quick}: {len(DEMO_MODELS)} models, {budget.n_layer} layers x {budget.n_embd} "
        f"wide, {steps} steps of {budget.batch_size} x {train_length} tokens each, evaluated at "
        f"{', '.join(map(str, lengths))} ({what_is_scored})"
    )
    results, seconds, started = {}, {}, time.perf_counter()
    for label in DEMO_MODELS:
        clock = time.perf_counter()
        earlier = not overwrite and (out / label / CHECKPOINT_NAME).exists()  # a model of an interrupted demo
        model, _ = train(
            lm_config(budget, train_length, MODELS[label]),
            corpus,
            steps=steps,
            batch_size=budget.batch_size,
            lr=budget.lr,
            device=device,
            seed=seed,
            out=out / label,
            overwrite=overwrite,
            resume=earlier,
            eval_every=steps,
            progress=not earlier,
        )
        results[label] = perplexity_by_length(
            model,
            val_tokens,
            lengths,
            last_k=budget.last_k,
            protocol="last_k",
            n_windows=budget.eval_windows,
            seed=seed,
        )
        seconds[label] = round(time.perf_counter() - clock, 1)
        print(
            f"{label}: {'trained earlier, evaluated in ' if earlier else ''}{seconds[label]:.0f} s, perplexity "
            + ", ".join(f"{length}: {ppl:.2f}" for length, ppl in results[label].items()),
            flush=True,
        )
    details = {
        "corpus": corpus,
        "device": str(device),
        "steps": steps,
        "batch_size": budget.batch_size,
        "model": f"{budget.n_layer} layers, n_embd {budget.n_embd}, {budget.n_head} heads",
        "protocol": what_is_scored,
        "windows per length": budget.eval_windows,
        "seed": seed,
        "quick mode": quick_mode(),
        "wall time (s)": round(time.perf_counter() - started, 1),
        "seconds per model": seconds,
    }
    table = write_extrapolation(out, results, train_length, f"minidape demo: trained at {train_length} tokens", details)
    print()
    print(table)
    print(
        f"wrote {out / 'results.md'}, {out / 'results.json'} and {out / 'extrapolation.png'} "
        f"in {details['wall time (s)']:.0f} s"
    )
    return results
