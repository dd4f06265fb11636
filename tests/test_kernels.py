"""md.kernels: PD/CPD checks of Kerple's Corollary 1, the CPD shift lemma, and softmax's shift invariance."""

import math

import numpy as np
import pytest
import torch

import minidape as md
from minidape import kernels

POWER_CASES = [(a, p) for a in (0.1, 1.0, 5.0) for p in (0.5, 1.0, 1.5, 2.0)]
LOG_CASES = [(a, b, p) for a, b in ((0.1, 1.0), (1.0, 0.5), (3.0, 2.0)) for p in (0.5, 1.0, 2.0)]


def helmert_basis(n):
    """A second, hand-built orthonormal basis of the zero-sum vectors: column k-1 is
    (1, ..., 1, -k, 0, ..., 0) / sqrt(k (k + 1)) with k ones."""
    basis = torch.zeros(n, n - 1, dtype=torch.float64)
    for k in range(1, n):
        basis[:k, k - 1] = 1.0
        basis[k, k - 1] = -k
        basis[:, k - 1] /= math.sqrt(k * (k + 1))
    return basis


# ---------------------------------------------------------------------------------------------- gram


def test_gram_matches_direct_evaluation_and_is_float64():
    points = [0.0, 1.5, 4.0, 7.25, 30.0]
    seen = []

    def kernel(m, n):
        seen.append((m.dtype, n.dtype))
        return torch.cos(m) * n - 0.1 * (m - n) ** 2

    matrix = kernels.gram(kernel, points)
    assert matrix.dtype == torch.float64 and matrix.shape == (5, 5)
    assert seen == [(torch.float64, torch.float64)]
    for i, x in enumerate(points):
        for j, y in enumerate(points):
            expected = math.cos(x) * y - 0.1 * (x - y) ** 2
            assert matrix[i, j].item() == pytest.approx(expected, rel=1e-14, abs=1e-14)


def test_gram_of_shift_invariant_kernel_is_symmetric_toeplitz():
    matrix = kernels.gram(kernels.log_kernel(a=0.7, b=1.3), 12)
    assert torch.equal(matrix, matrix.T)
    for offset in range(-11, 12):  # constant along every diagonal: k depends on m - n only
        diagonal = torch.diagonal(matrix, offset)
        assert torch.allclose(diagonal, diagonal[0].expand_as(diagonal))


def test_gram_accepts_int_lists_arrays_and_scalar_kernels():
    grid = kernels.gram(kernels.power_kernel(), 4)
    assert torch.equal(grid, kernels.gram(kernels.power_kernel(), [0, 1, 2, 3]))
    assert torch.equal(grid, kernels.gram(kernels.power_kernel(), np.arange(4)))
    assert torch.equal(kernels.gram(lambda m, n: 2.5, 3), torch.full((3, 3), 2.5, dtype=torch.float64))


# ------------------------------------------------------------------------------------ CPD: Corollary 1


@pytest.mark.parametrize("a, p", POWER_CASES)
def test_power_family_is_cpd(a, p):
    kernel = kernels.power_kernel(a=a, p=p)
    assert kernels.is_cpd(kernel)
    assert kernels.cpd_min_eig(kernel, 40) >= -1e-9 * a * 39**p


@pytest.mark.parametrize("a, b, p", LOG_CASES)
def test_log_family_is_cpd(a, b, p):
    kernel = kernels.log_kernel(a=a, b=b, p=p)
    assert kernels.is_cpd(kernel)
    assert kernels.cpd_min_eig(kernel, 40) >= -1e-9 * b * math.log1p(a * 39**p)


@pytest.mark.parametrize(
    "kernel, name",
    [
        (lambda m, n: (m - n).abs(), "+|x|"),
        (lambda m, n: -((m - n).abs() ** 3), "-|x|^3"),
        (kernels.power_kernel(p=2.5), "-|x|^2.5"),
    ],
)
def test_kernels_outside_corollary_1_are_not_cpd(kernel, name):
    assert not kernels.is_cpd(kernel), name
    assert kernels.cpd_min_eig(kernel) < 0


def test_cpd_min_eig_agrees_with_an_explicit_counterexample():
    # -|x|^3 on positions 0, 1, 2 with the zero-sum c = (1, -2, 1):
    # c^T K c = -(2 c0 c1 |1|^3 + 2 c0 c2 |2|^3 + 2 c1 c2 |1|^3) = -(-4 + 16 - 4) = -8, |c|^2 = 6.
    kernel = kernels.power_kernel(p=3)
    c = torch.tensor([1.0, -2.0, 1.0], dtype=torch.float64)
    quadratic = c @ kernels.gram(kernel, 3) @ c
    assert quadratic.item() == pytest.approx(-8.0)
    assert kernels.cpd_min_eig(kernel, 3) <= quadratic.item() / 6 + 1e-12


@pytest.mark.parametrize(
    "kernel",
    [kernels.log_kernel(a=2.0, p=0.5), lambda m, n: (m - n).abs() ** 1.5, lambda m, n: torch.exp(-((m - n) ** 2) / 10)],
)
def test_cpd_min_eig_is_the_minimum_over_zero_sum_vectors(kernel):
    points = torch.linspace(0, 20, 9, dtype=torch.float64) ** 1.3
    matrix = kernels.gram(kernel, points)
    value = kernels.cpd_min_eig(kernel, points)
    # the same spectrum in an independent basis of the zero-sum subspace
    helmert = helmert_basis(len(points))
    assert value == pytest.approx(torch.linalg.eigvalsh(helmert.T @ matrix @ helmert)[0].item(), abs=1e-10)
    # a lower bound of the Rayleigh quotient of every zero-sum vector
    generator = torch.Generator().manual_seed(0)
    c = torch.randn(500, len(points), generator=generator, dtype=torch.float64)
    c -= c.mean(dim=1, keepdim=True)
    rayleigh = torch.einsum("bi,ij,bj->b", c, matrix, c) / (c * c).sum(dim=1)
    assert rayleigh.min().item() >= value - 1e-10


def test_pd_kernel_is_also_cpd_but_cpd_kernel_is_not_pd():
    gaussian = lambda m, n: torch.exp(-((m - n) ** 2) / 8)  # PD (Bochner), hence CPD
    assert torch.linalg.eigvalsh(kernels.gram(gaussian, 20))[0] > -1e-12
    assert kernels.is_cpd(gaussian)
    triangle = kernels.power_kernel(p=1)  # CPD, but its trace is 0: not PSD
    assert kernels.is_cpd(triangle)
    assert torch.linalg.eigvalsh(kernels.gram(triangle, 20))[0] < 0


def test_is_cpd_is_seeded():
    kernel = kernels.power_kernel(p=1.9)
    assert kernels.is_cpd(kernel, seed=3) == kernels.is_cpd(kernel, seed=3)


# -------------------------------------------------------------------------------- the CPD shift lemma


@pytest.mark.parametrize(
    "kernel, points",
    [
        (kernels.power_kernel(a=1.0, p=1.0), 24),
        (kernels.power_kernel(a=0.3, p=1.5), 16),
        (kernels.log_kernel(a=1.0, b=1.0), 64),
        (kernels.log_kernel(a=0.2, b=3.0, p=0.5), [0.0, 0.5, 3.0, 9.0, 27.0, 81.0]),
    ],
)
def test_pd_shift_gives_the_first_power_of_two_that_makes_c_plus_k_psd(kernel, points):
    c = kernels.pd_shift(kernel, points)
    matrix = kernels.gram(kernel, points)
    assert math.log2(c).is_integer() and c >= 1
    shifted = matrix + c
    assert torch.linalg.eigvalsh(shifted)[0].item() >= -1e-10 * shifted.abs().max().item()
    assert torch.linalg.eigvalsh(matrix)[0].item() < 0  # the shift was needed
    if c > 1:
        assert torch.linalg.eigvalsh(matrix + c / 2)[0].item() < 0


def test_pd_shift_grows_with_the_span_of_positions():
    # Lemma 1 gives a c per finite point set; for the triangle kernel it grows with the span.
    shifts = [kernels.pd_shift(kernels.power_kernel(p=1), n) for n in (8, 32, 128)]
    assert shifts[0] < shifts[1] < shifts[2]


def test_pd_shift_of_a_pd_kernel_is_the_first_candidate():
    assert kernels.pd_shift(lambda m, n: torch.exp(-(m - n).abs()), 10, start=0.25) == 0.25


def test_pd_shift_errors():
    with pytest.raises(ValueError, match="not CPD"):
        kernels.pd_shift(kernels.power_kernel(p=3), 8)
    with pytest.raises(ValueError, match="max_steps"):
        kernels.pd_shift(kernels.power_kernel(p=1), 64, max_steps=3)
    with pytest.raises(ValueError, match="start"):
        kernels.pd_shift(kernels.power_kernel(), 8, start=0)
    with pytest.raises(ValueError, match="max_steps"):
        kernels.pd_shift(kernels.power_kernel(), 8, max_steps=0)


# ------------------------------------------------------------------ softmax absorbs Kerple's constant


def test_softmax_absorbs_a_constant_shift_of_the_bias():
    """Kerple's eq. (2): adding c to every logit of a row leaves attention unchanged, so the PD kernel
    c + k and the CPD kernel k give the same attention and c never has to be computed."""
    generator = torch.Generator().manual_seed(0)
    kernel = kernels.log_kernel(a=0.8, b=1.5)
    bias = kernels.gram(kernel, 10)
    c = kernels.pd_shift(kernel, 10)
    scores = torch.randn(3, 10, 10, generator=generator, dtype=torch.float64)
    causal = torch.ones(10, 10, dtype=torch.bool).tril()

    def attention(logits):
        return torch.softmax(logits.masked_fill(~causal, float("-inf")), dim=-1)

    assert torch.allclose(attention(scores + bias + c), attention(scores + bias), atol=1e-15, rtol=0)
    # a shift that differs between keys is not absorbed
    ramp = torch.arange(10, dtype=torch.float64)
    assert not torch.allclose(attention(scores + bias + ramp), attention(scores + bias))


# ----------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "points, match",
    [
        (1, "at least 2"),
        ([3.0], "at least 2"),
        ([[0, 1], [2, 3]], "1-D"),
        ([0.0, float("nan")], "finite"),
        (True, "int N"),
        ("abc", "int N"),
    ],
)
def test_bad_points(points, match):
    with pytest.raises((ValueError, TypeError), match=match):
        kernels.gram(kernels.power_kernel(), points)


def test_bad_kernels():
    with pytest.raises(TypeError, match="callable"):
        kernels.gram("alibi", 4)
    with pytest.raises(ValueError, match="broadcast"):
        kernels.gram(lambda m, n: torch.zeros(3), 4)
    with pytest.raises(ValueError, match="non-finite"):
        kernels.gram(lambda m, n: 1 / (m - n), 4)
    with pytest.raises(ValueError, match="not symmetric"):
        kernels.cpd_min_eig(lambda m, n: -(m - n), 4)  # ALiBi's signed distance
    with pytest.raises(ValueError, match="not symmetric"):
        kernels.is_cpd(lambda m, n: m * 0 + n)


@pytest.mark.parametrize(
    "make",
    [
        lambda: kernels.power_kernel(a=0),
        lambda: kernels.power_kernel(p=-1),
        lambda: kernels.log_kernel(b=float("inf")),
        lambda: kernels.log_kernel(a="1"),
    ],
)
def test_bad_family_parameters(make):
    with pytest.raises(ValueError, match="positive finite"):
        make()


@pytest.mark.parametrize(
    "kwargs, match",
    [({"n_points": 1}, "n_points"), ({"n_sets": 0}, "n_sets"), ({"span": -1.0}, "span"), ({"rtol": -1e-3}, "rtol")],
)
def test_bad_is_cpd_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        kernels.is_cpd(kernels.power_kernel(), **kwargs)


def test_exported_as_md_kernels():
    assert md.kernels is kernels
