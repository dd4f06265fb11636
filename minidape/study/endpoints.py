"""From the collected runs to each statement's verdict: where a statement is tested, its endpoint per unit, the
cells shown under it, and `judge` (Holm's adjustment across the report)."""

from __future__ import annotations

import math

from ..lab.evaluate import PROTOCOLS
from .budgets import CHE_MAX_TRAIN_LENGTH, Budget
from .claims import CHE_MODELS, CHE_TASKS, CLAIMS, KINDS, LEARNED_MARGIN, NOT_TESTED, Statement
from .runs import corpus_key
from .statistics import Cell, Endpoint, holm, mean_std, verdict


def scope_places(scope: str, corpora: list[str], train_lengths: tuple[int, ...]) -> list[tuple[str, int]]:
    main = [(corpus, train_lengths[0]) for corpus in corpora]
    if scope == "first":
        return main[:1]
    if scope == "everywhere":
        return main + [(corpora[0], length) for length in train_lengths[1:]]
    return main


def study_plan(corpora: list[str], budget: Budget) -> dict[tuple[str, int], list[str]]:
    """{(corpus, training length): model labels to train there}, from the statements' scopes."""
    plan: dict[tuple[str, int], list[str]] = {}
    for claim in CLAIMS:
        if claim.che:
            continue
        for statement in claim.statements:
            for place in scope_places(statement.scope, corpora, budget.train_lengths):
                labels = plan.setdefault(place, [])
                labels.extend(label for label in (statement.model, statement.other) if label and label not in labels)
    return plan


def degradation_length(train_length: int, lengths) -> int:
    """Where a degradation is measured: 16x the training length, or the longest length of a budget that stops
    before it."""
    return 16 * train_length if 16 * train_length in lengths else max(lengths)


def log_ratio_units(model: dict, other: dict | None, train_length: int, where: str) -> list[float]:
    """One endpoint value per seed, from curves ``{protocol: {length: [ppl per seed]}}``: the mean over both
    protocols and the lengths of `where` of log ppl(model) - log ppl(other) at the same length ("in": the
    training length, "beyond": every longer length, "longest": `degradation_length`, "all": every length); or,
    with ``other`` None and `where` "degradation", log ppl(model at `degradation_length`) - log ppl(model at the
    training length)."""
    evaluated = model[PROTOCOLS[0]]
    lengths = {
        "in": [train_length],
        "beyond": [length for length in evaluated if length > train_length],
        "longest": [degradation_length(train_length, evaluated)],
        "all": list(evaluated),
        "degradation": [degradation_length(train_length, evaluated)],
    }[where]
    units = []
    for seed in range(len(evaluated[train_length])):
        differences = [
            math.log(model[protocol][length][seed])
            - math.log(other[protocol][length][seed] if other is not None else model[protocol][train_length][seed])
            for protocol in PROTOCOLS
            for length in lengths
        ]
        units.append(sum(differences) / len(differences))
    return units


def statement_units(statement: Statement, results: dict, corpora: list[str], train_lengths) -> dict[str, float]:
    """The endpoint of `statement` in each unit: ``{unit: value}`` (see `Statement`); the same code as
    `compare`'s endpoints (`log_ratio_units`)."""
    if statement.task is not None:
        model = results["che"][(statement.task, statement.model)]
        other = results["che"][(statement.task, statement.other)]
        return {f"seed {seed}": 100 * (a - b) for seed, (a, b) in enumerate(zip(model, other))}
    where = "degradation" if statement.kind in ("degrades", "flat") else statement.lengths
    units = {}
    for corpus, train_length in scope_places(statement.scope, corpora, train_lengths):
        model = results["lm"][(corpus, train_length, statement.model)]
        other = results["lm"][(corpus, train_length, statement.other)] if statement.other else None
        for seed, value in enumerate(log_ratio_units(model, other, train_length, where)):
            units[f"{corpus_key(corpus)} T={train_length} seed {seed}"] = value - math.log(statement.factor)
    return units


def statement_cells(statement: Statement, results: dict, corpora: list[str], train_lengths) -> list[Cell]:
    """The cells shown under a statement: every corpus, protocol and length (``degrades``/``flat``: each length
    beyond training against the training length); C6: each test length beyond training."""
    if statement.task is not None:
        model = results["che_curves"][(statement.task, statement.model)]
        other = results["che_curves"][(statement.task, statement.other)]
        return [Cell(f"accuracy {n}", model[n], other[n], log=False) for n in model if n > CHE_MAX_TRAIN_LENGTH]
    cells = []
    for corpus, train_length in scope_places(statement.scope, corpora, train_lengths):
        model = results["lm"][(corpus, train_length, statement.model)]
        other = results["lm"][(corpus, train_length, statement.other or statement.model)]
        for protocol in PROTOCOLS:
            for length in model[protocol]:
                if (statement.lengths == "beyond" or not statement.other) and length <= train_length:
                    continue
                against = other[protocol][length if statement.other else train_length]
                cells.append(
                    Cell(
                        f"{corpus_key(corpus)} T={train_length} {protocol} {length // train_length}xT",
                        model[protocol][length],
                        against,
                    )
                )
    return cells


def judge(results: dict, corpora: list[str], train_lengths, claims=CLAIMS) -> list[dict]:
    """Every statement of the report: its units, endpoint, Holm-adjusted p and verdict (in `CLAIMS` order)."""
    judged = []
    for claim in claims:
        for statement in claim.statements:
            units = statement_units(statement, results, corpora, train_lengths)
            judged.append(
                {
                    "claim": claim.key,
                    "statement": statement,
                    "units": units,
                    "endpoint": Endpoint(list(units.values()), KINDS[statement.kind], statement.margin),
                }
            )
    # A C6 task that no model learned within its training lengths cannot show which model extrapolates (two
    # models at chance are "near-equal" trivially): its statement is not tested and leaves Holm's family.
    unlearned = set(unlearned_tasks(results)) if any(claim.che for claim in claims) else set()
    tested = [item for item in judged if item["statement"].task not in unlearned]
    for item, p_holm in zip(tested, holm([item["endpoint"].p for item in tested])):
        item["p_holm"] = p_holm
        item["verdict"] = verdict(item["endpoint"], p_holm)
    for item in judged:
        if item["statement"].task in unlearned:
            item["p_holm"], item["verdict"] = math.nan, NOT_TESTED
    return judged


def unlearned_tasks(results: dict) -> list[str]:
    """C6 tasks on which no model is `LEARNED_MARGIN` above chance within the training lengths."""
    return [
        task
        for task in CHE_TASKS
        if all(
            mean_std(results["che_within"][(task, label)])[0] < results["che_chance"][task] + LEARNED_MARGIN
            for label in CHE_MODELS
        )
    ]
