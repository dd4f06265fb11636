"""The checks of notebook 03's exercises."""

from __future__ import annotations

import math

import torch

from . import framework
from .framework import Wrong, _exercise
from .helpers import (
    _books_budget,
    _budget_lengths,
    _compare,
    _draw,
    _fresh_generator,
    _given,
    _measurement,
    _number,
    _prediction,
    _prediction_credit,
    _run_models,
    _this_run,
    _validation_tokens,
)


@_exercise(
    "03",
    "experiment",
    "predict, then measure, how RoPE degrades at 16× its training length",
    (
        "beyond L RoPE meets rotation angles it never saw in training: compare its perplexity far beyond L "
        "with its perplexity at L",
        "read both numbers from RoPE's entry of the last_k results: the longest length's over the training length's",
    ),
    points=2,
)
def rope_ratio(prediction, measured_ratio, last_k, train_length, longest, recomputed=None):
    """The grader binds ``recomputed`` (:func:`_grader_rope`): its own measurement of the run's RoPE model, which
    the table handed in must be."""
    predicted = _prediction(prediction, "rope_breaks (your prediction)")
    measured = _number(measured_ratio, "rope_ratio (your measurement)")
    _budget_lengths(train_length, longest)
    yours = last_k["rope"][longest] / last_k["rope"][train_length]
    if abs(measured - yours) > 1e-6 * yours and abs(measured - 1 / yours) <= 1e-6 / yours:
        raise Wrong(
            f"your ratio {measured:.4g} is upside down",
            hint="divide the perplexity at the longest length by the one at the training length",
        )
    if abs(measured - yours) > 1e-6 * yours:
        raise Wrong(
            f"your ratio {measured:.4g} is not RoPE's last_k perplexity at {longest} over its perplexity at "
            f"{train_length}"
        )
    table = {"train_length": last_k["rope"][train_length], "longest": last_k["rope"][longest]}
    labels = {"train_length": f"RoPE perplexity at {train_length}", "longest": f"RoPE perplexity at {longest}"}
    if recomputed is not None:
        _this_run(table, recomputed(), labels)
    truth, source = _measurement("rope_ratio", table, labels)
    want = truth["longest"] / truth["train_length"]
    return _prediction_credit(
        2,
        predicted == (want > 2),
        f"RoPE's ratio in {source} is {want:.2f} (yours "
        f"{measured:.2f}), so it {'more' if want > 2 else 'less'} "
        f"than doubles",
    )


def _grader_rope(answers, channel):
    """What the grader binds to rope_ratio's ``recomputed``: its own last_k measurement of the RoPE model the run
    trained (rebuilt from its weights, notebook 03's ``config("rope")``), over the budget's lengths, at the
    training length and the longest."""

    def measure() -> dict[str, float]:
        from ...lab.evaluate import perplexity_by_length
        from ...model import GPTConfig

        budget = _books_budget()
        cfg = GPTConfig(n_layer=2, n_head=4, n_embd=64, block_size=budget.train_length, pe="rope")
        model = _run_models(channel, {"rope": cfg})["rope"]
        curve = perplexity_by_length(
            model, _validation_tokens(), budget.lengths, protocol="last_k", n_windows=budget.eval_windows
        )
        return {"train_length": curve[budget.train_length], "longest": curve[budget.lengths[-1]]}

    return measure


framework.MEASURED_BY_GRADER["rope_ratio"] = _grader_rope


@_exercise(
    "03",
    "derive",
    "both protocols' perplexities from one position-wise loss curve",
    (
        "both protocols average the loss over some positions of one window and exponentiate; they differ only "
        "in which positions they score",
        "take the entries of the curve each protocol scores in a window of T tokens (sections 3 and 4), "
        "average the loss over them, then exponentiate",
    ),
    points=2,
)
def protocols_from_curve(your_function):
    generator = _fresh_generator()
    curve = 1 + torch.rand(300, generator=generator, dtype=torch.float64) * 3
    lengths = torch.randint(2, 300, (3,), generator=generator).tolist()
    # k <= T, as in the notebook (k = min(256, shortest length)): the last_k of a window shorter than k is not
    # defined there; k = T (the whole window) is the edge
    scored = [256, _draw(generator, 1, lengths[0] + 1), lengths[1], max(1, lengths[2] // 3)]
    for T, k in zip([300] + lengths, scored):
        answer = _given(your_function, "protocols_from_curve")(curve.clone(), T, k)
        if not (isinstance(answer, (tuple, list)) and len(answer) == 2):
            raise Wrong(f"protocols_from_curve should return a pair (last_k, nonoverlap), got {answer!r}")
        got = [_number(value, f"the {label} perplexity") for value, label in zip(answer, ("last_k", "nonoverlap"))]
        want = (math.exp(curve[T - k : T].mean()), math.exp(curve[:T].mean()))
        if all(abs(g - w) <= 1e-6 * w for g, w in zip(got, want)):
            continue
        where = f"T = {T}, k = {k}: your pair is ({got[0]:.6g}, {got[1]:.6g})"
        mistakes = {
            "the two perplexities are swapped": ((want[1], want[0]), "return (last_k, nonoverlap), in that order"),
            "your last_k window ends one position early": (
                (math.exp(curve[max(0, T - k - 1) : T - 1].mean()), want[1]),
                "the last k positions are T - k .. T - 1",
            ),
            "your last_k perplexity averages exp(loss), not the loss": (
                (curve[T - k : T].exp().mean().item(), want[1]),
                "perplexity is exp(mean loss), not mean(exp(loss))",
            ),
            "your nonoverlap perplexity uses the whole curve, not the first T positions": (
                (want[0], math.exp(curve.mean())),
                "a window of T tokens has T positions: the curve's first T entries",
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
    (
        "near the start fewer than width positions exist: average only the ones that do",
        "a cumulative sum gives the sum of any window as the difference of two of its entries; divide each "
        "by the number of positions that window really holds",
    ),
    points=2,
)
def running_mean(your_function):
    F = torch.nn.functional
    generator = _fresh_generator()
    # float32, as the notebook's loss curves are (md.evaluate.loss_by_position); the reference is float64
    given = torch.rand(50, generator=generator)
    curve = given.double()
    for width in (1, 4, 16):
        got = _given(your_function, "running_mean")(given.clone(), width)
        want = torch.stack([curve[max(0, t - width + 1) : t + 1].mean() for t in range(len(curve))])

        def windows(padded):
            return padded.unfold(0, width, 1).mean(-1)

        mistakes = {
            "the first entries repeat position 0 (replicate padding): they average values that do not exist": (
                windows(F.pad(curve[None, None], (width - 1, 0), mode="replicate")[0, 0]),
                "at the start average only the positions that exist: there are fewer than width of them",
            ),
            "the first entries count zeros before position 0 (zero padding, divided by width)": (
                windows(F.pad(curve, (width - 1, 0))),
                "divide by the number of real positions, which is below width near the start",
            ),
            "your window is centred on t; the running mean looks back only": (
                torch.stack([curve[max(0, t - width // 2) : t + (width - 1) // 2 + 1].mean() for t in range(50)]),
                "entry t averages curve[t - width + 1 .. t]",
            ),
            "your window ends at t - 1 instead of t": (
                torch.stack([curve[max(0, t - width) : max(t, 1)].mean() for t in range(50)]),
                "entry t includes curve[t] itself",
            ),
        }
        # float32's rounding of a running sum over the whole curve (a cumulative sum's difference carries it)
        rounding = 4 * 2.0**-24 * curve.abs().sum().item()
        _compare(
            got, want, f"the running mean (width {width})", ("position",), mistakes=mistakes, atol=rounding, rtol=0
        )
