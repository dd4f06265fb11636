"""REPRODUCTION.md and results.json of the claim study: the verdicts, the tables under each claim, the notes
(learned APE, byte frequencies, causality) and the machine the report was made on."""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import subprocess
from pathlib import Path

import torch

from ..lab.data import load_corpus
from ..lab.evaluate import PROTOCOLS
from ..model import GPT, GPTConfig, check_causal
from ..utils import atomic_path
from .budgets import CHE_MAX_TRAIN_LENGTH, Budget
from .claims import (
    CHE_MODELS,
    CHE_TASKS,
    CLAIMS,
    FLAT_MARGIN,
    LEAKY_REFINER,
    LEARNED_MARGIN,
    NEAR_MARGIN,
    UNIGRAM_SHARE,
    Claim,
    Statement,
)
from .endpoints import judge, scope_places, statement_cells, unlearned_tasks
from .figures import che_figure, claim_figure
from .runs import clock, corpus_fingerprint, corpus_key, write_json
from .statistics import VERDICT_RULE, Cell, Endpoint, claim_verdict, format_mean_std, format_p, mean_std, ratio_text


def _estimate_text(statement: Statement, endpoint: Endpoint) -> str:
    """The endpoint and its 95 % CI in the statement's units: % of perplexity per byte, or accuracy points."""
    if statement.task is not None:
        return f"{endpoint.estimate:+.1f} [{endpoint.low:+.1f}, {endpoint.high:+.1f}] points"
    return ratio_text(endpoint, math.log(statement.factor))  # the plain ratio; the threshold is in the statement


def _endpoint_text(statement: Statement) -> str:
    """What the endpoint is and what the statement claims about it, with units."""
    if statement.task is not None:
        what = (
            f"accuracy of {statement.model} minus {statement.other}, points, mean over the test lengths "
            f"beyond {CHE_MAX_TRAIN_LENGTH}, per seed"
        )
        claimed = "above 0" if statement.kind == "higher" else f"within ±{NEAR_MARGIN:.0f} points"
        return f"{what}; claimed {claimed}"
    per = "per (corpus, seed)"
    if statement.kind in ("degrades", "flat"):
        claimed = (
            "above 0 %"
            if statement.kind == "degrades"
            else (
                f"within ±{FLAT_MARGIN:.0%} (a log ratio within ±log {1 + FLAT_MARGIN:g}, i.e. "
                f"{100 * (1 / (1 + FLAT_MARGIN) - 1):+.1f} % to {FLAT_MARGIN:+.0%})"
            )
        )
        return (
            f"perplexity per byte of {statement.model} at 16x the training length over it at 1x, minus 1 "
            f"(geometric mean of both protocols), {per}; claimed {claimed}"
        )
    lengths = "lengths beyond the training length" if statement.lengths == "beyond" else "all evaluation lengths"
    threshold = "below 0 %" if statement.factor == 1 else f"below {100 * (statement.factor - 1):+.0f} %"
    return (
        f"perplexity per byte of {statement.model} over {statement.other}, minus 1 (geometric mean over both "
        f"protocols and {lengths}), {per}; claimed {threshold}"
    )


# ----------------------------------------------------------------------------- tables, notes and the report


def _curve_table(results: dict, corpus: str, train_length: int, protocol: str, labels) -> str:
    runs = {
        label: results["lm"][(corpus, train_length, label)][protocol]
        for label in labels
        if (corpus, train_length, label) in results["lm"]
    }
    lengths = sorted({length for curve in runs.values() for length in curve})
    header = ["model"] + [f"{length}" + (" (train)" if length == train_length else "") for length in lengths]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * len(lengths)]
    for label, curve in runs.items():
        lines.append("| " + " | ".join([label] + [format_mean_std(curve[length]) for length in lengths]) + " |")
    return "\n".join(lines) + "\n"


def _cells_table(cells: list[Cell]) -> str:
    """Rows: corpus / training length / protocol; columns: evaluation lengths; entries: signed difference, p."""
    rows: dict[str, dict[str, str]] = {}
    columns: list[str] = []
    for cell in cells:
        row, _, column = cell.where.rpartition(" ")
        rows.setdefault(row, {})[column] = cell.text()
        if column not in columns:
            columns.append(column)
    lines = ["| where | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for row, entries in rows.items():
        lines.append(f"| {row} | " + " | ".join(entries.get(column, "") for column in columns) + " |")
    return "\n".join(lines) + "\n"


def machine() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def package_version() -> str:
    """minidape's installed version and, in a git checkout, its commit."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("minidape")
    except PackageNotFoundError:
        installed = "unknown"
    commit = _commit()
    return installed if commit == "unknown" else f"{installed} (commit {commit})"


def _commit() -> str:
    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                timeout=10,
                cwd=Path(__file__).resolve().parent,
            ).stdout.strip()
            or "unknown"
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _statement_block(item: dict) -> str:
    statement, endpoint = item["statement"], item["endpoint"]
    return (
        f"**{statement.text}** — *{item['verdict']}*. Endpoint: {_endpoint_text(statement)}. "
        f"Estimate {_estimate_text(statement, endpoint)} (95 % CI, {len(item['units'])} units); "
        f"t-test {format_p(endpoint.p)}, sign-flip {format_p(endpoint.p_sign_flip)}, Holm-adjusted "
        f"{format_p(item['p_holm'])}.\n\n"
    )


def write_report(
    out: Path,
    results: dict,
    corpora: list[str],
    budget_name: str,
    budget: Budget,
    seeds: int,
    device: torch.device,
    command: str,
    wall_seconds: float,
    trained: int,
) -> dict:
    """REPRODUCTION.md, results.json and figures/ from the collected runs; returns the verdicts."""
    figures = out / "figures"
    judged = judge(results, corpora, budget.train_lengths)
    sections, claim_rows, statement_rows, verdicts = [], [], [], {}
    for claim in CLAIMS:
        items = [item for item in judged if item["claim"] == claim.key]
        overall = claim_verdict([item["verdict"] for item in items])
        claim_rows.append(f"| {claim.key} | {claim.title} | {claim.source} | **{overall}** |")
        parts = []
        for item in items:
            statement, endpoint = item["statement"], item["endpoint"]
            cells = statement_cells(statement, results, corpora, budget.train_lengths)
            statement_rows.append(
                f"| {claim.key} | {statement.text} | {_estimate_text(statement, endpoint)} | "
                f"{format_p(endpoint.p)} | {format_p(endpoint.p_sign_flip)} | "
                f"{format_p(item['p_holm'])} | {item['verdict']} |"
            )
            verdicts.setdefault(claim.key, []).append(
                {
                    "statement": statement.text,
                    "kind": statement.kind,
                    "verdict": item["verdict"],
                    "units": item["units"],
                    "estimate": endpoint.estimate,
                    "ci95": [endpoint.low, endpoint.high],
                    "p_t": endpoint.p,
                    "p_sign_flip": endpoint.p_sign_flip,
                    "p_holm": item["p_holm"],
                    "cells": {cell.where: {"difference": cell.difference(), "p": cell.p()} for cell in cells},
                }
            )
            unit = "accuracy points" if claim.che else "% of perplexity per byte"
            against = f"against {statement.other}" if statement.other else "at each length against the training length"
            parts.append(
                _statement_block(item) + f"Per cell ({unit}, {statement.model} {against}, mean over seeds; p "
                f"of the paired t-test over seeds, not adjusted, descriptive):\n\n" + _cells_table(cells)
            )
        if claim.che:
            tables = che_table(results)
            che_figure(results, figures / f"{claim.key}.png")
        else:
            places = sorted(
                {
                    place
                    for statement in claim.statements
                    for place in scope_places(statement.scope, corpora, budget.train_lengths)
                },
                key=lambda place: (corpora.index(place[0]), -place[1]),
            )
            tables = "".join(
                f"*{corpus_key(corpus)}, trained at {train_length}, {protocol}* (perplexity per "
                f"byte, mean ± std over {seeds} seeds):\n\n"
                f"{_curve_table(results, corpus, train_length, protocol, claim.models)}\n"
                for corpus, train_length in places
                for protocol in PROTOCOLS
            )
            claim_figure(claim, results, places, figures / f"{claim.key}.png")
        extra = {
            "C1": _learned_ape_note(budget) + _unigram_note(results, claim, corpora, budget),
            "C4": _causality_note(budget),
        }.get(claim.key, "")
        sections.append(
            f"## {claim.key}: {claim.title}\n\nSource: {claim.source}. Verdict: **{overall}**.\n\n"
            f"**The paper.** {claim.paper}\n\n**Ours.**\n\n{tables}{extra}\n"
            f"![{claim.key}](figures/{claim.key}.png)\n\n**Tests.**\n\n" + "\n".join(parts)
        )
    summary = (
        "| claim | what it says | source | verdict |\n|---|---|---|---|\n" + "\n".join(claim_rows) + "\n\n"
        "| claim | statement | estimate [95 % CI] | p (t) | p (sign-flip) | p (Holm) | verdict |\n"
        "|---|---|---|---|---|---|---|\n" + "\n".join(statement_rows) + "\n"
    )
    header = (
        f"# Reproduction of the papers' claims\n\nMade by `{command}` (minidape {package_version()}) on "
        f"{device.type} ({machine()}). Wall time of this invocation {clock(wall_seconds)}, in which it "
        f"trained {trained} of the {results['runs']} runs (the others it found done, by an earlier or a "
        f"concurrent invocation); the runs' own training and evaluation time adds up to "
        f"{clock(results['run_seconds'])}.\n\n"
        f"{_budget_text(budget_name, budget, seeds, corpora)} {_corpora_text(corpora)}\n\n## Summary\n\n{summary}\n"
        f"**Verdict rule.** {VERDICT_RULE}\n\n"
    )
    markdown = header + "\n\n".join(sections) + "\n"
    with atomic_path(out / "REPRODUCTION.md") as tmp:
        tmp.write_text(markdown)
    payload = {
        "budget": budget_name,
        "settings": dataclasses.asdict(budget),
        "seeds": seeds,
        "corpora": corpora,
        "device": device.type,
        "verdicts": verdicts,
        "perplexity": {
            f"{corpus} T={train_length} {label}": curves
            for (corpus, train_length, label), curves in results["lm"].items()
        },
        "che_accuracy_beyond_train": {f"{task} {label}": values for (task, label), values in results["che"].items()},
        "che_accuracy_within_train": {
            f"{task} {label}": values for (task, label), values in results["che_within"].items()
        },
    }
    write_json(out / "results.json", payload)
    return {"summary": summary, "verdicts": verdicts, "markdown": markdown}


def _budget_text(name: str, budget: Budget, seeds: int, corpora: list[str]) -> str:
    lengths = ", ".join(str(length) for length in budget.train_lengths)
    extra = " (the others only for C1, on the first corpus)" if len(budget.train_lengths) > 1 else ""
    scored = min(budget.last_k, budget.train_lengths[-1])
    return (
        f"**Budget `{name}`.** {seeds} seeds; corpora {', '.join(corpora)} (byte-level: every perplexity "
        f"here is per byte). Language models: {budget.n_layer} layers, n_embd {budget.n_embd}, "
        f"{budget.n_head} heads, refiner width 32; {budget.steps} AdamW steps of {budget.batch_size} windows, "
        f"lr {budget.lr} (cosine, 5% warmup); training length{'s' if extra else ''} {lengths}{extra}; "
        f"evaluation at the training length x {', '.join(map(str, budget.eval_factors))}. The same tokens "
        f"are scored at every length, for every model and seed: `last_k` scores {budget.eval_windows} "
        f"disjoint stretches of {scored} tokens (min(last_k = {budget.last_k}, the training length)), "
        f"placed once over the whole validation split, each length reading the window that ends at them; "
        f"`nonoverlap` scores the first {budget.nonoverlap_tokens} predictions of the validation split, cut "
        f"into windows of the length. CHE encoders (C6): the same size, bidirectional, randomized positions "
        f"drawn from [0, {budget.che_random_positions}), {budget.che_steps} Adam steps of "
        f"{budget.che_batch_size}, training lengths 1–{CHE_MAX_TRAIN_LENGTH}, tested at lengths "
        f"{_che_lengths_text(budget.che_test_lengths)} with {budget.che_eval_samples} sequences each. The "
        f"papers train 125M-parameter models for 50k steps (CHE: 200k steps): this is a far smaller study, "
        f"and its verdicts are about this budget."
    )


def _corpora_text(corpora: list[str]) -> str:
    fingerprints = [(corpus_key(corpus), corpus_fingerprint(corpus)) for corpus in corpora]
    return (
        "Corpora as read: "
        + "; ".join(f"{key} {found['bytes']} bytes, sha256 {found['sha256']}" for key, found in fingerprints)
        + "."
    )


def _che_lengths_text(lengths: tuple[int, ...]) -> str:
    within = [n for n in lengths if n <= CHE_MAX_TRAIN_LENGTH]
    beyond = ", ".join(str(n) for n in lengths if n > CHE_MAX_TRAIN_LENGTH)
    return (
        f"{', '.join(map(str, within))} (within training) and " if within else ""
    ) + f"{beyond} (spread over {CHE_MAX_TRAIN_LENGTH + 1}–500, as the paper averages them)"


def _learned_ape_note(budget: Budget) -> str:
    """Learned APE past its table, shown by trying: no statistic, it cannot run."""
    train_length = budget.train_lengths[0]
    model = GPT(
        GPTConfig(n_layer=1, n_embd=budget.n_embd, n_head=budget.n_head, block_size=train_length, pe="learned")
    ).eval()
    try:
        with torch.no_grad():
            model(torch.zeros(1, 2 * train_length, dtype=torch.long))
        outcome = "it ran (unexpected: the table should end at the training length)"
    except ValueError as err:
        outcome = f"minidape refuses: \"{err}\""
    return (
        f"\n**learned APE: cannot run** past the training length, so it is not tested (a model with a "
        f"position table of {train_length} entries, asked for {2 * train_length} tokens: {outcome}). "
        f"Sinusoidal APE, which runs at any length, stands for absolute positions in the tests.\n"
    )


def unigram_perplexity(corpus: str) -> float:
    """Perplexity per byte on the validation split of byte frequencies alone (counted on the training split,
    add-one smoothed): the level of a model that has learned no context at all."""
    counts = torch.bincount(load_corpus(corpus, "train").long(), minlength=256).double() + 1
    log_probs = (counts / counts.sum()).log()
    return math.exp(-log_probs[load_corpus(corpus, "val").long()].mean().item())


def _unigram_note(results: dict, claim: Claim, corpora: list[str], budget: Budget) -> str:
    """Which of the claim's models ended training no better than byte frequencies (a flat curve there is no
    evidence of extrapolation: the model reads no context at any length)."""
    train_length = budget.train_lengths[0]
    levels, stuck = [], []
    for corpus in corpora:
        unigram = unigram_perplexity(corpus)
        levels.append(f"{corpus_key(corpus)} {unigram:.2f}")
        for label in claim.models:
            curves = results["lm"].get((corpus, train_length, label))
            if curves and mean_std(curves["nonoverlap"][train_length])[0] > UNIGRAM_SHARE * unigram:
                level = format_mean_std(curves["nonoverlap"][train_length])
                stuck.append(f"{label} on {corpus_key(corpus)} ({level})")
    verdict = (
        f"At the training length (`nonoverlap`) these stay above {UNIGRAM_SHARE:.0%} of it, i.e. learned little "
        f"more than byte frequencies at this budget, so their curves say little about extrapolation: "
        f"{'; '.join(stuck)}."
        if stuck
        else f"Every model here ends training below {UNIGRAM_SHARE:.0%} of it."
    )
    return (
        f"\nReference: byte frequencies alone (no context) give a perplexity per byte of "
        f"{', '.join(levels)} on the validation split. {verdict}\n"
    )


def _causality_note(budget: Budget) -> str:
    cfg = dict(n_layer=1, n_embd=budget.n_embd, n_head=budget.n_head, block_size=64, pe="kerple_log")
    leaky = not check_causal(GPTConfig(refiner=LEAKY_REFINER, **cfg))
    causal = check_causal(GPTConfig(refiner="conv", **cfg))
    return (
        f"\nCausality check (perturb every token after position t, compare the logits at positions ≤ t, "
        f"fresh models): `conv` (with tril) reads no future: **{causal}**; `conv_no_tril` reads the "
        f"future: **{leaky}**.\n"
    )


def che_table(results: dict) -> str:
    columns = [(label, "che_within", f"{label} within 1–{CHE_MAX_TRAIN_LENGTH}") for label in CHE_MODELS] + [
        (label, "che", f"{label} beyond") for label in CHE_MODELS
    ]
    lines = [
        "| task | chance | " + " | ".join(title for _, _, title in columns) + " |",
        "|---|" + "---:|" * (len(columns) + 1),
    ]
    for task in CHE_TASKS:
        lines.append(
            f"| {task} | {100 * results['che_chance'][task]:.0f} | "
            + " | ".join(format_mean_std([100 * v for v in results[key][(task, label)]]) for label, key, _ in columns)
            + " |"
        )
    # A task no model learned on the lengths it was trained on cannot tell which one extrapolates better.
    unlearned = unlearned_tasks(results)
    if unlearned:
        learned = (
            f"Within the training lengths no model is {100 * LEARNED_MARGIN:.0f} points above chance on "
            f"{', '.join(unlearned)}: this budget did not learn "
            f"{'that task' if len(unlearned) == 1 else 'those tasks'}, "
            "so the comparison there cannot show which model extrapolates better. "
        )
    else:
        learned = (
            f"Every task is learned within the training lengths ({100 * LEARNED_MARGIN:.0f} points above "
            "chance or more) by at least one model. "
        )
    classifier = "a classifier separate from the input embedding (`tie_embeddings=False`), as in the benchmark"
    return (
        "Accuracy (%) within the training lengths (the tested lengths up to "
        f"{CHE_MAX_TRAIN_LENGTH}) and beyond them (the papers' score), each the mean over the tested lengths, "
        "then mean ± std over seeds:\n\n" + "\n".join(lines) + f"\n\n{learned}"
        "The encoder: bidirectional attention (`causal=False`), answer "
        f"placeholders appended to the input, the answer read at those positions, {classifier}. The "
        "refiner's input mask is all-True in encoder mode, so minidape's conv refiner applies no tril there "
        "(the authors' listing applies it unconditionally); C6 uses DAPE's MLP, for which tril plays no "
        "role.\n"
    )
