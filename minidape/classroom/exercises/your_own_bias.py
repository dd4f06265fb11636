"""The checks of notebook 06's exercises."""

from __future__ import annotations

import torch

from . import framework  # framework.CHECK_DEVICE is read at call time (the grader sets it)
from .framework import NeedsFullMode, Wrong, _exercise
from .helpers import (
    _build,
    _choice,
    _config,
    _fresh_generator,
    _given,
    _graded_in_quick_mode,
    _gradients_of_sum,
    _is_subclass,
    _number,
    _parameter_shapes,
    _prediction_credit,
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
            hint="make it larger for near tokens than for far ones, e.g. a / (1 + (d / s)²) with a, s > 0",
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
    "a function of |m - n| only that falls with distance, e.g. a / (1 + ((m - n) / s)²) with a, s > 0 "
    "(PD, hence CPD), or -a·log(1 + |m - n|) (Kerple's); test it with md.kernels.is_cpd",
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


@_exercise(
    "06",
    "derive",
    "how much attention a bounded bias leaves on far keys",
    "with zero content scores the last query's attention is softmax of its bias row: p_d ∝ exp(b(d)) "
    "over the distances d = 0 .. T - 1; add up the p_d with d >= L",
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
        if abs(got - want) <= 1e-9 + 1e-6 * want:
            continue
        where = f"far_mass(a={a:.3g}, s={s:.3g}, L={L}, T={T}) = {got:.6g}"
        mistakes = {
            "the near keys' share (d < L), not the far keys'": (1 - want, "far keys are d >= L"),
            "your weights are the bias itself, not exp(bias): softmax exponentiates": (
                mass(bias),
                "p_d = exp(b(d)) / Σ_d' exp(b(d'))",
            ),
            "you start the far keys at d = L + 1": (mass(bias.exp(), L + 1), "d >= L: keys 0 .. T - 1 - L"),
            "you start the far keys at d = L - 1": (mass(bias.exp(), L - 1), "d >= L: keys 0 .. T - 1 - L"),
            "your distances run 1 .. T, not 0 .. T - 1": (mass(shifted.exp()), "the query's own key is at distance 0"),
        }
        for description, (value, hint) in mistakes.items():
            if abs(got - value) <= 1e-9 + 1e-6 * abs(value):
                raise Wrong(f"{where}: {description}", hint=hint)
        if not 0 <= got <= 1:
            raise Wrong(f"{where}: a share of attention lies between 0 and 1")
        raise Wrong(f"{where}, which is not the share of the softmax weights on the keys at distance >= L")


@_exercise(
    "06",
    "implement",
    "your kernel as a bias module (md.AdditiveBias)",
    "forward(q_pos, k_pos) returns (n_head, len(q_pos), len(k_pos)); use d = (q_pos[:, None] - "
    "k_pos[None, :]).clamp(min=0) for a decoder; keep per-head parameters in nn.Parameter; create new "
    "tensors on q_pos.device",
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
    "three configs equal in everything but pe and refiner: a built-in reference (e.g. kerple_log), "
    "pe='my_bias', and pe='my_bias' with refiner='dape'",
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
    "best_run = min(last_k, key=lambda name: last_k[name][LENGTHS[-1]]): the run with the lowest "
    "perplexity at the longest length",
    points=2,
)
def best_run(prediction, measured, last_k, longest):
    predicted = _choice(prediction, tuple(last_k), "best_prediction (your prediction)")
    measured = _choice(measured, tuple(last_k), "best_run (your measurement)")
    if _graded_in_quick_mode():  # the runs train the student's own bias: quick mode's 8 steps decide nothing
        raise NeedsFullMode(
            "these runs train your own bias, so only the notebook's full budget can measure them; "
            "your teacher grades this exercise with MINIDAPE_QUICK=0"
        )
    best = min(last_k, key=lambda name: last_k[name][longest])
    if measured != best:
        worst = max(last_k, key=lambda name: last_k[name][longest])
        raise Wrong(
            f"best_run = {measured!r} is not the run with the lowest perplexity at {longest}",
            hint="lower perplexity is better: use min, not max"
            if measured == worst
            else f"compare the perplexities at the longest length, {longest}",
        )
    return _prediction_credit(
        2, predicted == best, f"{best} has the lowest perplexity at {longest} ({last_k[best][longest]:.2f})"
    )
