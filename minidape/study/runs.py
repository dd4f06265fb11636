"""One run of the study (a model trained and evaluated once): its result file (one JSON, atomically written),
the folder's manifest of settings, and the progress lines."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import time
import warnings
from pathlib import Path

import torch

from ..lab.che import train_task
from ..lab.data import load_corpus
from ..lab.evaluate import perplexity_by_length
from ..lab.train import train
from ..model import GPTConfig
from ..utils import RESULT_FILES, atomic_path, json_ready, refuse_to_replace
from .budgets import CHE_MAX_TRAIN_LENGTH, Budget, che_config, eval_lengths, lm_config
from .claims import CHE_MODELS, LEAKY_REFINER, MODELS


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()


def write_json(path: Path, payload) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(json_ready(payload), indent=1) + "\n")


def read_json(path: Path):
    """A file of the run store; an empty, truncated or malformed one is a ValueError naming it."""
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(
            f"{path} is not a valid JSON file ({'empty' if not path.stat().st_size else err}); "
            f"delete it to make it again"
        ) from err


def corpus_fingerprint(corpus: str) -> dict:
    """What a run records of its corpus: the sha256 and size of the bytes read (after gunzip)."""
    tokens = torch.cat([load_corpus(corpus, "train"), load_corpus(corpus, "val")]).numpy().tobytes()
    return {"sha256": hashlib.sha256(tokens).hexdigest(), "bytes": len(tokens)}


def run_record(cfg: GPTConfig, fingerprint: dict, budget: Budget, seed: int, sources: dict) -> dict:
    """Everything a language-model run's numbers depend on: the model's full config, the corpus's sha256 and
    size, training and evaluation settings, the seed and the sha256 of the users' files behind its PE and
    refiner. A run file is reused only when its record equals this."""
    return {
        "config": dataclasses.asdict(cfg),
        "corpus_sha256": fingerprint["sha256"],
        "corpus_bytes": fingerprint["bytes"],
        "steps": budget.steps,
        "batch_size": budget.batch_size,
        "lr": budget.lr,
        "lengths": eval_lengths(budget, cfg.block_size),
        "last_k": budget.last_k,
        "eval_windows": budget.eval_windows,
        "nonoverlap_tokens": budget.nonoverlap_tokens,
        "seed": seed,
        "code_sha256": sources,
    }


def _differences(recorded, expected, prefix: str = "") -> list[str]:
    if isinstance(recorded, dict) and isinstance(expected, dict):
        return [
            difference
            for key in sorted(set(recorded) | set(expected), key=str)
            for difference in _differences(recorded.get(key), expected.get(key), f"{prefix}{key}.")
        ]
    if recorded == expected:
        return []
    recorded, expected = (
        f"{value[:12]}..." if isinstance(value, str) and len(value) == 64 else repr(value)
        for value in (recorded, expected)
    )  # a sha256 shortened
    return [f"{prefix[:-1]} {recorded} there, {expected} now"]


def reusable_run(path: Path, record: dict, rerun: bool = False) -> dict | None:
    """The result in `path` when it was made with `record`; None when there is none, or when `rerun` asks to
    make again one made otherwise. Otherwise a ValueError naming the file and what differs."""
    if not path.is_file():
        return None
    result = read_json(path)
    recorded = result.get("run") if isinstance(result, dict) else None
    differences = _differences(json_ready(recorded), json_ready(record))
    if not differences:
        return result
    if rerun:
        return None
    shown = (
        "it records neither (written before minidape recorded them)"
        if recorded is None
        else "; ".join(differences[:3]) + (f"; and {len(differences) - 3} more" if len(differences) > 3 else "")
    )
    raise ValueError(
        f"{path} was made with another corpus or configuration ({shown}): it is not reused; pass "
        f"--rerun (rerun=True) to train it again, or use another --out"
    )


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
            raise ValueError(
                f"{out} holds runs made with other settings ({', '.join(changed)} differ: "
                f"{', '.join(f'{key}={previous.get(key)!r}' for key in changed)}); "
                f"use another --out, or delete {out} to start again"
            )
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


def train_and_evaluate(
    cfg: GPTConfig,
    corpus: str,
    budget: Budget,
    seed: int,
    device: torch.device,
    allow_leakage: bool = False,
    progress: bool = False,
    keep: Path | None = None,
) -> dict:
    """Train one language model and measure its perplexity at every evaluation length, both protocols.
    `allow_leakage`: C4's leaky refiner (checked before the study starts), or `compare(allow_leakage=True)`;
    `progress`: a bar of the run's steps and loss; `keep`: a folder for the trained model's checkpoint.pt."""
    steps = budget.steps
    started = time.perf_counter()
    with warnings.catch_warnings():  # the leak, when allowed, is named once in the report, not per run
        warnings.filterwarnings("ignore", message=".* reads the future")
        model, history = train(
            cfg,
            load_corpus(corpus, "train"),
            val_data=load_corpus(corpus, "val"),
            steps=steps,
            batch_size=budget.batch_size,
            lr=budget.lr,
            device=device,
            seed=seed,
            eval_every=steps,
            eval_windows=8,
            progress=progress,
            allow_leakage=allow_leakage,
            out=keep,
            overwrite=keep is not None,
        )  # a checkpoint without its run file: unfinished
    train_seconds = time.perf_counter() - started
    lengths = eval_lengths(budget, cfg.block_size)
    val_tokens = load_corpus(corpus, "val")
    with warnings.catch_warnings():  # learned APE beyond its table: NaN, as the report says
        warnings.filterwarnings("ignore", message="length .* skipped")
        perplexity = {
            "last_k": perplexity_by_length(
                model, val_tokens, lengths, last_k=budget.last_k, n_windows=budget.eval_windows, seed=0
            ),
            "nonoverlap": perplexity_by_length(
                model, val_tokens, lengths, protocol="nonoverlap", n_tokens=budget.nonoverlap_tokens
            ),
        }
    return {
        "config": dataclasses.asdict(cfg),
        "corpus": corpus,
        "seed": seed,
        "steps": steps,
        "final_loss": history[-1]["loss"],
        "val_loss": history[-1].get("val_loss"),
        "perplexity": perplexity,
        "train_seconds": round(train_seconds, 1),
        "eval_seconds": round(time.perf_counter() - started - train_seconds, 1),
    }


def che_train_and_evaluate(task: str, cfg: GPTConfig, budget: Budget, seed: int, device: torch.device) -> dict:
    """Train and test one Chomsky-hierarchy encoder (`md.che.train_task`) at the budget's CHE settings."""
    _, _, results = train_task(
        task,
        cfg,
        steps=budget.che_steps,
        batch_size=budget.che_batch_size,
        lr=budget.che_lr,
        max_train_length=CHE_MAX_TRAIN_LENGTH,
        test_lengths=budget.che_test_lengths,
        eval_samples=budget.che_eval_samples,
        device=device,
        seed=seed,
        progress=False,
    )
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
        print(
            f"[{self.done}/{self.total}] {what}: {timing}{detail}  (elapsed {elapsed}, about {clock(left)} left)",
            flush=True,
        )


def clock(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{seconds:02d}"


def perplexity_summary(result: dict) -> str:
    curve = result["perplexity"]["last_k"]
    return ", last_k ppl " + " ".join(f"{length}:{as_float(ppl):.2f}" for length, ppl in curve.items())


def corpus_key(corpus: str) -> str:
    """A corpus's name in the run store: a bundled name, or a file's stem and a hash of its resolved path (two
    files of one name in two folders are two corpora)."""
    if corpus in ("austen", "latex", "python"):
        return corpus
    return f"{slug(Path(corpus).stem)}-{hashlib.sha1(str(Path(corpus).resolve()).encode()).hexdigest()[:8]}"


def lm_run_path(out: Path, corpus: str, train_length: int, label: str, seed: int) -> Path:
    return out / "runs" / f"{corpus_key(corpus)}-T{train_length}" / slug(label) / f"seed{seed}.json"


def che_run_path(out: Path, task: str, label: str, seed: int) -> Path:
    return out / "runs" / "che" / task / slug(label) / f"seed{seed}.json"


def run_place(out: Path, kind: str, where, label: str, seed: int) -> tuple[Path, str]:
    """The result file of one run and its name in the progress lines."""
    if kind == "lm":
        corpus, train_length = where
        return (
            lm_run_path(out, corpus, train_length, label, seed),
            f"{corpus_key(corpus)} T={train_length} {label} seed {seed}",
        )
    return che_run_path(out, where, label, seed), f"CHE {where} {label} seed {seed}"


def study_run_record(kind: str, where, label: str, seed: int, budget: Budget, fingerprints: dict) -> dict:
    """The record a run of the claim study is reused by (`reusable_run`): `run_record` for a language model
    (`fingerprints`: corpus -> `corpus_fingerprint`), the task, config and CHE settings for an encoder."""
    if kind == "lm":
        corpus, train_length = where
        return run_record(lm_config(budget, train_length, MODELS[label]), fingerprints[corpus], budget, seed, {})
    return {
        "task": where,
        "config": dataclasses.asdict(che_config(budget, CHE_MODELS[label])),
        "steps": budget.che_steps,
        "batch_size": budget.che_batch_size,
        "lr": budget.che_lr,
        "test_lengths": list(budget.che_test_lengths),
        "eval_samples": budget.che_eval_samples,
        "seed": seed,
    }


def one_step(step: int | str, names: list[str], done: list[bool], seeds: list[int], out) -> list[int] | None:
    """Which runs of a study's list (``names``, ``done`` for those found in ``out``, ``seeds`` their seeds) a
    ``step`` of it trains: "list" none (None: only list them), N run N alone, "report" none, once every run is
    done (else a ValueError saying how many are missing, the first, their lines, and the seeds done by all)."""
    if step == "list":
        return None
    if step == "report":
        missing = [number for number, finished in enumerate(done) if not finished]
        if missing:
            raise ValueError(
                f"{len(missing)} of the {len(names)} runs are not done in {out} (the first: {names[missing[0]]}); "
                f"run them (--run {_ranges(missing)}: lines {_ranges([n + 1 for n in missing])} of --list-runs, "
                f"as a job array's indices), then the report again{_seeds_done_text(seeds, done)}"
            )
        return []
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < len(names):
        raise ValueError(f"run {step!r} is not in the list: valid runs are 0 to {len(names) - 1} (see --list-runs)")
    return [step]


def _seeds_done_text(seeds: list[int], done: list[bool]) -> str:
    """The report of fewer seeds that the runs done allow (--seeds K: a run's file records its own seed, not how
    many the study has): seeds 0 to K-1 done by every model, K >= 2."""
    complete = 0
    while complete in seeds and all(finished for seed, finished in zip(seeds, done) if seed == complete):
        complete += 1
    if complete < 2:
        return ""
    return f"; or report the {complete} seeds every model has done now: the same command with --seeds {complete}"


def _ranges(numbers: list[int]) -> str:
    """Sorted numbers as a scheduler's index list (Slurm's --array): 0,2-5,9."""
    runs = []
    for number in numbers:
        if runs and number == runs[-1][1] + 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    return ",".join(str(first) if first == last else f"{first}-{last}" for first, last in runs)


def run_one(kind: str, where, label: str, seed: int, budget: Budget, device: torch.device) -> tuple[dict, str]:
    """Train and evaluate one run of the study: (its result, a progress detail)."""
    if kind == "lm":
        corpus, train_length = where
        result = train_and_evaluate(
            lm_config(budget, train_length, MODELS[label]),
            corpus,
            budget,
            seed,
            device,
            allow_leakage=MODELS[label].get("refiner") == LEAKY_REFINER,
        )
        return {"train_length": train_length, **result}, perplexity_summary(result)
    result = che_train_and_evaluate(where, che_config(budget, CHE_MODELS[label]), budget, seed, device)
    return result, f", accuracy beyond training {100 * result['mean_beyond_train']:.1f}%"
