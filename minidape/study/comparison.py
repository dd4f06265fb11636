"""`compare`: a model of one's own (a registered name or FILE.py:ClassName, with any refiner) through the study's
protocol against baselines, paired by seed, judged by the endpoints the papers state.

Every model is written in one syntax, ``PE[+REFINER[:OPTION]...]``: ``kerple_log``, ``kerple_log+dape``,
``kerple_log+conv:5`` (a 1x5 kernel, also ``:k=5``), ``kerple_log+dape:w=64`` (hidden width),
``kerple_log+dape:w=matched`` (DAPE's MLP at the parameter count of the 1x3 conv refiner, claim C3's control); PE
and REFINER are registered names or ``FILE.py:ClassName``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import sys
import time
from pathlib import Path

import torch

from ..lab.checkpoints import CHECKPOINT_NAME
from ..lab.evaluate import PROTOCOLS
from ..lab.leakage import decoder_leaks
from ..lab.user_code import register_class, source_file
from ..model import PE_NAMES, PE_REGISTRY, REFINER_NAMES, REFINER_REGISTRY, layer_encodings, pe_names
from ..threads import api_entry
from ..utils import atomic_path, holds_out_folder, resolve_device
from .budgets import DEFAULT_SEEDS, Budget, check_corpus_fits, eval_lengths, lm_config, resolve_budget
from .claims import FLAT_MARGIN, LEAKY_REFINER, MATCHED_WIDTH, MODELS, UNIGRAM_SHARE
from .endpoints import degradation_length, log_ratio_units
from .figures import compare_figure
from .report import machine, package_version, unigram_perplexity
from .runs import (
    Progress,
    as_float,
    check_seeds,
    check_settings,
    clock,
    corpus_fingerprint,
    one_step,
    perplexity_summary,
    refuse_foreign_results,
    reusable_run,
    run_record,
    slug,
    train_and_evaluate,
    write_json,
)
from .statistics import (
    ALPHA,
    Cell,
    Endpoint,
    format_mean_std,
    format_p,
    holm,
    ratio_text,
    sign_flip_floor,
    t_test_power,
)

# The default baselines. Any registered PE is a baseline by its name (`--against fox`); one joins the defaults
# by adding its name here.
DEFAULT_BASELINES = ("alibi", "kerple_log")
POWER_EFFECT = 0.05  # the effect size (a 5 % ratio) whose detection power is reported under 5 seeds
ENDPOINT_NAMES = {
    "in": "at the training length",
    "beyond": "beyond the training length",
    "longest": "at the longest length",
    "all": "all lengths",
}


# ----------------------------------------------------------------------------- the model syntax


def resolve_pe(pe: str) -> tuple[str, str | None]:
    """A registered PE name, several joined by commas (``GPTConfig.pe``'s per-layer spec, e.g. ``rope,none``), or
    ``path/to/file.py:ClassName`` imported and registered on the fly (`lab.user_code.register_class`); returns
    ``(name, sha256 of the file or None)``. The class must subclass ``md.AdditiveBias`` or
    ``md.DataDependentBias`` (or the other PE bases)."""
    if all(name in PE_NAMES for name in pe_names(pe)):  # with any per-layer '@' options
        return pe, None
    if ":" not in pe:
        raise ValueError(
            f"unknown pe {pe!r}; valid choices: {', '.join(PE_NAMES)}, several of them joined by "
            f"commas (cycled over the layers), or FILE.py:ClassName"
        )
    kind, name, digest = register_class(pe, "--pe")
    if kind != "pe":
        raise ValueError(
            f"--pe {pe!r}: {pe.rpartition(':')[2]} is not a subclass of md.AdditiveBias (a bias "
            f"(n_head, Tq, Tk) from positions) or md.DataDependentBias (a bias (batch, n_head, Tq, Tk) "
            f"that reads the data); see the extension API in the README"
        )
    return name, digest


def _resolve_refiner(refiner: str, spec: str) -> str:
    if refiner in REFINER_NAMES:
        return refiner
    if ":" not in refiner:
        raise ValueError(
            f"unknown refiner {refiner!r} in {spec!r}; valid choices: {', '.join(REFINER_NAMES)}, or FILE.py:ClassName"
        )
    kind, name, _ = register_class(refiner, "refiner")
    if kind != "refiner":
        raise ValueError(f"refiner {refiner!r} in {spec!r} is a positional encoding, not a refiner")
    return name


def parse_model(spec: str) -> tuple[str, dict]:
    """``PE[+REFINER[:OPTION]...]`` -> (its label, `GPTConfig` overrides); see the module's docstring."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"a model must be written PE[+REFINER[:OPTION]...]; got {spec!r}")
    if spec in MODELS and MODELS[spec].get("refiner") != LEAKY_REFINER:  # a study model by its label: FoX, ...
        return spec, dict(MODELS[spec])
    pe_part, plus, refiner_part = spec.partition("+")
    overrides = {"pe": resolve_pe(pe_part)[0], "refiner": "none"}
    if not plus:
        return overrides["pe"], overrides
    parts = refiner_part.split(":")
    file_form = parts[0].endswith(".py") and len(parts) > 1
    refiner, options = (":".join(parts[:2]), parts[2:]) if file_form else (parts[0], parts[1:])
    overrides["refiner"] = _resolve_refiner(refiner, spec)
    label = f"{overrides['pe']}+{overrides['refiner']}"
    for option in options:
        key, _, value = option.rpartition("=") if "=" in option else ("k", "=", option)
        if key == "w" and value == "matched":
            if overrides["refiner"] != "dape":
                raise ValueError(
                    f"w=matched in {spec!r}: only DAPE's MLP (refiner dape) is matched to the 1x3 "
                    f"conv refiner's parameter count"
                )
            overrides["refiner_width"], label = MATCHED_WIDTH, f"{label}:w=matched"
        elif key in ("k", "w") and value.isdigit() and int(value) > 0:
            overrides["refiner_kernel" if key == "k" else "refiner_width"] = int(value)
            label = f"{label}:{key}={int(value)}"
        else:
            raise ValueError(
                f"bad refiner option {option!r} in {spec!r}; valid: K or k=K (odd kernel size), "
                f"w=W (hidden width), w=matched (DAPE at the 1x3 conv refiner's parameter count)"
            )
    return label, overrides


def _sources(overrides: dict) -> dict:
    """sha256 of the users' files behind a model's PE and refiner (recorded with each run)."""
    paths = {
        kind: [
            path
            for entry in overrides.get(kind, "none").split(",")  # pe: a per-layer spec too
            if (path := source_file(registry[entry.partition("@")[0]]))  # a layer's name before its @options
        ]
        for kind, registry in (("pe", PE_REGISTRY), ("refiner", REFINER_REGISTRY))
    }
    return {
        kind: hashlib.sha256(b"".join(Path(path).read_bytes() for path in found)).hexdigest()
        for kind, found in paths.items()
        if found
    }


def study_budget(budget: str, device: torch.device, train_length: int | None = None, lengths=None, **knobs) -> Budget:
    """The named budget with the knobs given (None keeps the budget's): model size, steps, batch, lr, the
    training length and the evaluation lengths (the training length, multiples of it beyond it, and any
    lengths below it that divide it: the all-lengths endpoint pools them all)."""
    settings = resolve_budget(budget, device)
    for name, value in knobs.items():
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or value <= 0
            or (name != "lr" and not isinstance(value, int))
        ):
            raise ValueError(f"{name} must be a positive {'number' if name == 'lr' else 'integer'}; got {value!r}")
    settings = dataclasses.replace(settings, **{name: value for name, value in knobs.items() if value is not None})
    train_length = train_length or settings.train_lengths[0]
    factors = settings.eval_factors
    if lengths is not None:
        bad = [
            length
            for length in lengths
            if isinstance(length, bool)
            or not isinstance(length, int)
            or length <= 0
            or (length % train_length if length > train_length else train_length % length)
        ]
        if bad or train_length not in lengths or max(lengths) <= train_length:
            raise ValueError(
                f"lengths must include the training length {train_length} and go beyond it (the in-length and "
                f"beyond-length endpoints need both), longer lengths multiples of it, shorter ones dividing it; "
                f"got {list(lengths)}"
            )
        factors = tuple(
            length // train_length if length >= train_length else 1 / (train_length // length)
            for length in sorted(set(lengths))
        )
    return dataclasses.replace(settings, train_lengths=(train_length,), eval_factors=factors)


# ----------------------------------------------------------------------------- the endpoints


def compare_endpoints(
    perplexity: dict, subject: str, baselines: list[str], train_length: int, margin: float
) -> list[dict]:
    """Every test one comparison reports, Holm-adjusted together: per baseline the subject's log ratio at the
    training length, beyond it (the mean over every longer length), at the longest length (16x, the papers'
    headline, or the longest evaluated) and over all lengths (two-sided t-tests); per model its degradation (the
    longest length against the training length) with the equivalence test (TOST) against ``±margin``."""
    tests = []
    for baseline in baselines:
        for where in ENDPOINT_NAMES:
            units = log_ratio_units(perplexity[subject], perplexity[baseline], train_length, where)
            tests.append(
                {
                    "what": f"{subject} vs {baseline}, {ENDPOINT_NAMES[where]}",
                    "baseline": baseline,
                    "endpoint_kind": where,
                    "endpoint": Endpoint(units, "below"),
                }
            )
    for label, curves in perplexity.items():
        units = log_ratio_units(curves, None, train_length, "degradation")
        tests.append(
            {
                "what": f"degradation of {label}",
                "model": label,
                "endpoint_kind": "degradation",
                "endpoint": Endpoint(units, "within", math.log1p(margin)),
            }
        )
    for test, p_holm in zip(tests, holm([test["endpoint"].p for test in tests])):
        test["p_holm"] = p_holm
    return tests


def _baseline_verdict(tests: list[dict], baseline: str, subject: str, longest: int) -> str:
    """The verdict on one baseline: the beyond-length endpoint's, unless the longest length says otherwise (a
    mean over 2x-16x can put a gain at 2x against a collapse at 16x and read "no difference")."""
    kinds = {test["endpoint_kind"]: test for test in tests if test.get("baseline") == baseline}
    beyond, at_longest, at_training = kinds["beyond"], kinds["longest"], kinds["in"]

    def side(test: dict) -> str | None:  # "lower (better)", "higher (worse)", or None: no significant difference
        if not test["p_holm"] < ALPHA:
            return None
        return "lower (better)" if test["endpoint"].estimate < 0 else "higher (worse)"

    def evidence(test: dict) -> str:
        return f"{ratio_text(test['endpoint'])}, Holm {format_p(test['p_holm'])}"

    what = f"{subject} vs {baseline} (beyond-length endpoint)"
    beyond_says = (
        f"{side(beyond)} perplexity beyond the training length"
        if side(beyond)
        else "no significant difference beyond the training length"
    )
    if side(at_longest) is None or side(at_longest) == side(beyond):
        return f"{what}: {beyond_says} ({evidence(beyond)})"
    worse_at_longest = at_longest["endpoint"].estimate > 0
    near = "better" if worse_at_longest else "worse"
    if side(at_training) is not None and (at_training["endpoint"].estimate < 0) == worse_at_longest:
        split = f" ({near} at the training length: {evidence(at_training)})"
    else:
        split = ""
    return (
        f"{what}: the endpoints disagree: {beyond_says} on average ({evidence(beyond)}), but "
        f"{side(at_longest)} at the longest length, {longest} ({evidence(at_longest)}): "
        f"{near} near the training length, {'worse' if worse_at_longest else 'better'} at the longest{split}"
    )


def _degradation_verdict(test: dict, margin: float, longest: int, train_length: int) -> str:
    endpoint, label = test["endpoint"], test["model"]
    evidence = f"{ratio_text(endpoint)}, Holm {format_p(test['p_holm'])}"
    what = f"{label} (degradation endpoint, {longest} vs {train_length}, margin ±{margin:.0%})"
    if not test["p_holm"] < ALPHA:
        return f"{what}: inconclusive ({evidence})"
    if endpoint.supports:
        return f"{what}: stays within ±{margin:.0%} (equivalence shown; {evidence})"
    return f"{what}: {'worse' if endpoint.estimate > 0 else 'better'} by more than the margin ({evidence})"


# ----------------------------------------------------------------------------- compare


@holds_out_folder()
@api_entry
def compare(
    pe: str,
    against=DEFAULT_BASELINES,
    seeds: int = DEFAULT_SEEDS,
    corpus: str = "austen",
    out=None,
    *,
    budget: str = "default",
    steps: int | None = None,
    batch_size: int | None = None,
    lr: float | None = None,
    n_layer: int | None = None,
    n_embd: int | None = None,
    n_head: int | None = None,
    train_length: int | None = None,
    lengths=None,
    margin: float = FLAT_MARGIN,
    device: str | torch.device = "auto",
    progress: bool = True,
    overwrite: bool = False,
    rerun: bool = False,
    keep_checkpoints: bool = False,
    allow_leakage: bool = False,
    step: int | str | None = None,
) -> dict:
    """Put a model through the study's protocol against baselines; returns the table and the statistics.

    - ``pe``: the model under test and ``against``: the baselines, each ``PE[+REFINER[:OPTION]...]`` (see the
      module's docstring; a PE or refiner may be ``path/to/file.py:ClassName``, registered on the fly).
    - Each model is trained ``seeds`` times (seed s: the same initialisation and batches for every model) on
      ``corpus`` (a name or a .txt/.gz path) with the budget's settings, each knob given overriding it, and
      evaluated at ``lengths`` (default: the training length x 1, 2, 4, 8, 16) with both protocols.
    - Endpoints (`compare_endpoints`): per baseline at / beyond / over all lengths; per model its degradation
      with an equivalence test against ``±margin`` (0.10 = ±10 %); Holm across all of them. Fewer than 5
      seeds print what they cannot show.
    - Returns ``{"subject", "table", "perplexity": {label: {protocol: {length: [ppl per seed]}}},
      "p_values": {baseline: {protocol: {length: p}}}, "endpoints": [...], "verdicts": [...]}``; with ``out``
      also writes ``compare.md``, ``compare.json``, ``compare.png`` and one JSON per run under ``out/runs``
      recording the corpus's sha256 and the run's full configuration: a run is reused only when both match,
      refused otherwise (naming the file and what differs) unless ``rerun``. ``keep_checkpoints`` keeps each
      trained run's model in ``out/runs/MODEL/seedN/checkpoint.pt``.
    - A model that reads the future (``md.check_causal``) is refused before any training, unless
      ``allow_leakage=True``: then the report's header says which models leak.
    - ``step`` splits the comparison for a cluster's scheduler, as `reproduce`'s does: ``"list"`` returns
      ``{"runs": [names]}``, N trains and evaluates run N alone into ``out``, ``"report"`` writes the report from
      the runs done (refused while any is missing).
    """
    started = time.perf_counter()
    device = resolve_device(device)
    settings = study_budget(
        budget,
        device,
        train_length=train_length,
        lengths=lengths,
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
    )
    seeds = check_seeds(seeds)
    if not 0 < margin < 1:
        raise ValueError(f"margin must be a fraction between 0 and 1 (0.10 = ±10 %); got {margin!r}")
    if isinstance(against, str):
        against = (against,)
    subject, subject_overrides = parse_model(pe)
    models = {subject: subject_overrides}
    for spec in against:
        label, overrides = parse_model(spec)
        models.setdefault(label, overrides)
    baselines = [label for label in models if label != subject]
    if not baselines:
        raise ValueError(f"against must name at least one baseline other than {pe}; got {list(against)}")
    train_length = settings.train_lengths[0]
    configs = {label: lm_config(settings, train_length, overrides) for label, overrides in models.items()}
    leaking = [label for label, cfg in configs.items() if decoder_leaks(cfg, allow_leakage)]
    refuse_foreign_results(out, overwrite)
    check_corpus_fits(corpus, settings, (train_length,))
    fingerprint = corpus_fingerprint(corpus)
    out = Path(out) if out is not None else None
    if out is not None:
        check_settings(out, {"command": "compare"})  # the runs themselves say what they were made with
    # Every run file already in out is checked before any training: reused, or refused, or (rerun) made again.
    plan = []
    for label, cfg in configs.items():
        for seed in range(seeds):
            record = run_record(cfg, fingerprint, settings, seed, _sources(models[label]))
            path = out / "runs" / slug(label) / f"seed{seed}.json" if out is not None else None
            plan.append((label, seed, record, path, reusable_run(path, record, rerun) if path is not None else None))
    if seeds < DEFAULT_SEEDS:
        print(
            f"warning: {seeds} seeds (fewer than {DEFAULT_SEEDS}): the exact sign-flip test cannot go below "
            f"p = {sign_flip_floor(seeds):.3g} (two-sided), so it cannot show an effect at α = {ALPHA}; the "
            f"t-test's power for a {POWER_EFFECT:.0%} effect at the observed spread is printed with the results",
            file=sys.stderr,
            flush=True,
        )
    names = [f"{label} seed {seed}" for label, seed, *_ in plan]
    if step is not None:
        if out is None:
            raise ValueError(f"step={step!r} needs out: the folder the runs of the comparison share")
        done = [result is not None for *_, result in plan]
        chosen = one_step(step, names, done, [seed for _, seed, *_ in plan], out)
        if chosen is None:
            return {"runs": names}
        if isinstance(step, int):
            plan = [plan[step]]
    meter = Progress(len(plan), progress)
    if progress and not isinstance(step, int):
        print(
            f"minidape compare on {device}: {', '.join(models)}; {seeds} seeds x {settings.steps} steps at "
            f"length {train_length} on {corpus} ({len(plan)} runs) -> {out or '(not saved)'}",
            flush=True,
        )
    runs: dict[str, list[dict]] = {label: [] for label in models}
    for label, seed, record, path, result in plan:
        if result is not None:
            meter.report(f"{label} seed {seed}", None)
        else:
            keep = path.with_suffix("") if keep_checkpoints and path is not None else None
            if path is not None and not keep_checkpoints:
                _drop_earlier_checkpoint(path.with_suffix("") / CHECKPOINT_NAME, progress)
            result = train_and_evaluate(
                configs[label],
                str(corpus),
                settings,
                seed,
                device,
                allow_leakage=label in leaking,
                progress=progress,
                keep=keep,
            )
            result = {"label": label, "run": record, **result}
            if path is not None:
                write_json(path, result)
            meter.report(
                f"{label} seed {seed}", result["train_seconds"] + result["eval_seconds"], perplexity_summary(result)
            )
        runs[label].append(result)
    if isinstance(step, int):
        return {"runs": [names[step]]}
    perplexity = {
        label: {protocol: _seed_lists(results, protocol) for protocol in PROTOCOLS} for label, results in runs.items()
    }
    cells = {
        baseline: {
            protocol: {
                length: Cell(
                    f"{protocol} {length}",
                    perplexity[subject][protocol][length],
                    perplexity[baseline][protocol][length],
                )
                for length in perplexity[subject][protocol]
            }
            for protocol in PROTOCOLS
        }
        for baseline in baselines
    }
    p_values = {
        baseline: {
            protocol: {length: cell.p() for length, cell in by_length.items()}
            for protocol, by_length in by_protocol.items()
        }
        for baseline, by_protocol in cells.items()
    }
    tests = compare_endpoints(perplexity, subject, baselines, train_length, margin)
    longest = degradation_length(train_length, perplexity[subject][PROTOCOLS[0]])
    verdicts = [_baseline_verdict(tests, baseline, subject, longest) for baseline in baselines] + [
        _degradation_verdict(test, margin, longest, train_length) for test in tests if "model" in test
    ]
    unigram = unigram_perplexity(corpus)
    notes = _notes(perplexity, tests, seeds, train_length, unigram, corpus)
    table = _compare_table(perplexity, cells, tests, subject, train_length, seeds, margin, longest)
    text = f"{table}\n" + "".join(f"- {line}\n" for line in verdicts) + f"\n{notes}"
    if progress:
        print(text, flush=True)
    payload = {
        "subject": subject,
        "baselines": baselines,
        "leaking": leaking,
        "perplexity": perplexity,
        "p_values": p_values,
        "endpoints": _endpoints_json(tests),
        "verdicts": verdicts,
        "settings": dataclasses.asdict(settings),
        "seeds": seeds,
        "margin": margin,
        "corpus": str(corpus),
        "corpus_sha256": fingerprint["sha256"],
        "corpus_bytes": fingerprint["bytes"],
        "unigram_perplexity": unigram,
        "budget": budget,
        "minidape": package_version(),
    }
    if out is not None:
        details = (
            f"minidape {package_version()} on {device.type} ({machine()}); wall time "
            f"{clock(time.perf_counter() - started)}, {meter.timed} of {meter.total} runs trained by this "
            f"invocation. Corpus {corpus}: {fingerprint['bytes']} bytes, sha256 {fingerprint['sha256']}. "
            f"{seeds} seeds x {settings.steps} steps of {settings.batch_size} windows, lr {settings.lr}, at "
            f"length {train_length} ({settings.n_layer} layers, n_embd {settings.n_embd}, {settings.n_head} "
            f"heads, budget {budget}); evaluated at "
            f"{', '.join(map(str, eval_lengths(settings, train_length)))}.\n"
        )
        per_layer = [
            f"{label}: " + ", ".join(f"layer {layer} {name}" for layer, name in enumerate(layer_encodings(cfg)))
            for label, cfg in configs.items()
            if "," in cfg.pe
        ]
        if per_layer:  # a per-layer spec shorter than the model is cycled: say what each layer got
            details += f"Encodings per layer: {'; '.join(per_layer)}.\n"
        if leaking:
            details = (
                f"> **Leakage experiment (allow_leakage): {', '.join(leaking)} read"
                f"{'s' if len(leaking) == 1 else ''} the future** (md.check_causal fails): their "
                f"perplexities and p-values do not measure language modelling.\n\n{details}"
            )
        header = f"# {subject} against {', '.join(baselines)}\n\n{details}"
        with atomic_path(out / "compare.md") as tmp:
            tmp.write_text(f"{header}\n{text}")
        write_json(out / "compare.json", payload)
        compare_figure(perplexity, subject, train_length, seeds, out / "compare.png")
        if progress:
            print(f"wrote {out / 'compare.md'}, {out / 'compare.json'} and {out / 'compare.png'}")
    return {**payload, "table": table, "text": text}


def _drop_earlier_checkpoint(checkpoint: Path, progress: bool) -> None:
    """A run trained again (`rerun`) without `keep_checkpoints`: an earlier compare's checkpoint of it was trained
    on the old corpus or configuration, and would lie beside the new run's file as if it were its model."""
    if checkpoint.is_file():
        checkpoint.unlink()
        if progress:
            print(f"removed {checkpoint}: the model of the run trained again (keep it with --keep-checkpoints)")


def _seed_lists(results: list[dict], protocol: str) -> dict[int, list[float]]:
    """{length: [perplexity per seed]} of one model's runs: a run read back from its file has its lengths as
    JSON's strings, a run trained now as integers; a compare that mixes both (more seeds) keys them all by int."""
    curves = [
        {int(length): as_float(value) for length, value in run["perplexity"][protocol].items()} for run in results
    ]
    return {length: [curve[length] for curve in curves] for length in curves[0]}


def _notes(perplexity: dict, tests: list[dict], seeds: int, train_length: int, unigram: float, corpus) -> str:
    """The reference level of byte frequencies, the models that did not get below it, and (under 5 seeds)
    what the seeds cannot show."""
    stuck = [
        label
        for label, curves in perplexity.items()
        if sum(curves["nonoverlap"][train_length]) / seeds > UNIGRAM_SHARE * unigram
    ]
    lines = [
        f"Byte frequencies alone (no context) give a perplexity per byte of {unigram:.2f} on {corpus}'s "
        f"validation split: no model should be above it. "
        + (
            f"Above {UNIGRAM_SHARE:.0%} of it at the training length (nonoverlap), i.e. learned little more "
            f"than byte frequencies, so their curves say little about extrapolation: {', '.join(stuck)}."
            if stuck
            else f"Every model ends training below {UNIGRAM_SHARE:.0%} of it."
        )
    ]
    if seeds < DEFAULT_SEEDS:
        import numpy as np

        powers = []
        for test in tests:
            if test.get("endpoint_kind") == "beyond":
                spread = float(np.std(test["endpoint"].values, ddof=1))
                powers.append(f"{test['baseline']} {t_test_power(spread, seeds, math.log1p(POWER_EFFECT)):.0%}")
        lines.append(
            f"With {seeds} seeds the sign-flip test cannot go below p = {sign_flip_floor(seeds):.3g}; the "
            f"t-test's power to detect a {POWER_EFFECT:.0%} difference beyond the training length at the "
            f"observed spread (α = {ALPHA}, before Holm): {', '.join(powers)}. Use {DEFAULT_SEEDS} seeds "
            "or more."
        )
    return "\n\n".join(lines) + "\n"


def _endpoints_json(tests: list[dict]) -> list[dict]:
    return [
        {
            "what": test["what"],
            "endpoint": test["endpoint_kind"],
            **({"baseline": test["baseline"]} if "baseline" in test else {"model": test["model"]}),
            "units": test["endpoint"].values,
            "ratio_minus_1": math.expm1(test["endpoint"].estimate),
            "ci95": [math.expm1(test["endpoint"].low), math.expm1(test["endpoint"].high)],
            "p_t": test["endpoint"].p,
            "p_sign_flip": test["endpoint"].p_sign_flip,
            "p_holm": test["p_holm"],
        }
        for test in tests
    ]


def _compare_table(
    perplexity: dict,
    cells: dict,
    tests: list[dict],
    subject: str,
    train_length: int,
    seeds: int,
    margin: float,
    longest: int,
) -> str:
    """Per protocol: mean ± std for every model at every length and, per baseline, the subject's signed
    difference with the paired t-test's p; then every endpoint with its tests."""
    blocks = []
    for protocol in PROTOCOLS:
        lengths = list(perplexity[subject][protocol])
        header = ["model"] + [f"{length}" + (" (train)" if length == train_length else "") for length in lengths]
        lines = [
            f"**{protocol}** — perplexity per byte, mean ± std over {seeds} seeds; then {subject} against each "
            "baseline: signed difference (% of perplexity per byte, geometric mean over seeds) and the p of the "
            "paired t-test on log perplexity (not adjusted, descriptive)",
            "",
            "| " + " | ".join(header) + " |",
            "|---|" + "---:|" * len(lengths),
        ]
        for label, curves in perplexity.items():
            lines.append(
                "| " + " | ".join([label] + [format_mean_std(curves[protocol][length]) for length in lengths]) + " |"
            )
        for baseline, by_protocol in cells.items():
            lines.append(
                f"| vs {baseline} | " + " | ".join(by_protocol[protocol][length].text() for length in lengths) + " |"
            )
        blocks.append("\n".join(lines) + "\n")
    rows = [
        f"| {test['what']} | {ratio_text(test['endpoint'])} | {format_p(test['endpoint'].p)} | "
        f"{format_p(test['endpoint'].p_sign_flip)} | {format_p(test['p_holm'])} |"
        for test in tests
    ]
    blocks.append(
        f"**Endpoints** — per seed, the mean over both protocols of a log ratio of perplexity per byte, shown as "
        f"ratio − 1: {subject} over each baseline at the training length ({train_length}), beyond it (every longer "
        f"length) and over all lengths (two-sided t-test against 0); each model's degradation, its perplexity at "
        f"{longest} over that at {train_length} (equivalence test, TOST, against ±{margin:.0%}, i.e. a log ratio "
        f"within ±log {1 + margin:g}; the one-sided test beyond the margin when the estimate lies outside it). "
        f"Mean over {seeds} seeds with its 95 % CI, the t-test p, the exact sign-flip test of the same hypothesis, "
        f"and Holm's adjustment across the family of all {len(tests)} tests below.\n\n"
        "| endpoint | ratio − 1 [95 % CI] | p (t) | p (sign-flip) | p (Holm) |\n|---|---|---|---|---|\n"
        + "\n".join(rows)
        + "\n"
    )
    return "\n".join(blocks)
