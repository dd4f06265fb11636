"""`reproduce`: every run of the claim study, resumable and shared between processes, then the report."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path

import torch

from ..lab.evaluate import PROTOCOLS
from ..lab.leakage import decoder_leaks
from ..threads import api_entry
from ..utils import file_lock, holds_out_folder, resolve_device
from .budgets import DEFAULT_CORPORA, DEFAULT_SEEDS, check_corpus_fits, lm_config, resolve_budget
from .claims import CHE_MODELS, CHE_TASKS, LEAKY_REFINER, MODELS, register_leaky_refiner
from .endpoints import study_plan
from .report import write_report
from .runs import (
    Progress,
    as_float,
    che_run_path,
    check_seeds,
    check_settings,
    corpus_fingerprint,
    lm_run_path,
    one_step,
    read_json,
    refuse_foreign_results,
    reusable_run,
    run_one,
    run_place,
    study_run_record,
    write_json,
)


@holds_out_folder(shared=True)  # two `reproduce` into one folder share its runs; anything else is refused
@api_entry
def reproduce(
    budget: str = "default",
    seeds: int = DEFAULT_SEEDS,
    corpora=DEFAULT_CORPORA,
    out="runs/reproduce",
    device: str | torch.device = "auto",
    progress: bool = True,
    command: str | None = None,
    rerun: bool = False,
    step: int | str | None = None,
) -> dict:
    """Train and evaluate the claim study (C1-C6) and write ``REPRODUCTION.md``, ``results.json`` and
    ``figures/`` into ``out``. Resumable: runs already in ``out/runs`` are skipped when their file records this
    corpus (sha256 and size) and configuration; one recording others is refused, naming the file and what
    differs, unless ``rerun`` (then it is trained again). Returns the results.
    Refused before any training: a folder holding another command's results, and a model that reads the future
    (but C4's, which does so on purpose: the report's causality note says it does).

    ``step`` splits the study for a cluster's scheduler (`one_step`): ``"list"`` returns ``{"runs": [names]}``
    (nothing trained), N trains and evaluates run N of that list alone into ``out/runs`` and returns
    ``{"runs": [its name]}``, ``"report"`` writes the report from the runs done, refusing while any is missing."""
    device = resolve_device(device)
    budget_settings = resolve_budget(budget, device)
    seeds = check_seeds(seeds)
    refuse_foreign_results(out, overwrite=False)
    register_leaky_refiner()
    corpora = [str(corpus) for corpus in corpora]
    if len(corpora) < 1 or len(set(corpora)) != len(corpora):
        raise ValueError(f"corpora must name at least one corpus, each once; got {corpora}")
    for corpus in corpora:
        check_corpus_fits(corpus, budget_settings, budget_settings.train_lengths)
    out = Path(out)
    plan = study_plan(corpora, budget_settings)
    # every model the study trains (C4's leaky one reads the future on purpose: the report says it does)
    for label in {label for labels in plan.values() for label in labels}:
        if MODELS[label].get("refiner") != LEAKY_REFINER:
            decoder_leaks(lm_config(budget_settings, budget_settings.train_lengths[0], MODELS[label]))
    check_settings(
        out,
        {
            "command": "reproduce",
            "budget": budget,
            "settings": dataclasses.asdict(budget_settings),
            "corpora": corpora,
            "device": device.type,
        },
    )
    fingerprints = {corpus: corpus_fingerprint(corpus) for corpus in corpora}
    # Seeds outermost: a study stopped early has every model (and task) at its first seeds, not some at all.
    runs = [
        (seed, kind, where, label)
        for seed in range(seeds)
        for kind, where, labels in (
            [("lm", place, labels) for place, labels in plan.items()]
            + [("che", task, tuple(CHE_MODELS)) for task in CHE_TASKS]
        )
        for label in labels
    ]
    started = time.perf_counter()
    names = [run_place(out, kind, where, label, seed)[1] for seed, kind, where, label in runs]
    if step is not None:
        done = [
            reusable_run(
                run_place(out, kind, where, label, seed)[0],
                study_run_record(kind, where, label, seed, budget_settings, fingerprints),
                rerun,
            )
            is not None
            for seed, kind, where, label in runs
        ]
        chosen = one_step(step, names, done, [seed for seed, *_ in runs], out)
        if chosen is None:
            return {"runs": names}
        runs = [runs[i] for i in chosen]
    meter = Progress(len(runs), progress)
    if progress and step is None:
        count = sum(kind == "lm" for _, kind, _, _ in runs)
        print(
            f"minidape reproduce on {device}: budget {budget} ({budget_settings.n_layer} layers x "
            f"{budget_settings.n_embd}, {budget_settings.steps} steps of {budget_settings.batch_size} windows), "
            f"{seeds} seeds, corpora {', '.join(corpora)}: {count} language models and {len(runs) - count} "
            f"CHE encoders -> {out}",
            flush=True,
        )
    # A second `reproduce` into the same folder (another terminal) shares the work: each run is taken by one
    # process through a lock file; runs another live process holds are waited for at the end.
    waiting = runs
    while waiting:
        held = []
        for seed, kind, where, label in waiting:
            path, what = run_place(out, kind, where, label, seed)
            record = study_run_record(kind, where, label, seed, budget_settings, fingerprints)
            if reusable_run(path, record, rerun) is not None:
                meter.report(what, None)
                continue
            # One process per run: a lock file here; a scheduler's task (step) is its run's only writer, and takes
            # no lock, which a network filesystem may not honour.
            lock = file_lock(path.with_name(path.name + ".lock")) if step is None else contextlib.nullcontext()
            with lock as holder:
                if holder is not None:
                    held.append((seed, kind, where, label))
                    continue
                result, detail = run_one(kind, where, label, seed, budget_settings, device)
                write_json(path, {"label": label, "run": record, **result})
            meter.report(what, result["train_seconds"] + result["eval_seconds"], detail)
        if held and progress and len(held) == len(waiting):
            print(f"waiting for {len(held)} runs that another process is training", flush=True)
        if held:
            time.sleep(10 if len(held) == len(waiting) else 0)
        waiting = held
    if isinstance(step, int):
        return {"runs": [names[step]]}
    results = collect_results(out, plan, seeds)
    report = write_report(
        out,
        results,
        corpora,
        budget,
        budget_settings,
        seeds,
        device,
        command or _command_line(budget, seeds, corpora, out),
        time.perf_counter() - started,
        trained=meter.timed,
    )
    if progress:
        print(report["summary"])
        print(f"wrote {out / 'REPRODUCTION.md'}, {out / 'results.json'} and {out / 'figures'}/")
    return report


def _command_line(budget: str, seeds: int, corpora: list[str], out: Path) -> str:
    return f"python -m minidape reproduce --budget {budget} --seeds {seeds} --corpus {' '.join(corpora)} --out {out}"


def collect_results(out: Path, plan: dict, seeds: int) -> dict:
    """Every run's numbers, as lists over seeds: ``lm[(corpus, T, label)][protocol][length]`` and
    ``che[(task, label)]`` (mean accuracy beyond training), ``che_within[(task, label)]`` (within it: did the
    model learn the task?), ``che_curves[(task, label)][n]`` and ``che_chance[task]``."""
    lm, che, che_within, che_curves, che_chance, seconds = {}, {}, {}, {}, {}, []
    for (corpus, train_length), labels in plan.items():
        for label in labels:
            runs = [read_json(lm_run_path(out, corpus, train_length, label, seed)) for seed in range(seeds)]
            seconds += [run["train_seconds"] + run["eval_seconds"] for run in runs]
            lm[(corpus, train_length, label)] = {
                protocol: {
                    int(length): [as_float(run["perplexity"][protocol][length]) for run in runs]
                    for length in runs[0]["perplexity"][protocol]
                }
                for protocol in PROTOCOLS
            }
    for task in CHE_TASKS:
        for label in CHE_MODELS:
            runs = [read_json(che_run_path(out, task, label, seed)) for seed in range(seeds)]
            seconds += [run["train_seconds"] + run["eval_seconds"] for run in runs]
            che[(task, label)] = [run["mean_beyond_train"] for run in runs]
            che_within[(task, label)] = [as_float(run["mean_within_train"]) for run in runs]
            che_curves[(task, label)] = {int(n): [run["accuracy"][n] for run in runs] for n in runs[0]["accuracy"]}
            che_chance[task] = runs[0]["chance"]
    return {
        "lm": lm,
        "che": che,
        "che_within": che_within,
        "che_curves": che_curves,
        "che_chance": che_chance,
        "runs": len(seconds),
        "run_seconds": sum(seconds),
    }
