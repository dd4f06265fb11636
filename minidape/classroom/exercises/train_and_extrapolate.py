"""The checks of notebook 03's exercises."""

from __future__ import annotations

import math

import torch

from .framework import Wrong, _exercise
from .helpers import _compare, _fresh_generator, _given, _measurement, _number, _prediction, _prediction_credit


@_exercise(
    "03",
    "experiment",
    "predict, then measure, how RoPE degrades at 16× its training length",
    "the ratio is last_k['rope'][longest] / last_k['rope'][train_length], read from the table above",
    points=2,
)
def rope_ratio(prediction, measured_ratio, last_k, train_length, longest):
    predicted = _prediction(prediction, "rope_breaks (your prediction)")
    measured = _number(measured_ratio, "rope_ratio (your measurement)")
    yours = last_k["rope"][longest] / last_k["rope"][train_length]
    if abs(measured - yours) > 1e-6 * yours and abs(measured - 1 / yours) <= 1e-6 / yours:
        raise Wrong(
            f"your ratio {measured:.4g} is upside down",
            hint="divide the perplexity at the longest length by the one at the training length",
        )
    if abs(measured - yours) > 1e-6 * yours:
        raise Wrong(f"your ratio {measured:.4g} is not last_k['rope'][{longest}] / last_k['rope'][{train_length}]")
    truth, source = _measurement(
        "rope_ratio",
        {"train_length": last_k["rope"][train_length], "longest": last_k["rope"][longest]},
        {"train_length": f"RoPE perplexity at {train_length}", "longest": f"RoPE perplexity at {longest}"},
    )
    want = truth["longest"] / truth["train_length"]
    return _prediction_credit(
        2,
        predicted == (want > 2),
        f"RoPE's ratio in {source} is {want:.2f} (yours "
        f"{measured:.2f}), so it {'more' if want > 2 else 'less'} "
        f"than doubles",
    )


@_exercise(
    "03",
    "derive",
    "both protocols' perplexities from one position-wise loss curve",
    "last_k scores the last k positions of a window of T tokens, nonoverlap all T of them; perplexity is "
    "exp of the mean loss",
    points=2,
)
def protocols_from_curve(your_function):
    generator = _fresh_generator()
    curve = 1 + torch.rand(300, generator=generator, dtype=torch.float64) * 3
    lengths = torch.randint(2, 300, (3,), generator=generator).tolist()
    for T, k in zip([300] + lengths, [256, 256, int(lengths[1]) + 7, max(1, lengths[2] // 3)]):
        answer = _given(your_function, "protocols_from_curve")(curve.clone(), T, k)
        if not (isinstance(answer, (tuple, list)) and len(answer) == 2):
            raise Wrong(f"protocols_from_curve should return a pair (last_k, nonoverlap), got {answer!r}")
        got = [_number(value, f"the {label} perplexity") for value, label in zip(answer, ("last_k", "nonoverlap"))]
        kk = min(k, T)
        want = (math.exp(curve[T - kk : T].mean()), math.exp(curve[:T].mean()))
        if all(abs(g - w) <= 1e-6 * w for g, w in zip(got, want)):
            continue
        where = f"T = {T}, k = {k}: your pair is ({got[0]:.6g}, {got[1]:.6g})"
        mistakes = {
            "the two perplexities are swapped": ((want[1], want[0]), "return (last_k, nonoverlap), in that order"),
            "your last_k window ends one position early": (
                (math.exp(curve[max(0, T - kk - 1) : T - 1].mean()), want[1]),
                "the last k positions are T - k .. T - 1",
            ),
            "your last_k perplexity averages exp(loss), not the loss": (
                (curve[T - kk : T].exp().mean().item(), want[1]),
                "perplexity is exp(mean loss), not mean(exp(loss))",
            ),
            "your nonoverlap perplexity uses the whole curve, not the first T positions": (
                (want[0], math.exp(curve.mean())),
                "a window of T tokens has T positions: curve[:T]",
            ),
        }
        for description, (values, hint) in mistakes.items():
            if all(abs(g - v) <= 1e-6 * abs(v) for g, v in zip(got, values)):
                raise Wrong(f"{where}: {description}", hint=hint)
        wrong = [label for g, w, label in zip(got, want, ("last_k", "nonoverlap")) if abs(g - w) > 1e-6 * w]
        raise Wrong(f"{where}; the {' and the '.join(wrong)} perplexity is not what the protocol measures")


@_exercise(
    "03",
    "implement",
    "a running mean that does not invent values before position 0",
    "entry t is the mean of curve[max(0, t - width + 1) : t + 1]; torch.cumsum gives every such sum at once",
    points=2,
)
def running_mean(your_function):
    F = torch.nn.functional
    generator = _fresh_generator()
    curve = torch.rand(50, generator=generator, dtype=torch.float64)
    for width in (1, 4, 16):
        got = _given(your_function, "running_mean")(curve.clone(), width)
        want = torch.stack([curve[max(0, t - width + 1) : t + 1].mean() for t in range(len(curve))])

        def windows(padded):
            return padded.unfold(0, width, 1).mean(-1)

        mistakes = {
            "the first entries repeat position 0 (replicate padding): they average values that do not exist": (
                windows(F.pad(curve[None, None], (width - 1, 0), mode="replicate")[0, 0]),
                "at the start average only the positions that exist: divide by min(t + 1, width)",
            ),
            "the first entries count zeros before position 0 (zero padding, divided by width)": (
                windows(F.pad(curve, (width - 1, 0))),
                "divide by the number of real positions, min(t + 1, width)",
            ),
            "your window is centred on t; the running mean looks back only": (
                torch.stack([curve[max(0, t - width // 2) : t + (width - 1) // 2 + 1].mean() for t in range(50)]),
                "entry t averages curve[t - width + 1 .. t]",
            ),
            "your window ends at t - 1 instead of t": (
                torch.stack([curve[max(0, t - width) : max(t, 1)].mean() for t in range(50)]),
                "entry t includes curve[t]: the slice is curve[max(0, t - width + 1) : t + 1]",
            ),
        }
        _compare(got, want, f"the running mean (width {width})", ("position",), mistakes=mistakes, atol=1e-9, rtol=1e-9)
