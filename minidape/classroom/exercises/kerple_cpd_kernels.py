"""The checks of notebook 02's exercises."""

from __future__ import annotations

import math
from functools import partial

import torch

from .framework import Credit, Wrong, _exercise
from .helpers import _compare, _draw, _fresh_generator, _given, _number, _pe_module


@_exercise(
    "02",
    "derive",
    "cᵀKc for the kernel -|m-n|² and zero-sum c, in closed form",
    (
        "expand the square: cᵀKc splits into double sums, and a double sum whose term is a product of "
        "something of i and something of j is a product of two single sums",
        "write each double sum as such a product; every factor that is the sum of the c's is 0 here, so only "
        "one of the terms survives",
    ),
    points=2,
)
def square_quadratic_form(your_function):
    generator = _fresh_generator()
    for n in (3, 8, 20):
        x = torch.randn(n, generator=generator, dtype=torch.float64) * 5
        c = torch.randn(n, generator=generator, dtype=torch.float64)
        c = c - c.mean()  # zero-sum
        want = (c @ -((x[:, None] - x[None, :]) ** 2) @ c).item()
        # float32 (torch's default dtype) is a right answer too: allow its rounding of the terms' sum
        tolerance = 1e-8 * max(1.0, abs(want)) + 1e-6 * (c.abs() @ (x[:, None] - x[None, :]) ** 2 @ c.abs()).item()
        answer = _given(your_function, "square_quadratic_form")
        got = _number(answer(x.clone(), c.clone()), "square_quadratic_form(x, c)")
        if abs(got - want) <= tolerance:
            continue
        where = f"for {n} random points and a random zero-sum c your form gives {got:.6g}"
        ratio = got / want if want else math.inf
        named = {
            -1.0: (
                "which is minus cᵀKc: the sign is wrong",
                "-|m-n|² is CPD, so cᵀKc >= 0 on zero-sum c; recheck the sign of the cross term",
            ),
            0.5: ("which is half of cᵀKc", "the cross term -2x_i x_j is summed over all pairs (i, j)"),
            2.0: ("which is twice cᵀKc", "the cross term -2x_i x_j is summed once over all pairs (i, j)"),
        }
        for value, (what, hint) in named.items():
            if abs(ratio - value) < 1e-6:
                raise Wrong(f"{where}, {what}", hint=hint)
        shifted = _number(answer(x + 3.0, c.clone()), "square_quadratic_form(x + 3, c)")
        if abs(shifted - got) > tolerance:
            raise Wrong(
                f"{where}; it changes by {shifted - got:.3g} (to {shifted:.10g}) when every x_i moves by 3, "
                f"but K depends on differences only, so cᵀKc cannot",
                hint="terms like Σ c_i x_i² must cancel: use Σ c_i = 0",
            )
        raise Wrong(f"{where}, which is not cᵀKc")


# Kernels handed to answers: module-level functions, so that they travel to another process (pickle) as they are.
def _triangle_kernel(m, n):
    return -(m - n).abs()


def _log_kernel(m, n):
    return -torch.log1p((m - n).abs())


def _power_kernel(scale: float, power: float):
    def kernel(m, n):  # travels by its code and closure (the grader's pickler)
        return -scale * (m - n).abs() ** power

    return kernel


def _log_kernel_at(rate: float):
    def kernel(m, n):
        return -torch.log1p(rate * (m - n).abs())

    return kernel


def _gaussian_kernel(m, n):
    return torch.exp(-(((m - n) / 4.0) ** 2))


@_exercise(
    "02",
    "implement",
    "the geometric search for Kerple's shift c",
    (
        "c + K is positive semi-definite once c outweighs the most negative directions of K; the search tries "
        "the powers of 2 from 1 upwards and returns the first that works",
        "test a candidate by the smallest eigenvalue of c + K, allowing the rounding tolerance the notebook "
        "states; md.kernels.gram and md.kernels.smallest_eigenvalue do the linear algebra",
    ),
    points=2,
)
def find_shift(your_function):
    from ... import kernels

    generator = _fresh_generator()

    n = partial(_draw, generator)
    # kernels with parameters drawn afresh: a table of answers cannot hold them all
    scale, power, rate = (float(x) for x in 0.5 + 3.5 * torch.rand(3, generator=generator))
    power = 0.2 + power / 4 * 1.8  # in (0.2, 2]: CPD
    cases = [
        (f"-{scale:.3g}·|m-n|^{power:.3g}", _power_kernel(scale, power), n(8, 48)),
        (f"-log(1+{rate:.3g}·|m-n|)", _log_kernel_at(rate), n(16, 96)),
        ("-|m-n|^1.5", _power_kernel(1.0, 1.5), n(8, 24)),
        ("exp(-((m-n)/4)²)", _gaussian_kernel, n(4, 32)),
    ]  # positive definite: its shift is c = 1
    for label, kernel, size in cases:
        got = _number(_given(your_function, "find_shift")(kernel, size), "find_shift(kernel, n)")
        want = kernels.pd_shift(kernel, size)
        if got == want:
            continue
        shifted = kernels.gram(kernel, size) + got
        psd = kernels.smallest_eigenvalue(shifted) >= -1e-10 * shifted.abs().max().item()
        where = f"for {label} on 0..{size - 1} you found c = {got:g} (c + K is {'PSD' if psd else 'not PSD'} there)"
        if got <= 0:
            raise Wrong(f"{where}: c must be positive", hint="start at c = 1, not 0: doubling 0 stays 0")
        if got != 2.0 ** round(math.log2(got)):
            raise Wrong(f"{where}, not one of 1, 2, 4, 8, …", hint="start at c = 1.0 and multiply by 2 each step")
        if want == 1 and got > 1:
            raise Wrong(
                f"{where}, but c = 1 already makes c + K PSD (this kernel is positive definite): your "
                f"search never tries c = 1",
                hint="start at c = 1 and test before the first doubling",
            )
        if got == 2 * want:
            raise Wrong(
                f"{where}, but c / 2 already makes c + K PSD: one doubling too many",
                hint="test before you double: return c as soon as c + K is PSD",
            )
        if got < want:
            raise Wrong(
                f"{where}: the search stopped too early",
                hint="double while the smallest eigenvalue is "
                "below -1e-10·max|c + K|, and test the matrix c + K, not K",
            )
        raise Wrong(
            f"{where}, but a smaller power of 2 already makes c + K PSD",
            hint="compare with the rounding tolerance -1e-10·max|c + K|, not with 0",
        )


SHIFT_POINTS = 512


@_exercise(
    "02",
    "experiment",
    "predict, then measure, how Kerple's shift c grows with the number of points",
    (
        "c must outweigh the most negative entries of K on n points: how fast do the two kernels' entries fall "
        "as n grows?",
        "measure with your find_shift (or md.kernels.pd_shift) on 512 points, once per kernel",
    ),
    points=3,
)
def shift_growth(prediction, measured):
    from ... import kernels

    want = {
        name: kernels.pd_shift(kernel, SHIFT_POINTS)
        for name, kernel in (("triangle", _triangle_kernel), ("log", _log_kernel))
    }
    for value, what in ((prediction, "shift_prediction (your prediction)"), (measured, "shift_measured")):
        if _given(value, what) is not None and (not isinstance(value, dict) or set(value) != set(want)):
            raise Wrong(f"{what} should be a dict with the keys {sorted(want)}, got {value!r}")
    for name, value in want.items():
        got = _number(measured[name], f"shift_measured[{name!r}]")
        if got != value:
            raise Wrong(
                f"shift_measured[{name!r}] = {got:g} is not the c the geometric search finds on 0..{SHIFT_POINTS - 1}",
                hint="call your find_shift (or md.kernels.pd_shift) with n = 512",
            )
    # within a factor of 2: one doubling of the search either way
    held = {
        name: _number(prediction[name], f"shift_prediction[{name!r}]") > 0
        and abs(math.log2(_number(prediction[name], "") / value)) <= 1
        for name, value in want.items()
    }
    note = "; ".join(
        f"{name}: measured c = {value:g}, you predicted {prediction[name]:g} "
        f"({'within' if held[name] else 'outside'} a factor of 2)"
        for name, value in want.items()
    )
    return Credit(1 + sum(held.values()), note)


@_exercise(
    "02",
    "implement",
    "Kerple-log's bias -r1·log(1 + r2·(i - j))",
    (
        "Kerple-log penalises distance logarithmically, each head with its own scale r1 and rate r2",
        "give the per-head parameters (shape (h,)) two new trailing axes and compute the (queries, keys) "
        "distances by broadcasting: the result is (heads, queries, keys)",
    ),
    points=2,
)
def kerple_log_bias(your_function):
    generator = _fresh_generator()
    pe = _pe_module(pe="kerple_log")
    with torch.no_grad():
        pe.r1.copy_(torch.rand(4, generator=generator) * 2 + 0.05)
        pe.r2.copy_(torch.rand(4, generator=generator) + 0.05)
    start = int(torch.randint(0, 500, (1,), generator=generator))
    q_pos, k_pos = torch.arange(start + 40, start + 50), torch.arange(start, start + 50)
    r1, r2 = pe.r1.detach().clone(), pe.r2.detach().clone()
    got = _given(your_function, "kerple_log_bias")(r1.clone(), r2.clone(), q_pos, k_pos)
    with torch.no_grad():
        want = pe(q_pos, k_pos)
    visible = q_pos[:, None] >= k_pos[None, :]
    if isinstance(got, torch.Tensor) and got.shape == want.shape and torch.isinf(got[:, visible]).any():
        raise Wrong(
            "your bias is infinite on the diagonal (distance 0)",
            hint="log(r2·d) is -∞ at d = 0: Kerple uses log(1 + r2·d) (torch.log1p)",
        )
    d = (q_pos[:, None] - k_pos[None, :]).clamp(min=0).double()
    a, b = r1.double()[:, None, None], r2.double()[:, None, None]
    mistakes = {
        "r1 and r2 swapped": (-b * torch.log1p(a * d), "r1 multiplies the log, r2 scales the distance"),
        "your bias is positive: far keys get more attention": (a * torch.log1p(b * d), "the bias is -r1·log(1 + r2·d)"),
        "r2 is missing inside the log": (-a * torch.log1p(d), "scale the distance: log(1 + r2·d)"),
        "your bias is linear in the distance, not logarithmic": (-a * b * d, "take log(1 + r2·d)"),
    }
    _compare(got, want, "the bias", ("head", "query", "key"), visible=visible, mistakes=mistakes)
