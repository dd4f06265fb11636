"""The statistics of the verdicts: one endpoint per unit with its t interval and tests (`scipy.stats`), Holm's
adjustment, the verdict rule, and the per-cell paired comparisons shown beside them."""

from __future__ import annotations

import dataclasses
import math
import warnings

import torch

from .claims import LEARNED_MARGIN, NOT_TESTED

ALPHA = 0.05
VERDICT_RULE = (
    "Each statement is judged by one endpoint per unit — a corpus and seed for perplexity (units pooled over "
    "corpora), a seed for C6 — defined with the statement: for a comparison of two models, their log ratio of "
    "perplexity per byte averaged over both protocols and the statement's evaluation lengths; for "
    "\"degrades\" and \"stays within\" statements, the log ratio of a model's perplexity per byte at 16x the "
    "training length to that at 1x (both protocols); for C6, the accuracy difference in points averaged over the "
    "test lengths beyond training. The estimate is the mean over the units with its 95 % t confidence interval, "
    "shown as a ratio minus 1 (or in points). The test (`scipy.stats.ttest_1samp`) is two-sided against 0 for "
    "directional statements; for \"stays within\" / \"near-equal\" statements it is an equivalence test (TOST, "
    "the larger of two one-sided p) against the stated margin when the estimate lies inside it, and the one-sided "
    "test that the mean lies beyond the margin when the estimate lies outside. Beside it, an exact sign-flip "
    "permutation test of the same hypothesis (`scipy.stats.permutation_test`, all 2^n sign flips), a check that "
    f"does not assume normally distributed units. The t-test p-values of all the report's statements are "
    f"adjusted together by Holm's method. A statement is **reproduced** when its Holm-adjusted p < {ALPHA} and "
    "the estimate lies on the claimed side (inside the margin); **not reproduced** when its Holm-adjusted p < "
    f"{ALPHA} and the estimate lies on the other side (beyond the margin): the data favour the opposite; "
    "**inconclusive at this budget** otherwise. The sign-flip p does not enter the verdict: with 5 units it "
    "cannot go below 2/2^5 = 0.0625 (two-sided). A claim is reproduced when all its statements are, not "
    "reproduced when all are not, partly reproduced when some are, inconclusive otherwise (statements not tested "
    f"left out). A C6 statement is **not tested** when no model is {100 * LEARNED_MARGIN:.0f} points above "
    "chance within the training "
    "lengths on its task (two models at chance are near-equal trivially); it then leaves Holm's family. The "
    "per-cell numbers "
    "under each statement (signed difference and an unadjusted paired t-test per corpus, protocol and length) "
    "describe where an effect comes from; they do not vote."
)


def _sign_flip_p(values, alternative: str) -> float:
    """Exact sign-flip permutation test of "the values are symmetric about 0" (all 2^n flips)."""
    import numpy as np
    from scipy.stats import permutation_test

    return float(
        permutation_test(
            (np.asarray(values, dtype=float),),
            lambda x, axis: np.mean(x, axis=axis),
            permutation_type="samples",
            vectorized=True,
            n_resamples=np.inf,
            alternative=alternative,
        ).pvalue
    )


@dataclasses.dataclass
class Endpoint:
    """One statement's endpoint over its units, and the test of what the statement claims.

    ``estimate`` and the 95 % confidence interval (``low``, ``high``) are those of the mean (Student's t over
    the units). ``p`` is the t-test of the conclusion the estimate points to, ``p_sign_flip`` the exact
    sign-flip permutation test of the same hypothesis; ``supports`` says whether that conclusion is the claim.
    - side ``below``/``above``: two-sided ``H0: mean = 0``; it supports the claim when the mean lies on the
      claimed side.
    - side ``within`` (an equivalence band ``±margin``): with the mean inside the band, TOST (two one-sided
      tests, ``p`` the larger), which supports the claim; with the mean outside, the one-sided test that the
      mean lies beyond that edge, which goes against it.
    """

    values: list[float]
    side: str
    margin: float = 0.0
    estimate: float = math.nan
    low: float = math.nan
    high: float = math.nan
    p: float = math.nan
    p_sign_flip: float = math.nan
    supports: bool = False

    def __post_init__(self):
        import numpy as np
        from scipy.stats import ttest_1samp

        data = np.asarray(self.values, dtype=float)
        if len(data) < 2 or np.isnan(data).any():  # too few units, or a model that cannot run
            return
        self.estimate = float(data.mean())
        with warnings.catch_warnings():  # identical values: no spread, p and CI are NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            interval = ttest_1samp(data, 0.0).confidence_interval(1 - ALPHA)
            self.low, self.high = float(interval.low), float(interval.high)
            if self.side != "within":
                self.p = float(ttest_1samp(data, 0.0).pvalue)
                self.p_sign_flip = _sign_flip_p(data, "two-sided")
                self.supports = self.estimate < 0 if self.side == "below" else self.estimate > 0
            elif abs(self.estimate) < self.margin:
                self.p = max(
                    float(ttest_1samp(data, -self.margin, alternative="greater").pvalue),
                    float(ttest_1samp(data, self.margin, alternative="less").pvalue),
                )
                self.p_sign_flip = max(
                    _sign_flip_p(data + self.margin, "greater"), _sign_flip_p(data - self.margin, "less")
                )
                self.supports = True
            else:
                edge, alternative = (self.margin, "greater") if self.estimate > 0 else (-self.margin, "less")
                self.p = float(ttest_1samp(data, edge, alternative=alternative).pvalue)
                self.p_sign_flip = _sign_flip_p(data - edge, alternative)


def sign_flip_floor(n: int) -> float:
    """The smallest two-sided p the exact sign-flip test can give with n units: 2 / 2^n."""
    return 2.0 / 2**n


def t_test_power(spread: float, n: int, effect: float, alpha: float = ALPHA) -> float:
    """Power of the two-sided one-sample t-test at level `alpha` to detect a mean `effect` with `n` units of
    standard deviation `spread` (the noncentral t distribution, `scipy.stats.nct`)."""
    from scipy.stats import nct, t

    if not spread > 0:
        return math.nan
    critical, shift = t.ppf(1 - alpha / 2, n - 1), effect / (spread / math.sqrt(n))
    # The lower tail as the upper one of the mirrored shift: scipy's nct.cdf is NaN far out in the tail.
    return float(nct.sf(critical, n - 1, shift) + nct.sf(critical, n - 1, -shift))


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment: the i-th smallest of m p-values times (m - i + 1), kept monotone, at most 1.
    NaN (no test) stays NaN and does not count in m."""
    order = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    adjusted, running = [math.nan] * len(p_values), 0.0
    for rank, (p, i) in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p))
        adjusted[i] = running
    return adjusted


def verdict(endpoint: Endpoint, p_holm: float) -> str:
    """The statement's verdict by `VERDICT_RULE`."""
    if not p_holm < ALPHA:  # NaN counts as no evidence
        return "inconclusive at this budget"
    return "reproduced" if endpoint.supports else "not reproduced"


def claim_verdict(verdicts: list[str]) -> str:
    verdicts = [v for v in verdicts if v != NOT_TESTED] or [NOT_TESTED]
    if verdicts == [NOT_TESTED]:
        return "inconclusive at this budget"
    if all(v == "reproduced" for v in verdicts):
        return "reproduced"
    if not any(v == "reproduced" for v in verdicts):
        return "not reproduced" if all(v == "not reproduced" for v in verdicts) else "inconclusive at this budget"
    return "partly reproduced"


@dataclasses.dataclass
class Cell:
    """One descriptive comparison shown in a claim's table (one corpus, protocol and length; one test length
    for C6): ``a`` against ``b``, paired by seed. For perplexities the signed difference is ``a / b - 1`` of the
    geometric means (%) and the paired t-test is on log perplexity; for accuracies it is in points."""

    where: str
    a: list[float]
    b: list[float]
    log: bool = True

    def difference(self) -> float:
        if self.log:
            return 100 * math.expm1(sum(math.log(x) - math.log(y) for x, y in zip(self.a, self.b)) / len(self.a))
        return 100 * sum(x - y for x, y in zip(self.a, self.b)) / len(self.a)

    def p(self) -> float:
        import numpy as np
        from scipy.stats import ttest_rel

        a, b = np.asarray(self.a, dtype=float), np.asarray(self.b, dtype=float)
        if np.isnan(a).any() or np.isnan(b).any():
            return math.nan
        with warnings.catch_warnings():  # zero variance gives p = NaN: shown as n/a
            warnings.simplefilter("ignore", RuntimeWarning)
            return float(ttest_rel(np.log(a), np.log(b)).pvalue if self.log else ttest_rel(a, b).pvalue)

    def text(self) -> str:
        difference = self.difference()
        if math.isnan(difference):
            return "n/a"
        unit = " %" if self.log else " pt"
        return f"{difference:+.1f}{unit} ({format_p(self.p())})"


def format_p(p: float) -> str:
    if math.isnan(p):
        return "p=n/a"
    return "p<0.001" if p < 0.001 else f"p={p:.3f}"


def ratio_text(endpoint: Endpoint, shift: float = 0.0) -> str:
    """A log-ratio endpoint as "ratio - 1" in %, with its 95 % CI."""
    if math.isnan(endpoint.estimate):
        return "n/a"
    estimate, low, high = (
        100 * math.expm1(value + shift) for value in (endpoint.estimate, endpoint.low, endpoint.high)
    )
    return f"{estimate:+.1f} % [{low:+.1f}, {high:+.1f}]"


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (NaN when a value is NaN; std 0 for one value)."""
    data = torch.tensor(values, dtype=torch.float64)
    return float(data.mean()), float(data.std()) if len(values) > 1 else 0.0


def format_mean_std(values: list[float]) -> str:
    mean, std = mean_std(values)
    if math.isnan(mean):
        return "n/a"
    digits = 2 if mean < 100 else 0
    return f"{mean:.{digits}f} ± {std:.{digits}f}"
