"""The checks of notebook 06's exercises."""

from __future__ import annotations

import contextlib
import inspect
import math
import secrets
import threading
import time

import torch
from torch import nn

from . import framework  # framework.CHECK_DEVICE is read at call time (the grader sets it)
from .framework import EXERCISES, NeedsFullMode, Wrong, _exercise
from .helpers import (
    AGREE,
    _bias_with,
    _build,
    _built,
    _choice,
    _config,
    _fresh_generator,
    _given,
    _graded_in_quick_mode,
    _gradients_of_sum,
    _is_module,
    _is_subclass,
    _number,
    _parameter_shapes,
    _prediction_credit,
    _remote,
    _tensor,
)


def _decreasing(row: torch.Tensor, what: str) -> None:
    """``row[d]``, the bias at distance d = 0, 1, ...: not constant, never growing with d (where it says so)."""
    steps = row[1:] - row[:-1]
    tolerance = 1e-6 * (1 + row.abs().max().item())
    if (row.max() - row.min()).item() <= tolerance:
        raise Wrong(
            f"{what} is the same at every distance ({row[0].item():.4g}): softmax ignores a constant, so "
            f"it carries no position",
            hint="make it larger for near tokens than for far ones: a CPD kernel of notebook 02 that falls with d",
        )
    if (steps > tolerance).any():
        d = int((steps > tolerance).nonzero()[0])
        raise Wrong(
            f"{what} grows with distance (from d = {d} to d = {d + 1}: {row[d].item():.4g} -> "
            f"{row[d + 1].item():.4g}): far tokens would get more attention than near ones",
            hint="the bias should fall (or stay level) as the distance grows; check the sign of your "
            "kernel, and use the distance d = i - j >= 0",
        )


@_exercise(
    "06",
    "implement",
    "a kernel of your own, CPD, decreasing with distance",
    (
        "notebook 02's Corollary 1 and its PD kernels give you CPD kernels to start from; a bias must also "
        "fall as the distance grows",
        "write it as a function of the distance |m - n| only, check that it falls with distance, and test it "
        "with md.kernels.is_cpd before the check does",
    ),
    points=2,
)
def my_kernel(your_kernel):
    from ... import kernels

    your_kernel = _given(your_kernel, "my_kernel")
    points = torch.arange(8, dtype=torch.float64)
    values = _tensor(your_kernel(points[:, None], points[None, :]), "my_kernel(m, n)", (8, 8)).double()
    shifted = torch.as_tensor(your_kernel(points[:, None] + 5, points[None, :] + 5), dtype=torch.float64)
    if not torch.allclose(shifted, values, atol=1e-9):
        raise Wrong(
            "my_kernel(m + 5, n + 5) differs from my_kernel(m, n): the kernel must depend on m - n only",
            hint="write it as a function of the difference m - n",
        )
    if not torch.allclose(values, values.T, atol=1e-9):
        raise Wrong(
            "my_kernel(m, n) differs from my_kernel(n, m): a kernel is symmetric",
            hint="use the distance |m - n|, not the signed m - n",
        )
    distances = torch.arange(64, dtype=torch.float64)
    row = torch.as_tensor(your_kernel(distances, torch.zeros(1, dtype=torch.float64)), dtype=torch.float64)
    _tensor(row, "my_kernel(d, 0) for d = 0..63")
    _decreasing(row, "your kernel")
    if not kernels.is_cpd(your_kernel):
        raise Wrong(
            f"md.kernels.is_cpd found a point set on which it is not CPD (smallest eigenvalue on zero-sum "
            f"vectors, positions 0..31: {kernels.cpd_min_eig(your_kernel, 32):.3g})",
            hint="Corollary 1 (notebook 02): -a|d|^p and -b·log(1 + a|d|^p) are CPD for 0 < p <= 2, "
            "and PD kernels (Gaussian, Cauchy with a > 0) are CPD",
        )


# far_mass's tolerance: what a float32 computation of the share meets (any order of the sums, or 1 - the near share;
# 5 times its worst error in 16,000 draws), far below the difference an off-by-one in L makes on these draws
FAR_MASS_ABS, FAR_MASS_REL = 5e-7, 2e-5


@_exercise(
    "06",
    "derive",
    "how much attention a bounded bias leaves on far keys",
    (
        "with zero content scores the last query's attention is the softmax of its bias row: each key's weight "
        "is proportional to the exponential of its bias",
        "weigh every distance of the window, from the query's own key to the first, then take the share of "
        "the total that falls on distances of at least L",
    ),
    points=2,
)
def far_mass(your_function):
    generator = _fresh_generator()
    for _ in range(4):
        a = 0.5 + 7.5 * torch.rand(1, generator=generator, dtype=torch.float64).item()
        s = 1 + 31 * torch.rand(1, generator=generator, dtype=torch.float64).item()
        L = int(torch.randint(4, 65, (1,), generator=generator))
        T = int(torch.randint(L + 2, 4097, (1,), generator=generator))
        d = torch.arange(T, dtype=torch.float64)
        bias = a / (1 + (d / s) ** 2)
        shifted = a / (1 + ((d + 1) / s) ** 2)  # distances 1 .. T instead of 0 .. T - 1

        def mass(weights, first=L):
            return (weights[first:].sum() / weights.sum()).item()

        got = _number(_given(your_function, "far_mass")(a, s, L, T), "far_mass(a, s, L, T)")
        want = mass(bias.exp())
        if abs(got - want) <= FAR_MASS_ABS + FAR_MASS_REL * want:
            continue
        where = f"far_mass(a={a:.3g}, s={s:.3g}, L={L}, T={T}) = {got:.6g}"
        mistakes = {
            "the near keys' share (d < L), not the far keys'": (1 - want, "far keys are d >= L"),
            "your weights are the bias itself, not exp(bias): softmax exponentiates": (
                mass(bias),
                "softmax exponentiates the bias before it normalises",
            ),
            "you start the far keys at d = L + 1": (mass(bias.exp(), L + 1), "d >= L: keys 0 .. T - 1 - L"),
            "you start the far keys at d = L - 1": (mass(bias.exp(), L - 1), "d >= L: keys 0 .. T - 1 - L"),
            "your distances run 1 .. T, not 0 .. T - 1": (mass(shifted.exp()), "the query's own key is at distance 0"),
        }
        for description, (value, hint) in mistakes.items():
            if abs(got - value) <= FAR_MASS_ABS + FAR_MASS_REL * abs(value):
                raise Wrong(f"{where}: {description}", hint=hint)
        if not 0 <= got <= 1:
            raise Wrong(f"{where}: a share of attention lies between 0 and 1")
        raise Wrong(f"{where}, which is not the share of the softmax weights on the keys at distance >= L")


@_exercise(
    "06",
    "implement",
    "your kernel as a bias module (md.AdditiveBias)",
    (
        "a relative bias depends on the distance between query and key only: your kernel of 6.1, evaluated "
        "per head with parameters the model learns",
        "forward(q_pos, k_pos) returns (n_head, len(q_pos), len(k_pos)): distances by broadcasting (not below "
        "0 in a decoder), per-head nn.Parameter shaped to broadcast over them, new tensors on q_pos.device",
    ),
    points=3,
)
def my_bias(your_class):
    from ... import kernels
    from ...model import AdditiveBias

    your_class = _given(your_class, "MyBias")
    if not _is_subclass(your_class, AdditiveBias):
        raise Wrong("MyBias should be a class that subclasses md.AdditiveBias", hint="class MyBias(md.AdditiveBias)")
    n_head = 4
    module = _build(your_class, _config(n_head=n_head), "MyBias")
    q_pos, k_pos = torch.arange(5, 12, device=framework.CHECK_DEVICE), torch.arange(12, device=framework.CHECK_DEVICE)
    with torch.no_grad():
        bias = _tensor(module(q_pos, k_pos), "MyBias()(q_pos, k_pos)", (n_head, len(q_pos), len(k_pos))).cpu()
        moved = module(q_pos + 100, k_pos + 100).cpu()
        far = torch.arange(64, device=framework.CHECK_DEVICE)
        rows = module(far[-1:], far)[:, 0].flip(-1).double().cpu()  # (h, d = 0..63)
    visible = (q_pos[:, None] >= k_pos[None, :]).cpu()
    if not torch.allclose(moved[:, visible], bias[:, visible], atol=1e-5):
        raise Wrong(
            "the bias changes when every position is shifted by 100: it is not relative",
            hint="compute it from the distance q_pos[:, None] - k_pos[None, :] only, never from a position",
        )
    _tensor(rows, "the bias of query 63 against keys 0..63")
    flat = [(row.max() - row.min()).item() <= 1e-6 * (1 + row.abs().max().item()) for row in rows]
    if all(flat):
        _decreasing(rows[0], "your bias")  # names the constant (or zero) bias
    for h, row in enumerate(rows):
        if not flat[h]:  # a head may start flat; none may grow
            _decreasing(row, f"head {h}'s bias")
    for h, row in enumerate(rows[:, :32]):
        minimum = kernels.cpd_min_eig(lambda m, n, row=row: row[(m - n).abs().round().long()], 32)
        if minimum < -1e-5 * row.abs().max().item():  # float32 rounding of the bias allowed
            raise Wrong(
                f"head {h}'s bias, as the kernel b(|m - n|), is not CPD on positions 0..31 (smallest "
                f"eigenvalue on zero-sum vectors {minimum:.3g})",
                hint="use your CPD kernel from 6.1, "
                "with per-head parameters kept in the range where it is CPD (e.g. a > 0 via softplus)",
            )
    if not _parameter_shapes(module):
        raise Wrong(
            "MyBias has no learnable parameters (nn.Parameter)",
            hint="give each head its own nn.Parameter, e.g. a width per head",
        )
    gradients = _gradients_of_sum(module, q_pos, k_pos)
    if any(g is None or not torch.isfinite(g).all() for g in gradients):
        raise Wrong(
            "some parameters get no (finite) gradient from the bias",
            hint="every nn.Parameter must be used in forward, through differentiable operations",
        )


@_exercise(
    "06",
    "experiment",
    "the runs that answer 'does my bias extrapolate, and does DAPE help it?'",
    (
        "a fair comparison changes one thing at a time: the runs may differ in pe and refiner only",
        "a reference with a built-in encoding, your bias alone and your bias with DAPE, each built by "
        "config(pe, refiner)",
    ),
    points=2,
)
def my_runs(runs):
    from dataclasses import asdict

    from ...model import GPTConfig

    runs = _given(runs or None, "my_runs")
    if not isinstance(runs, dict) or not all(isinstance(cfg, GPTConfig) for cfg in runs.values()):
        raise Wrong("my_runs should be a dict of name -> md.GPTConfig", hint="use config(pe, refiner) for each run")
    pairs = {(cfg.pe, cfg.refiner) for cfg in runs.values()}
    for needed in (("my_bias", "none"), ("my_bias", "dape")):
        if needed not in pairs:
            raise Wrong(
                f"no run with pe={needed[0]!r} and refiner={needed[1]!r}",
                hint="to see what DAPE adds you need your bias both without and with it",
            )
    if not any(pe != "my_bias" for pe, _ in pairs):
        raise Wrong(
            "no reference run with a built-in encoding to compare with",
            hint="without a reference you cannot tell a good curve from a bad one: add kerple_log",
        )
    others = [{k: v for k, v in asdict(cfg).items() if k not in ("pe", "refiner")} for cfg in runs.values()]
    differing = sorted({k for other in others for k in other if other[k] != others[0][k]})
    if differing:
        raise Wrong(
            f"the configs differ in more than pe and refiner ({', '.join(differing)}): the comparison "
            f"would not be fair",
            hint="build every run with config(pe, refiner) and nothing else",
        )


@_exercise(
    "06",
    "experiment",
    "predict, then measure, which of your runs extrapolates best",
    (
        "the run that extrapolates best is the one whose perplexity stays lowest far beyond the training length",
        "compare the runs' last_k perplexities at the longest length",
    ),
    points=2,
)
def best_run(prediction, measured, last_k, longest, recomputed=None):
    """In the notebook the measurement is its own ``last_k``. The grader always binds ``recomputed`` (see
    :func:`_grader_runs`): it measures the runs itself, the verdict uses its measurement, and the ``last_k``
    handed in is only compared with it, run by run as each is measured (one far off ends the training there)."""
    predicted = _choice(prediction, tuple(last_k), "best_prediction (your prediction)")
    measured = _choice(measured, tuple(last_k), "best_run (your measurement)")
    if _graded_in_quick_mode():  # the runs train the student's own bias: quick mode's 8 steps decide nothing
        raise NeedsFullMode(
            "these runs train your own bias, so only the notebook's full budget can measure them; "
            "your teacher grades this exercise with MINIDAPE_QUICK=0"
        )
    table, source = last_k, "measured in your run"
    if recomputed is not None:
        names, longest, source, curves = recomputed()
        if set(last_k) != set(names):
            raise Wrong(
                f"your last_k holds the runs {sorted(map(str, last_k))}; my_runs (6.4) holds "
                f"{sorted(map(str, names))}, and those are the runs 6.5 measures",
                hint="train the runs of my_runs once 6.4 passes its check, and take last_k from them",
                code="runs-not-my-runs",
            )
        table = {}
        with contextlib.closing(curves):
            for run, curve in curves:
                table[run] = curve
                _agrees(run, last_k[run], curve[longest], longest, source)

    def at_longest(name):
        value = float(table[name][longest])
        return math.inf if math.isnan(value) else value

    best = min(table, key=at_longest)
    if measured != best:
        worst = max(table, key=at_longest)
        raise Wrong(
            f"best_run = {measured!r} is not the run with the lowest perplexity at {longest} "
            f"({_listed(table, longest)}, {source})",
            hint="lower perplexity is better: use min, not max"
            if measured == worst
            else f"compare the perplexities at the longest length, {longest}",
        )
    shown = (  # the notebook prints its own table above the check; the grader's measurement is shown here
        f" ({at_longest(best):.2f})" if recomputed is None else f": {_listed(table, longest)}, {source}"
    )
    return _prediction_credit(2, predicted == best, f"{best} has the lowest perplexity at {longest}{shown}")


def _listed(table: dict, longest: int) -> str:
    return ", ".join(f"{name} {float(curve[longest]):.2f}" for name, curve in table.items())


def _agrees(run: str, yours, theirs: float, longest: int, source: str) -> None:
    """The curve of ``run`` in the ``last_k`` a submission handed in is near the grader's measurement at
    ``longest``."""
    yours = yours.get(longest) if isinstance(yours, dict) else None
    if yours is None:
        raise Wrong(f"your last_k[{run!r}] holds no perplexity at {longest}, the notebook's longest length")
    yours = _number(yours, f"your last_k[{run!r}][{longest}]")
    if not abs(yours - theirs) <= AGREE * abs(theirs) + 0.01:
        raise Wrong(
            f"your last_k gives {run} a perplexity of {yours:.4g} at {longest}; {theirs:.4g} {source}",
            code="measurement-not-reproduced",
            hint="a measurement comes from the runs the notebook trains, as it trains them: re-run the "
            "notebook's cells unchanged and take the numbers from its tables, never type them in",
        )


# ------------------------------------------------------------------ 6.5 in grading: the grader's own runs
# 6.5 measures the student's own bias, so no reference run of the teacher's can stand for it, and nothing the
# submission's process computes can be trusted: its cells may patch md.train or md.evaluate, load other weights
# or type last_k in. Its re-run's models are not reused for the same reason (its md.train may be anything its
# cells made it). So the grader trains the runs itself, in its own process, with minidape's training loop and
# evaluation: each config of my_runs (6.4) at the notebook's budget and seed, scored on the notebook's tokens.
# Only the bias of a run with pe="my_bias" is the student's: a stand-in module here holds copies of MyBias's
# (6.3) parameters, which md.train's optimizer, clipping and schedule update here, and asks the student's module,
# which lives in the worker, for the bias and for its parameters' gradients, as data (_stand_in). That code runs
# where it ran before, in the sandbox; what it can change is the bias, which is the thing measured. An
# evaluation asks once per length, so the bias cannot differ from one scored window to the next.


class _StudentsBias(torch.autograd.Function):
    """A stand-in's bias as a function of its parameters: forward and backward asked of the student's module."""

    @staticmethod
    def forward(ctx, stand_in, q_pos, k_pos, *parameters):
        ctx.stand_in = stand_in
        ctx.save_for_backward(q_pos, k_pos)
        return stand_in.ask(q_pos, k_pos)

    @staticmethod
    def backward(ctx, weights):
        q_pos, k_pos = ctx.saved_tensors
        return (None, None, None, *ctx.stand_in.ask(q_pos, k_pos, weights))


def _stand_in(your_class) -> type:
    """An ``md.AdditiveBias`` class whose bias is ``your_class``'s (an answer: a handle on the worker's class, or
    a class). Each instance builds ``your_class(cfg)`` as ``md.train`` builds a model (``cfg.pe`` "my_bias", from
    the caller's random state, which it takes back as that ``__init__`` left it) and holds copies of its
    parameters; a bias asked for without gradients is asked once per positions and parameter values."""
    from ...model import AdditiveBias, GPTConfig

    class StandIn(AdditiveBias):
        grader_stand_in = True  # never a pe a submission's config may name (see _as_trained)

        def __init__(self, cfg):
            super().__init__()
            theirs = object.__new__(GPTConfig)  # the notebook's config: "my_bias" is not in the grader's registry
            vars(theirs).update({**vars(cfg), "pe": "my_bias"})
            built = _built(your_class, theirs, torch.get_rng_state())
            module, values, trainable, state = built if isinstance(built, tuple) and len(built) == 4 else [None] * 4
            if not (
                (_remote(module) or not _remote(your_class))  # data from the worker is never called here
                and _is_module(module)
                and isinstance(values, list)
                and all(isinstance(v, torch.Tensor) and v.is_floating_point() for v in values)
                and isinstance(trainable, list)
                and len(trainable) == len(values)
                and isinstance(state, torch.Tensor)
                and state.dtype == torch.uint8
            ):
                raise Wrong("MyBias(cfg), built for the grader's own training, did not come back as a module")
            torch.set_rng_state(state)
            object.__setattr__(self, "yours", module)  # not a submodule: these are its parameters
            copies = (nn.Parameter(value.clone(), requires_grad=t is True) for value, t in zip(values, trainable))
            self.copies = nn.ParameterList(copies)
            self.n_head, self.asked_for, self.asked = cfg.n_head, None, {}

        def forward(self, q_pos, k_pos):
            if torch.is_grad_enabled() and any(p.requires_grad for p in self.copies):
                return _StudentsBias.apply(self, q_pos, k_pos, *self.copies)
            values = [p.detach() for p in self.copies]  # by value: a fused optimizer step leaves _version as it was
            if self.asked_for is None or not all(map(torch.equal, values, self.asked_for)):
                self.asked_for, self.asked = [value.clone() for value in values], {}
            key = (tuple(q_pos.tolist()), tuple(k_pos.tolist()))
            if key not in self.asked:
                self.asked[key] = self.ask(q_pos, k_pos)
            return self.asked[key]

        def ask(self, q_pos, k_pos, weights=None):
            """The student's bias (without ``weights``) or its parameters' gradients, checked as they come back."""
            values = [p.detach().cpu() for p in self.copies]
            weights = None if weights is None else weights.detach().cpu().contiguous()
            got = _bias_with(self.yours, values, q_pos.cpu(), k_pos.cpu(), weights)
            if weights is None:
                shape = (self.n_head, len(q_pos), len(k_pos))
                if not (isinstance(got, torch.Tensor) and got.is_floating_point() and tuple(got.shape) == shape):
                    raise Wrong(f"MyBias()(q_pos, k_pos) should be a float tensor of shape {shape} in training")
                return got.to(q_pos.device)
            if not (
                isinstance(got, list)
                and len(got) == len(values)
                and all(g is None or (isinstance(g, torch.Tensor) and g.shape == v.shape) for g, v in zip(got, values))
            ):
                raise Wrong("the gradients of MyBias's parameters did not come back as one per parameter")
            return [None if g is None else g.to(p.device, p.dtype) for g, p in zip(got, self.copies)]

    return StandIn


_TRAINING = threading.Lock()  # held by the grader's own training of one submission's runs (see _measured)


@contextlib.contextmanager
def _registered(your_class):
    """A name the grader's registry builds a stand-in for ``your_class`` under, while it lasts: unguessable, so
    that no submission's config names another's."""
    from ...model import PE_REGISTRY

    name = f"my_bias-{secrets.token_hex(8)}"
    PE_REGISTRY[name] = _stand_in(your_class)
    try:
        yield name
    finally:
        del PE_REGISTRY[name]


def _recorded(answers: dict, name: str):
    """The answer the submission's check of exercise ``name`` passed (its checker's first parameter), or None."""
    try:
        arguments, options = answers[name]
        bound = inspect.signature(EXERCISES[name].checker).bind(*arguments, **options)
    except (TypeError, ValueError, KeyError):
        return None
    return next(iter(bound.arguments.values()), None)


def _as_trained(given, run: str, stand_in: str, your_class):
    """The grader's config of ``my_runs[run]``: the same settings, with the stand-in's name for "my_bias"; only
    minidape's own encodings and refiners besides."""
    from dataclasses import fields

    from ...model import PE_REGISTRY, REFINER_REGISTRY, AdditiveBias, GPTConfig, _builtin

    settings = {f.name: vars(given).get(f.name, f.default) for f in fields(GPTConfig)}
    pes = settings["pe"].split(",") if isinstance(settings["pe"], str) else []
    for kind, names, registry in (("pe", pes, PE_REGISTRY), ("refiner", [settings["refiner"]], REFINER_REGISTRY)):
        for name in names:
            known = name in registry and _builtin(registry[name]) and not hasattr(registry[name], "grader_stand_in")
            if not (known or (kind == "pe" and name == "my_bias")):
                raise Wrong(
                    f"my_runs[{run!r}] has {kind}={name!r}: the grader trains minidape's own {kind}s and your "
                    f"my_bias (6.3), nothing else registered in the notebook",
                    hint="compare your bias with a built-in encoding such as kerple_log, and refine with 'dape'",
                )
    if "my_bias" in pes and not _is_subclass(your_class, AdditiveBias):
        raise Wrong(
            f"my_runs[{run!r}] trains pe='my_bias', but 6.3's check did not record an md.AdditiveBias class",
            hint="keep exercises.check('my_bias', MyBias) as the notebook has it",
        )
    try:
        return GPTConfig(**{**settings, "pe": ",".join(stand_in if pe == "my_bias" else pe for pe in pes)})
    except (TypeError, ValueError) as error:
        raise Wrong(f"my_runs[{run!r}] is not a config the grader can train: {error}") from None


def _grader_runs(answers: dict, channel):
    """What the grader binds to best_run's ``recomputed``: a function giving (the names of the runs of 6.4, the
    longest length, where the measurement comes from, and an iterator that trains each run with the bias of
    6.3 as notebook 06 trains it and scores it as it does: ``(run, {length: perplexity})``, one at a time).
    ``channel``: the checks' way into the worker; its ``deadline`` is the end of their time."""

    def recompute():
        from ...model import GPTConfig
        from ..notebook import books_budget

        runs = _recorded(answers, "my_runs")
        if not (isinstance(runs, dict) and runs and all(isinstance(cfg, GPTConfig) for cfg in runs.values())):
            raise Wrong(
                "6.5 measures the runs of 6.4, and my_runs is not a dict of configs: the grader has no run to train",
                hint="fill in my_runs (6.4) first",
            )
        budget = books_budget(quick=False)  # the notebook's cells: BUDGET = notebook.books_budget(QUICK)
        source = (
            f"recomputed by the grader, who trained each run of my_runs as the notebook does ({budget}, seed 0) "
            f"and scored it with last_k on the notebook's validation tokens"
        )
        return list(runs), budget.lengths[-1], source, _measured(runs, _recorded(answers, "my_bias"), budget, channel)

    return recompute


def _measured(runs: dict, your_class, budget, channel):
    """``(run, last_k curve)`` for each run, trained and scored by the notebook's cells (for ``_grader_runs``),
    one submission at a time: md.train seeds torch's one random state, which the grader's threads share. The
    wait for that turn is the grader's, so it extends the checks' time."""

    def in_time(*_) -> dict:  # md.train's metrics, read at every logged step: the checks' clock
        if time.monotonic() > channel.deadline:
            raise Wrong(
                "the grader's own training of your runs did not end within the checks' time limit",
                hint="your teacher can grade with a larger --timeout",
                code="recomputation-out-of-time",
            )
        return {}

    waiting = time.monotonic()
    with _TRAINING, _registered(your_class) as stand_in:
        channel.deadline += time.monotonic() - waiting
        configs = {run: _as_trained(given, run, stand_in, your_class) for run, given in runs.items()}
        for run, cfg in configs.items():
            yield run, _notebook_run(cfg, budget, in_time)


def _notebook_run(cfg, budget, metrics=None) -> dict[int, float]:
    """Notebook 06's training cell and ``last_k`` cell for one config: its ``last_k`` curve."""
    from ...lab.data import load_corpus
    from ...lab.evaluate import perplexity_by_length
    from ...lab.train import train

    train_tokens, val_tokens = load_corpus("austen", "train"), load_corpus("austen", "val")
    model, _ = train(
        cfg,
        train_tokens,
        val_data=val_tokens,
        steps=budget.steps,
        batch_size=budget.batch,
        lr=budget.lr,
        eval_every=max(4, budget.steps // 8),
        eval_windows=budget.val_windows,
        seed=0,
        progress=False,
        device="cpu",
        metrics=metrics,
    )
    return perplexity_by_length(model, val_tokens, budget.lengths, n_windows=budget.eval_windows)


framework.MEASURED_BY_GRADER["best_run"] = _grader_runs
