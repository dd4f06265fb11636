"""One run of the study (a model trained and evaluated once): its result file (one JSON, atomically written),
the folder's manifest of settings, and the progress lines."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
import warnings
from pathlib import Path

import torch

from ..data import load_corpus
from ..che import train_task
from ..evaluate import perplexity_by_length
from ..model import GPTConfig
from ..train import train
from ..utils import RESULT_FILES, atomic_path, json_ready, refuse_to_replace
from .budgets import CHE_MAX_TRAIN_LENGTH, Budget, che_config, lm_config
from .claims import CHE_MODELS, LEAKY_REFINER, MODELS


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()


def write_json(path: Path, payload) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(json_ready(payload), indent=1) + "\n")


def read_json(path: Path):
    return json.loads(path.read_text())


def as_float(value) -> float:
    return math.nan if value is None else float(value)


def check_settings(out: Path, settings: dict) -> None:
    """Record `settings` in ``out/manifest.json``, or refuse when the folder holds runs made with others."""
    manifest = out / "manifest.json"
    settings = json_ready(settings)
    if manifest.is_file():
        previous = read_json(manifest)
        changed = sorted(key for key in set(previous) | set(settings) if previous.get(key) != settings.get(key))
        if changed:
            raise ValueError(f"{out} holds runs made with other settings ({', '.join(changed)} differ: "
                             f"{', '.join(f'{key}={previous.get(key)!r}' for key in changed)}); "
                             f"use another --out, or delete {out} to start again")
    else:
        write_json(manifest, settings)


def refuse_foreign_results(out, overwrite: bool) -> None:
    """A folder holding results without the study's manifest (another command's, or a user's own files) is
    not written into unless `overwrite`; an earlier compare or reproduce there (its manifest) is resumed."""
    if out is not None and not (Path(out) / "manifest.json").is_file():
        refuse_to_replace(out, RESULT_FILES, overwrite)


def check_seeds(seeds) -> int:
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 2:
        raise ValueError(f"seeds must be an integer >= 2 (a paired t-test needs two seeds at least); got {seeds!r}")
    return seeds


def train_and_evaluate(cfg: GPTConfig, corpus: str, budget: Budget, seed: int, device: torch.device,
                       steps: int | None = None, allow_leakage: bool = False) -> dict:
    """Train one language model and measure its perplexity at every evaluation length, both protocols.
    `allow_leakage`: C4's leaky refiner (checked before the study starts), or `compare(allow_leakage=True)`."""
    steps = steps or budget.steps
    started = time.perf_counter()
    with warnings.catch_warnings():    # the leak, when allowed, is named once in the report, not per run
        warnings.filterwarnings("ignore", message=".* reads the future")
        model, history = train(cfg, load_corpus(corpus, "train"), val_data=load_corpus(corpus, "val"), steps=steps,
                               batch_size=budget.batch_size, lr=budget.lr, device=device, seed=seed,
                               eval_every=steps, eval_windows=8, progress=False, allow_leakage=allow_leakage)
    train_seconds = time.perf_counter() - started
    lengths = [cfg.block_size * factor for factor in budget.eval_factors]
    val_tokens = load_corpus(corpus, "val")
    with warnings.catch_warnings():    # learned APE beyond its table: NaN, as the report says
        warnings.filterwarnings("ignore", message="length .* skipped")
        perplexity = {"last_k": perplexity_by_length(model, val_tokens, lengths, last_k=budget.last_k,
                                                     n_windows=budget.eval_windows, seed=0),
                      "nonoverlap": perplexity_by_length(model, val_tokens, lengths, protocol="nonoverlap",
                                                         n_tokens=budget.nonoverlap_tokens)}
    return {"config": dataclasses.asdict(cfg), "corpus": corpus, "seed": seed, "steps": steps,
            "final_loss": history[-1]["loss"], "val_loss": history[-1].get("val_loss"),
            "perplexity": perplexity, "train_seconds": round(train_seconds, 1),
            "eval_seconds": round(time.perf_counter() - started - train_seconds, 1)}


def che_train_and_evaluate(task: str, cfg: GPTConfig, budget: Budget, seed: int, device: torch.device) -> dict:
    """Train and test one Chomsky-hierarchy encoder (`md.che.train_task`) at the budget's CHE settings."""
    _, _, results = train_task(task, cfg, steps=budget.che_steps, batch_size=budget.che_batch_size,
                               lr=budget.che_lr, max_train_length=CHE_MAX_TRAIN_LENGTH,
                               test_lengths=budget.che_test_lengths, eval_samples=budget.che_eval_samples,
                               device=device, seed=seed, progress=False)
    return results


class Progress:
    """One line per run: what, how long, and an estimate of the time left from the runs timed so far."""

    def __init__(self, total: int, enabled: bool = True):
        self.total, self.done, self.enabled = total, 0, enabled
        self.started, self.timed, self.timed_seconds = time.perf_counter(), 0, 0.0

    def report(self, what: str, seconds: float | None, detail: str = "") -> None:
        self.done += 1
        if seconds is not None:
            self.timed, self.timed_seconds = self.timed + 1, self.timed_seconds + seconds
        if not self.enabled:
            return
        left = (self.total - self.done) * self.timed_seconds / self.timed if self.timed else 0.0
        timing = "done before" if seconds is None else f"{seconds:.0f} s"
        elapsed = clock(time.perf_counter() - self.started)
        print(f"[{self.done}/{self.total}] {what}: {timing}{detail}  (elapsed {elapsed}, about {clock(left)} left)",
              flush=True)


def clock(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{seconds:02d}"


def perplexity_summary(result: dict) -> str:
    curve = result["perplexity"]["last_k"]
    return ", last_k ppl " + " ".join(f"{length}:{as_float(ppl):.2f}" for length, ppl in curve.items())


def corpus_key(corpus: str) -> str:
    return slug(Path(corpus).stem) if corpus not in ("austen", "latex", "python") else corpus


def lm_run_path(out: Path, corpus: str, train_length: int, label: str, seed: int) -> Path:
    return out / "runs" / f"{corpus_key(corpus)}-T{train_length}" / slug(label) / f"seed{seed}.json"


def che_run_path(out: Path, task: str, label: str, seed: int) -> Path:
    return out / "runs" / "che" / task / slug(label) / f"seed{seed}.json"


def run_place(out: Path, kind: str, where, label: str, seed: int) -> tuple[Path, str]:
    """The result file of one run and its name in the progress lines."""
    if kind == "lm":
        corpus, train_length = where
        return (lm_run_path(out, corpus, train_length, label, seed),
                f"{corpus_key(corpus)} T={train_length} {label} seed {seed}")
    return che_run_path(out, where, label, seed), f"CHE {where} {label} seed {seed}"


def run_one(kind: str, where, label: str, seed: int, budget: Budget, device: torch.device) -> tuple[dict, str]:
    """Train and evaluate one run of the study: (its result, a progress detail)."""
    if kind == "lm":
        corpus, train_length = where
        result = train_and_evaluate(lm_config(budget, train_length, MODELS[label]), corpus, budget, seed, device,
                                    allow_leakage=MODELS[label].get("refiner") == LEAKY_REFINER)
        return {"train_length": train_length, **result}, perplexity_summary(result)
    result = che_train_and_evaluate(where, che_config(budget, CHE_MODELS[label]), budget, seed, device)
    return result, f", accuracy beyond training {100 * result['mean_beyond_train']:.1f}%"


