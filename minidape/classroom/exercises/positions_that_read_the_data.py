"""The checks of notebook 08's exercises."""

from __future__ import annotations

import math

import torch

from .framework import Wrong, _exercise
from .helpers import _choice, _compare, _fresh_generator, _given, _measurement, _number, _prediction_credit

GATE_KINDS = ("letter", "space", "punctuation", "newline")  # the kinds of byte of exercise 8.3


def _cumulative_gates(log_forget: torch.Tensor, first: int, last_offset: int) -> torch.Tensor:
    r"""$\sum_{l=j+first}^{i+last\_offset} \ln f_l$ at every (i, j) with that range in order, 0 elsewhere: the
    cumulative sums of the common off-by-one versions of FoX's bias."""
    T = log_forget.shape[-1]
    c = torch.cat([torch.zeros_like(log_forget[..., :1]), log_forget.cumsum(-1)], dim=-1)  # c[t] = sum_{l<t}
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    upper = (i + last_offset + 1).clamp(0, T)
    lower = (j + first).clamp(0, T)
    return torch.where(upper > lower, c[..., upper] - c[..., lower], torch.zeros(()).double())


@_exercise(
    "08",
    "implement",
    "FoX's bias from the forget gates",
    (
        "FoX's bias adds up the log forget gates of the steps between key and query: how much of the past "
        "survives every gate on the way",
        "a cumulative sum along the positions holds every such sum at once, as the difference of two of its "
        "entries; broadcasting makes all (query, key) pairs",
    ),
    points=2,
)
def fox_bias(your_function):
    your_function = _given(your_function, "fox_bias")
    generator = _fresh_generator()
    batch, n_head, T = 2, 3, int(torch.randint(6, 20, (1,), generator=generator))
    log_forget = torch.nn.functional.logsigmoid(
        torch.randn(batch, n_head, T, generator=generator, dtype=torch.float64) + 2
    )
    want = _cumulative_gates(log_forget, 1, 0)  # l = j+1 .. i
    visible = torch.ones(T, T, dtype=torch.bool).tril()
    got = your_function(log_forget.clone())
    gate = log_forget.exp()
    mistakes = {
        "you sum l = j .. i: the key's own gate is counted, so even the diagonal (i = j) decays": (
            _cumulative_gates(log_forget, 0, 0),
            "the gates strictly after key j, up to and including the query i",
        ),
        "your sum ends one gate before the query: the query's own gate is left out": (
            _cumulative_gates(log_forget, 1, -1),
            "l runs up to and including i",
        ),
        "you sum l = j .. i-1: one gate too early at both ends": (
            _cumulative_gates(log_forget, 0, -1),
            "the gates after key j (l > j), up to the query's own (l <= i)",
        ),
        "your bias is positive (or transposed: D[j, i] = -D[i, j]): the sum of log-gates is <= 0": (
            -want,
            "sum log f as given (it is <= 0), and put the query on the rows, the key on the columns",
        ),
        "you summed the gates f, not their logarithms": (
            _cumulative_gates(gate, 1, 0),
            "log_forget already holds log f: sum it as it is",
        ),
    }
    _compare(got, want, "fox_bias(log_forget)", ("batch", "head", "query", "key"), visible, mistakes, atol=1e-8)


@_exercise(
    "08",
    "derive",
    "the temperature that keeps attention on one key as the context grows",
    (
        "the key ahead takes a softmax share that grows with tau·gap against the n - 1 others: set that share "
        "to p and solve for tau",
        "write the share with the other keys' weight as the unit, bring the exponential to one side, and take "
        "the logarithm",
    ),
    points=2,
)
def focus_temperature(your_function):
    your_function = _given(your_function, "focus_temperature")
    generator = _fresh_generator()
    for _ in range(4):
        n = int(torch.randint(3, 20000, (1,), generator=generator))
        gap = 0.2 + 4.8 * torch.rand(1, generator=generator, dtype=torch.float64).item()
        p = 0.05 + 0.9 * torch.rand(1, generator=generator, dtype=torch.float64).item()
        while math.log((n - 1) * p / (1 - p)) <= 0:  # a temperature > 0 needs p above the uniform 1/n
            p = (1 + p) / 2
        got = _number(your_function(n, gap, p), "focus_temperature(n, gap, p)")
        want = math.log((n - 1) * p / (1 - p)) / gap
        if abs(got - want) <= 1e-9 + 1e-6 * abs(want):
            continue
        where = f"focus_temperature(n={n}, gap={gap:.3g}, p={p:.3g}) = {got:.6g}"
        mistakes = {
            "you counted n other keys, not n - 1 (the key itself is one of the n)": (
                math.log(n * p / (1 - p)) / gap,
                "n keys: the one ahead and n - 1 others",
            ),
            "you forgot to divide by the gap": (
                math.log((n - 1) * p / (1 - p)),
                "the logit gap after the temperature is tau * gap",
            ),
            "the odds of the key ahead are upside down": (
                math.log((n - 1) * (1 - p) / p) / gap,
                "the key ahead holds p, the others 1 - p together",
            ),
            "you multiplied by the gap instead of dividing": (
                math.log((n - 1) * p / (1 - p)) * gap,
                "tau multiplies the gap inside the exponential: isolate tau last",
            ),
        }
        for description, (value, hint) in mistakes.items():
            if abs(got - value) <= 1e-9 + 1e-6 * abs(value):
                raise Wrong(f"{where}: {description}", hint=hint)
        # the value that would hold p is withheld; what the student's tau gives is not
        share = 1 / (1 + (n - 1) * math.exp(-got * gap)) if got * gap > -700 else 0.0
        raise Wrong(f"{where}, which puts {share:.4g} of the attention on the key ahead, not p = {p:.3g}")


@_exercise(
    "08",
    "experiment",
    "predict, then measure, on which kind of byte FoX forgets most",
    (
        "the forget gate is the share of the past a token keeps: near 1 it keeps, near 0 it forgets",
        "compare the mean gates of the kinds of byte: which kind keeps least?",
    ),
    points=2,
)
def where_fox_forgets(prediction, measured, mean_gate):
    kinds = tuple(mean_gate)
    predicted = _choice(prediction, kinds, "fox_prediction (your prediction)")
    measured = _choice(measured, kinds, "forgets_most (your measurement)")
    # graded: the gates must agree with the teacher's reference run of the same mode (like 3.1, 4.4 and 5.3: a
    # typed mean_gate with nothing trained does not), and the prediction is judged on the full-mode reference
    truth, _ = _measurement(
        "where_fox_forgets",
        {kind: _number(gate, f"mean_gate[{kind!r}]") for kind, gate in mean_gate.items()},
        {kind: f"mean forget gate after {kind} bytes" for kind in kinds},
        agree=0.02,  # the gates lie close together below 1: 25 % would let any typed table through
    )
    lowest = min(mean_gate, key=mean_gate.get)
    if measured != lowest:
        highest = max(mean_gate, key=mean_gate.get)
        raise Wrong(
            f"forgets_most = {measured!r} is not the kind with the lowest mean forget gate",
            hint="a gate near 1 keeps the past, near 0 forgets it: use min, not max"
            if measured == highest
            else "compare the mean gates of every kind: the lowest one forgets most",
        )
    forgets = min(truth, key=truth.get)
    return _prediction_credit(
        2, predicted == forgets, f"{forgets} bytes have the lowest mean gate ({truth[forgets]:.3f})"
    )
