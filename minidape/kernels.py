r"""Positive definite (PD) and conditionally positive definite (CPD) kernels over positions.

The maths behind Kerple (Chi et al., 2022, §3), checked numerically on finite point sets, in float64.

- PD (Definition 1): $\sum_{i,j} c_i c_j\, k(x_i, x_j) \ge 0$ for all $c \in \mathbb{R}^N$, i.e. every Gram
  matrix $K_{ij} = k(x_i, x_j)$ is positive semi-definite.
- CPD (Definition 2): the same, but only for $c$ with $\sum_i c_i = 0$: $K$ is PSD on the zero-sum subspace.
- Corollary 1: $-a|m-n|^p$ and $-b\ln(1 + a|m-n|^p)$ are CPD for $0 < p \le 2$, $a, b > 0$.
- Lemma 1 (CPD shift): for a CPD kernel, $c + k$ is PD for a large enough constant $c$ (on a finite set of
  distinct points, when $k$ is strictly CPD there). Softmax ignores $c$, so Kerple never needs its value.

A kernel is any callable ``k(m, n)`` that takes two broadcastable float64 tensors of positions and returns
their (broadcast) values; ``gram`` calls it once with a column and a row of positions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import contextmanager

import torch

Kernel = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

DEFAULT_POINTS = 32  # positions 0..31 when no points are given
SYMMETRY_RTOL = 1e-10  # |K - K^T| allowed, relative to max |K|


def positions(points=DEFAULT_POINTS) -> torch.Tensor:
    """Points as a 1-D float64 tensor: an int ``N`` means the positions ``0..N-1``; a sequence, array or
    tensor of numbers is used as given. At least two finite points are needed."""
    if isinstance(points, bool):
        raise TypeError(f"points must be an int N (positions 0..N-1) or a 1-D sequence of numbers; got {points!r}")
    if isinstance(points, int):
        if points < 2:
            raise ValueError(f"points={points}: need at least 2 positions to form a kernel matrix")
        return torch.arange(points, dtype=torch.float64)
    try:
        x = torch.as_tensor(points).to(torch.float64)
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(
            f"points must be an int N (positions 0..N-1) or a 1-D sequence of numbers; got {type(points).__name__}"
        ) from error
    if x.dim() != 1 or len(x) < 2:
        raise ValueError(f"points must be 1-D with at least 2 positions; got shape {tuple(x.shape)}")
    if not torch.isfinite(x).all():
        raise ValueError(f"points must be finite; got {x.tolist()}")
    return x


def gram(kernel: Kernel, points=DEFAULT_POINTS) -> torch.Tensor:
    r"""The Gram matrix $K_{ij} = k(x_i, x_j)$ (float64, shape ``(N, N)``), from one broadcast call
    ``kernel(x[:, None], x[None, :])``."""
    if not callable(kernel):
        raise TypeError(f"kernel must be a callable k(m, n) on float64 tensors; got {type(kernel).__name__}")
    x = positions(points)
    n = len(x)
    values = kernel(x[:, None], x[None, :])
    try:
        values = torch.as_tensor(values, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(f"kernel returned {type(values).__name__}; it must return a tensor of numbers") from error
    try:
        matrix = values.broadcast_to(n, n).clone()  # a constant kernel may return a scalar
    except RuntimeError as error:
        raise ValueError(
            f"kernel(m, n) with m of shape ({n}, 1) and n of shape (1, {n}) returned shape "
            f"{tuple(values.shape)}; it must broadcast to ({n}, {n})"
        ) from error
    if not torch.isfinite(matrix).all():
        bad = (~torch.isfinite(matrix)).nonzero()[0].tolist()
        raise ValueError(
            f"kernel gave a non-finite value {matrix[bad[0], bad[1]].item()} at positions "
            f"({x[bad[0]].item()}, {x[bad[1]].item()})"
        )
    return matrix


def _scale(matrix: torch.Tensor) -> float:
    """The matrix scale that tolerances are relative to: its largest absolute entry (at least 1e-300)."""
    return max(matrix.abs().max().item(), 1e-300)


@contextmanager
def _one_thread():
    """Kernel matrices here are small (tens to hundreds of rows): on one thread LAPACK skips the thread
    synchronisation that dominates its run time (seconds instead of a millisecond on a busy CPU)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def smallest_eigenvalue(matrix: torch.Tensor) -> float:
    """The smallest eigenvalue of a symmetric matrix."""
    with _one_thread():
        return torch.linalg.eigvalsh(matrix)[0].item()


def _symmetric_gram(kernel: Kernel, points) -> torch.Tensor:
    matrix = gram(kernel, points)
    asymmetry = (matrix - matrix.T).abs().max().item()
    if asymmetry > SYMMETRY_RTOL * _scale(matrix):
        raise ValueError(
            f"kernel is not symmetric: k(m, n) and k(n, m) differ by up to {asymmetry:.3g}; PD and "
            f"CPD are defined for symmetric kernels (use |m - n| rather than m - n)"
        )
    return (matrix + matrix.T) / 2


def zero_sum_basis(n: int) -> torch.Tensor:
    r"""An orthonormal basis $Q$ (``(n, n-1)``, float64) of $\{c \in \mathbb{R}^n : \sum_i c_i = 0\}$.

    The Householder reflection $H = I - 2vv^\top / v^\top v$ with $v = e_1 - \mathbf{1}/\sqrt{n}$ is symmetric
    and orthogonal and maps $e_1$ to $\mathbf{1}/\sqrt{n}$, so its other columns are orthonormal and orthogonal
    to $\mathbf{1}$."""
    v = -torch.full((n,), 1 / math.sqrt(n), dtype=torch.float64)
    v[0] += 1
    reflection = torch.eye(n, dtype=torch.float64) - 2 * torch.outer(v, v) / (v @ v)
    return reflection[:, 1:]


def cpd_min_eig(kernel: Kernel, points=DEFAULT_POINTS) -> float:
    r"""Smallest eigenvalue of the Gram matrix restricted to zero-sum vectors, $\lambda_{\min}(Q^\top K Q)$.

    $c^\top K c \ge \lambda_{\min} \|c\|^2$ for every $c$ with $\sum_i c_i = 0$, so the kernel is CPD on these
    points exactly when this is $\ge 0$ (up to rounding)."""
    matrix = _symmetric_gram(kernel, points)
    basis = zero_sum_basis(len(matrix))
    return smallest_eigenvalue(basis.T @ matrix @ basis)


def _random_point_sets(n_sets: int, n_points: int, span: float, seed: int):
    """The integer grid 0..n_points-1 (what attention sees), then ``n_sets - 1`` sets of ``n_points`` real
    positions drawn uniformly from ``[0, span)`` with a seeded generator."""
    generator = torch.Generator().manual_seed(seed)
    yield torch.arange(n_points, dtype=torch.float64)
    for _ in range(n_sets - 1):
        yield torch.rand(n_points, generator=generator, dtype=torch.float64) * span


def is_cpd(
    kernel: Kernel, n_sets: int = 32, n_points: int = 16, span: float = 64.0, seed: int = 0, rtol: float = 1e-9
) -> bool:
    r"""True when $\lambda_{\min}(Q^\top K Q) \ge -\text{rtol}\cdot\max|K|$ on every test set: the integer
    grid ``0..n_points-1`` and ``n_sets - 1`` seeded random sets of ``n_points`` positions in
    ``[0, span)``. A numerical check: ``False`` is a proof (a counterexample), ``True`` is evidence."""
    for name, value in (("n_sets", n_sets), ("n_points", n_points)):
        if isinstance(value, bool) or not isinstance(value, int) or value < (2 if name == "n_points" else 1):
            raise ValueError(f"{name} must be an integer >= {2 if name == 'n_points' else 1}; got {value!r}")
    if not (isinstance(span, (int, float)) and span > 0 and math.isfinite(span)):
        raise ValueError(f"span must be a positive finite number; got {span!r}")
    if not rtol >= 0:
        raise ValueError(f"rtol must be >= 0; got {rtol!r}")
    for points in _random_point_sets(n_sets, n_points, float(span), seed):
        matrix = _symmetric_gram(kernel, points)
        basis = zero_sum_basis(n_points)
        if smallest_eigenvalue(basis.T @ matrix @ basis) < -rtol * _scale(matrix):
            return False
    return True


def pd_shift(
    kernel: Kernel, points=DEFAULT_POINTS, start: float = 1.0, max_steps: int = 64, rtol: float = 1e-10
) -> float:
    r"""The first $c$ in the geometric sequence ``start``, ``2 start``, ``4 start``, ... for which $c + K$ is
    positive semi-definite, $\lambda_{\min}(c\,\mathbf{1}\mathbf{1}^\top + K) \ge -\text{rtol}\cdot\max|c + K|$
    (Kerple's CPD shift lemma, §3.2). PSD-ness only grows with $c$ (it adds the PSD matrix
    $\mathbf{1}\mathbf{1}^\top$), so $c/2$ fails whenever $c >$ ``start``.

    $c\,\mathbf{1}\mathbf{1}^\top$ vanishes on zero-sum vectors, so no shift helps a kernel that is not CPD on
    these points: that, or no $c$ within ``max_steps`` doublings, is a ValueError. A kernel that is CPD but
    not strictly (e.g. $-|m-n|^2$ on 3+ points) has no exact shift; its negative eigenvalue only shrinks
    like $1/c$, and the search stops once it is below the tolerance."""
    if not (isinstance(start, (int, float)) and start > 0 and math.isfinite(start)):
        raise ValueError(f"start must be a positive finite number; got {start!r}")
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"max_steps must be a positive integer; got {max_steps!r}")
    matrix = _symmetric_gram(kernel, points)
    basis = zero_sum_basis(len(matrix))
    restricted = smallest_eigenvalue(basis.T @ matrix @ basis)
    if restricted < -rtol * _scale(matrix):
        raise ValueError(
            f"kernel is not CPD on these points (smallest eigenvalue on zero-sum vectors "
            f"{restricted:.3g} < 0), so no constant c makes c + K positive semi-definite"
        )
    c = float(start)
    for _ in range(max_steps):
        shifted = matrix + c
        if smallest_eigenvalue(shifted) >= -rtol * _scale(shifted):
            return c
        c *= 2
    raise ValueError(
        f"no c in {start:g}, {2 * start:g}, ..., {start * 2 ** (max_steps - 1):g} makes c + K "
        f"positive semi-definite; raise max_steps or start"
    )


def _check_parameters(**parameters) -> None:
    for name, value in parameters.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value > 0 and math.isfinite(value)):
            raise ValueError(f"{name} must be a positive finite number; got {value!r}")


def power_kernel(a: float = 1.0, p: float = 1.0) -> Kernel:
    r"""Corollary 1(a): $k(m, n) = -a\,|m - n|^p$, CPD for $0 < p \le 2$, $a > 0$ (Kerple-power's bias;
    $p = 1$ is ALiBi's triangle kernel with slope $a$). Any $p > 0$ is accepted, to show where CPD fails."""
    _check_parameters(a=a, p=p)
    return lambda m, n: -a * (m - n).abs() ** p


def log_kernel(a: float = 1.0, b: float = 1.0, p: float = 1.0) -> Kernel:
    r"""Corollary 1(b): $k(m, n) = -b\,\ln(1 + a\,|m - n|^p)$, CPD for $0 < p \le 2$, $a, b > 0$
    (Kerple-log's bias is $p = 1$ with $r_1 = b$, $r_2 = a$)."""
    _check_parameters(a=a, b=b, p=p)
    return lambda m, n: -b * torch.log1p(a * (m - n).abs() ** p)
