"""`compare`: a bias of one's own (a registered name or FILE.py:ClassName) through the study's protocol against
baselines, paired by seed."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from pathlib import Path

import torch

from ..evaluate import PROTOCOLS
from ..model import PE_NAMES, PE_REGISTRY, REFINER_NAMES, AdditiveBias, DataDependentBias, register_pe
from ..train import decoder_leaks
from ..utils import atomic_path, holds_out_folder, import_file, json_ready, resolve_device, user_path
from .budgets import check_corpus_fits, lm_config, resolve_budget
from .claims import LEAKY_REFINER, MODELS
from .figures import compare_figure
from .runs import (Progress, as_float, check_seeds, check_settings, perplexity_summary, read_json,
                   refuse_foreign_results, slug, train_and_evaluate, write_json)
from .statistics import Cell, Endpoint, format_mean_std, format_p, holm, ratio_text

def resolve_pe(pe: str) -> tuple[str, str | None]:
    """A registered PE name, or ``path/to/file.py:ClassName`` imported (`md.utils.import_file`, once per file)
    and registered on the fly; returns ``(name, sha256 of the file or None)``. The class must subclass
    ``md.AdditiveBias`` or ``md.DataDependentBias``. A per-layer spec of registered names (``rope,none``) is one
    too."""
    if ":" not in pe or pe in PE_NAMES:
        if not _is_pe_spec(pe):
            raise ValueError(f"unknown pe {pe!r}; valid choices: {', '.join(PE_NAMES)}, several of them joined by "
                             f"commas (cycled over the layers), or FILE.py:ClassName")
        return pe, None
    file_name, _, class_name = pe.rpartition(":")
    path = user_path(file_name, "--pe")
    if not path.is_file():
        raise FileNotFoundError(f"--pe {pe!r}: no file {str(path)!r}")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    try:
        module = import_file(path)
    except ValueError as err:  # the user's file: any error there is theirs, reported in one line
        raise ValueError(f"--pe {pe!r}: {err}") from err
    cls = getattr(module, class_name, None)
    if cls is None:
        found = [name for name, value in vars(module).items() if isinstance(value, type)
                 and issubclass(value, BIAS_KINDS) and value not in BIAS_KINDS]
        raise ValueError(f"--pe {pe!r}: {path} defines no {class_name!r}; AdditiveBias or DataDependentBias classes "
                         f"there: {', '.join(found) or 'none'}")
    if not (isinstance(cls, type) and issubclass(cls, BIAS_KINDS)):
        raise ValueError(f"--pe {pe!r}: {class_name} is not a subclass of md.AdditiveBias (a bias "
                         f"(n_head, Tq, Tk) from positions) or md.DataDependentBias (a bias (batch, n_head, Tq, Tk) "
                         f"that reads the data); see the extension API in the README")
    registered = [name for name, value in PE_REGISTRY.items() if value is cls]  # by the file, or by an earlier call
    if registered:
        return registered[0], digest
    name = f"{slug(path.stem)}:{class_name}"
    register_pe(name)(cls)
    return name, digest


BIAS_KINDS = (AdditiveBias, DataDependentBias)


def _is_pe_spec(pe: str) -> bool:
    """A registered name, or several joined by commas (``GPTConfig.pe``'s per-layer spec)."""
    return all(name in PE_NAMES for name in pe.split(","))


def _model_spec(name: str, what: str) -> dict:
    """``pe``, ``pe+refiner`` or a label of the study's ``MODELS`` -> GPTConfig overrides, with errors naming the
    valid choices."""
    if name in MODELS and what == "baseline" and MODELS[name].get("refiner") != LEAKY_REFINER:
        return dict(MODELS[name])
    pe, _, refiner = name.partition("+")
    if not _is_pe_spec(pe):
        raise ValueError(f"unknown {what} {name!r}; valid choices: {', '.join(PE_NAMES)} (optionally +refiner), "
                         f"or a study model: {', '.join(MODELS)}")
    if refiner and refiner not in REFINER_NAMES:
        raise ValueError(f"unknown refiner {refiner!r} in {what} {name!r}; valid choices: {', '.join(REFINER_NAMES)}")
    return {"pe": pe, "refiner": refiner or "none"}


@holds_out_folder()
def compare(pe: str, refiner: str = "none", against=("alibi", "kerple_log"), seeds: int = 3,
            steps: int | None = None, corpus: str = "austen", out=None, *, budget: str = "default",
            device: str | torch.device = "auto", progress: bool = True, overwrite: bool = False,
            allow_leakage: bool = False) -> dict:
    """Put a bias through the study's protocol against baselines; returns the table and the statistics.

    - ``pe``: a registered name or ``path/to/file.py:ClassName`` (an ``md.AdditiveBias`` subclass,
      registered on the fly); ``refiner``: any registered refiner; ``against``: baselines, each ``pe`` or
      ``pe+refiner``.
    - Each model is trained ``seeds`` times at length 128 (``steps`` per run, default the budget's) on
      ``corpus`` (a name or a .txt/.gz path) and evaluated at 128 x 1..16 with both protocols.
    - Returns ``{"table": markdown, "perplexity": {label: {protocol: {length: [ppl per seed]}}},
      "p_values": {baseline: {protocol: {length: p}}}}``; with ``out`` also writes ``compare.md``,
      ``compare.json``, ``compare.png`` and the runs there (resumable; other settings are refused). An ``out``
      holding other results is refused unless ``overwrite``; another process writing there is refused.
    - A model that reads the future (``md.check_causal``) is refused before any training, unless
      ``allow_leakage=True``: then the report's header says which models leak.
    """
    device = resolve_device(device)
    budget_settings = resolve_budget(budget, device)
    seeds = check_seeds(seeds)
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise ValueError(f"steps must be a positive integer; got {steps!r}")
    if isinstance(against, str):
        against = (against,)
    pe_name, digest = resolve_pe(pe)
    subject = pe_name if refiner == "none" else f"{pe_name}+{refiner}"
    models = {subject: _model_spec(subject, "pe/refiner")}
    for name in against:
        models.setdefault(name, _model_spec(name, "baseline"))
    baselines = [label for label in models if label != subject]
    if not baselines:
        raise ValueError(f"against must name at least one baseline other than {pe}; got {list(against)}")
    train_length = budget_settings.train_lengths[0]
    leaking = [label for label, overrides in models.items()
               if decoder_leaks(lm_config(budget_settings, train_length, overrides), allow_leakage)]
    refuse_foreign_results(out, overwrite)
    check_corpus_fits(corpus, budget_settings, (train_length,))
    steps = steps or budget_settings.steps
    out = Path(out) if out is not None else None
    if out is not None:
        check_settings(out, {"command": "compare", "pe": pe, "pe_file_sha256": digest, "refiner": refiner,
                             "corpus": str(corpus), "steps": steps, "budget": budget,
                             "settings": dataclasses.asdict(budget_settings), "device": device.type,
                             **({"leaking": leaking} if leaking else {})})
    meter = Progress(len(models) * seeds, progress)
    perplexity: dict[str, dict[str, dict[int, list[float]]]] = {}
    for label, overrides in models.items():
        runs = []
        for seed in range(seeds):
            path = out / "runs" / slug(label) / f"seed{seed}.json" if out is not None else None
            if path is not None and path.is_file():
                runs.append(read_json(path))
                meter.report(f"{label} seed {seed}", None)
                continue
            result = train_and_evaluate(lm_config(budget_settings, train_length, overrides), str(corpus),
                                        budget_settings, seed, device, steps=steps, allow_leakage=label in leaking)
            if path is not None:
                write_json(path, {"label": label, **result})
            runs.append(json_ready(result))
            meter.report(f"{label} seed {seed}", result["train_seconds"] + result["eval_seconds"],
                         perplexity_summary(result))
        perplexity[label] = {protocol: {int(length): [as_float(run["perplexity"][protocol][length]) for run in runs]
                                        for length in runs[0]["perplexity"][protocol]} for protocol in PROTOCOLS}
    # The subject against each baseline, paired by seed: one cell per protocol and length, and one endpoint (the
    # mean log ratio over both protocols and all lengths, per seed) with Holm's adjustment across the baselines.
    cells = {baseline: {protocol: {length: Cell(f"{protocol} {length}", perplexity[subject][protocol][length],
                                                perplexity[baseline][protocol][length])
                                   for length in perplexity[subject][protocol]} for protocol in PROTOCOLS}
             for baseline in baselines}
    p_values = {baseline: {protocol: {length: cell.p() for length, cell in by_length.items()}
                           for protocol, by_length in by_protocol.items()} for baseline, by_protocol in cells.items()}
    endpoints = {baseline: Endpoint([_mean_log_ratio(perplexity[subject], perplexity[baseline], seed)
                                     for seed in range(seeds)], "below") for baseline in baselines}
    adjusted = dict(zip(endpoints, holm([endpoint.p for endpoint in endpoints.values()])))
    table = _compare_table(perplexity, cells, endpoints, adjusted, subject, train_length, seeds)
    if progress:
        print(table)
    if out is not None:
        details = (f"Trained {seeds} seeds x {steps} steps at length {train_length} on {corpus} "
                   f"({budget_settings.n_layer} layers, n_embd {budget_settings.n_embd}, {budget_settings.n_head} "
                   f"heads, budget {budget}, {device.type}).\n")
        if leaking:
            details = (f"> **Leakage experiment (allow_leakage): {', '.join(leaking)} read{'s' if len(leaking) == 1 else ''}"
                       f" the future** (md.check_causal fails): their perplexities and p-values do not measure "
                       f"language modelling.\n\n{details}")
        with atomic_path(out / "compare.md") as tmp:
            tmp.write_text(f"# {subject} against {', '.join(baselines)}\n\n{details}\n{table}")
        write_json(out / "compare.json", {"subject": subject, "baselines": baselines, "leaking": leaking,
                                           "perplexity": perplexity,
                                           "p_values": p_values, "endpoints": _endpoints_json(endpoints, adjusted),
                                           "steps": steps, "seeds": seeds,
                                           "corpus": str(corpus), "budget": budget})
        compare_figure(perplexity, train_length, seeds, out / "compare.png")
        if progress:
            print(f"wrote {out / 'compare.md'}, {out / 'compare.json'} and {out / 'compare.png'}")
    return {"subject": subject, "table": table, "perplexity": perplexity, "p_values": p_values,
            "endpoints": _endpoints_json(endpoints, adjusted)}


def _mean_log_ratio(curves: dict, other: dict, seed: int) -> float:
    """Mean over both protocols and every length of log(ppl) - log(other's ppl), for one seed."""
    ratios = [math.log(curves[protocol][length][seed]) - math.log(other[protocol][length][seed])
              for protocol in PROTOCOLS for length in curves[protocol]]
    return sum(ratios) / len(ratios)


def _endpoints_json(endpoints: dict, adjusted: dict) -> dict:
    return {baseline: {"ratio_minus_1": math.expm1(endpoint.estimate),
                       "ci95": [math.expm1(endpoint.low), math.expm1(endpoint.high)], "p_t": endpoint.p,
                       "p_sign_flip": endpoint.p_sign_flip, "p_holm": adjusted[baseline]}
            for baseline, endpoint in endpoints.items()}


def _compare_table(perplexity: dict, cells: dict, endpoints: dict, adjusted: dict, subject: str, train_length: int,
                   seeds: int) -> str:
    """Per protocol: mean ± std for every model at every length and, per baseline, the subject's signed
    difference with the paired t-test's p; then one endpoint per baseline over both protocols and all lengths."""
    blocks = []
    for protocol in PROTOCOLS:
        lengths = list(perplexity[subject][protocol])
        header = ["model"] + [f"{length}" + (" (train)" if length == train_length else "") for length in lengths]
        lines = [f"**{protocol}** — perplexity per byte, mean ± std over {seeds} seeds; then {subject} against each "
                 "baseline: signed difference (% of perplexity per byte, geometric mean over seeds) and the p of the "
                 "paired t-test on log perplexity (not adjusted)", "",
                 "| " + " | ".join(header) + " |", "|---|" + "---:|" * len(lengths)]
        for label, curves in perplexity.items():
            lines.append("| " + " | ".join([label] + [format_mean_std(curves[protocol][length])
                                                     for length in lengths]) + " |")
        for baseline, by_protocol in cells.items():
            lines.append(f"| vs {baseline} | " + " | ".join(by_protocol[protocol][length].text()
                                                           for length in lengths) + " |")
        blocks.append("\n".join(lines) + "\n")
    rows = [f"| {baseline} | {ratio_text(endpoint)} | {format_p(endpoint.p)} | {format_p(endpoint.p_sign_flip)} | "
            f"{format_p(adjusted[baseline])} |" for baseline, endpoint in endpoints.items()]
    blocks.append(f"**Endpoint** — {subject}'s perplexity per byte over the baseline's, minus 1: geometric mean over "
                  f"both protocols and all lengths, per seed; mean over {seeds} seeds with its 95 % CI, two-sided "
                  "t-test, exact sign-flip test, Holm-adjusted t-test p across the baselines\n\n"
                  "| baseline | ratio − 1 [95 % CI] | p (t) | p (sign-flip) | p (Holm) |\n|---|---|---|---|---|\n"
                  + "\n".join(rows) + "\n")
    return "\n".join(blocks)


