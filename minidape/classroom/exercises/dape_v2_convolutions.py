"""The checks of notebook 05's exercises."""

from __future__ import annotations

import math
from functools import partial

import torch

from ...lab.leakage import ConvRefinerWithoutTril
from . import framework
from .framework import Wrong, _exercise
from .helpers import (
    _books_budget,
    _compare_refiners,
    _config,
    _distinct,
    _draw,
    _fresh_generator,
    _given,
    _measurement,
    _number,
    _prediction,
    _prediction_credit,
    _refiner_inputs,
    _remote,
    _run_models,
    _this_run,
    _told_apart,
    _undecided_credit,
    _validation_tokens,
)


def _keys(answer, query: int) -> list[int]:
    """The sorted key indices of an answer: any list, tuple, range, set, tensor or numpy array of integers. One
    that the grader's worker hands back as a handle (range, set, numpy array) is read through its public
    methods: range's start, stop and step, a set's membership, an array's tolist."""
    if _remote(answer):
        kind = answer.describe().type_name
        if kind == "range":
            answer = range(answer.start, answer.stop, answer.step)
        elif kind in ("set", "frozenset"):
            # keys a wrong answer might hold too: a kernel's reach (at most 2 · (15 // 2)) past each end
            found = [key for key in range(-16, query + 17) if answer.issuperset([key])]
            answer = found if answer.issubset(found) else answer
        elif kind == "ndarray":
            answer = answer.tolist()
    try:
        return sorted(int(key) for key in answer)
    except (TypeError, ValueError):
        raise Wrong(f"receptive_keys should return a sequence of key indices, got {answer!r}") from None


@_exercise(
    "05",
    "derive",
    "which keys a refined cell A[i, j] reads",
    (
        "a 1×k convolution mixes each cell with its neighbours along the key axis, and a second layer mixes "
        "those mixtures: stacked layers widen what a cell reads; tril has zeroed every key after the query",
        "work out how far one layer reaches to each side, then two layers; then cut the range at key 0 and at "
        "the query's own key",
    ),
    points=2,
)
def receptive_keys(your_function):
    from ...model import REFINER_REGISTRY

    generator = _fresh_generator()
    draw = partial(_draw, generator)
    # queries up to 255 and kernels up to 15 wide: too many cases for a table of answers, none for a formula
    odd = lambda: 2 * draw(0, 8) + 1
    wide = lambda: 2 * draw(1, 8) + 1  # at least 3: the diagonal and the edge then reach past the query / key 0
    cases = [
        (1, draw(1, 256), None),
        (wide(), draw(4, 256), "diagonal"),
        (wide(), draw(16, 256), "edge"),
        (3, draw(2, 256), None),
        (odd(), draw(8, 256), None),
        (odd(), draw(1, 256), None),
    ]
    for kernel, i, where in cases:
        j = i if where == "diagonal" else 0 if where == "edge" else draw(0, i + 1)
        cfg = _config(pe="none", refiner="conv", refiner_kernel=kernel, refiner_width=8)
        refiner = REFINER_REGISTRY["conv"](cfg)
        scores, _, mask = _refiner_inputs(cfg, 1, i + 1, generator)
        scores.requires_grad_(True)
        refined = refiner(scores, None, mask)  # (1, h, 16, 16)
        refined[0, 0, i, j].backward()
        want = scores.grad[0, :, i].abs().sum(0).nonzero().flatten().tolist()
        got = _keys(_given(your_function, "receptive_keys")(i, j, kernel), i)
        if got == want:
            continue
        where = f"receptive_keys({i}, {j}, k={kernel}) = {got}"
        reach, one = 2 * (kernel // 2), kernel // 2
        if got == list(range(max(0, j - reach), j + reach + 1)):
            raise Wrong(
                f"{where} includes keys after the query: tril zeroes them before the first layer",
                hint="the keys j' > i hold zeros after tril, so no score there reaches A[i, j]",
            )
        if got == list(range(max(0, j - one), min(i, j + one) + 1)):
            raise Wrong(
                f"{where} is what one layer reads; there are two",
                hint="the second layer reads the first layer's outputs, each of which already mixes a range",
            )
        if got == list(range(j - reach, min(i, j + reach) + 1)):
            raise Wrong(f"{where} has negative keys", hint="keys start at 0: the padding is zeros, not scores")
        if got and min(got) >= 0 and max(got) <= i:
            extra, missing = set(got) - set(want), set(want) - set(got)
            raise Wrong(
                f"{where}, but the gradient of minidape's conv refiner disagrees: your list "
                + ("holds keys A[i, j] does not read" if extra else "")
                + (" and " if extra and missing else "")
                + ("misses keys it reads" if missing else "")
            )
        raise Wrong(f"{where}: keys outside 0..{i} cannot be read by query {i}'s row after tril")


@_exercise(
    "05",
    "implement",
    "DAPE-V2's conv refiner: A = S + B + Conv(tril([S, B]))",
    (
        "the conv refiner is DAPE's f with 1×k convolutions along the key axis instead of a per-cell MLP; "
        "it must not read the future, so the masked cells are zeroed before it",
        "zero the masked cells of [S, B], apply the two convolutions with the activation between (padded so "
        "the T × T grid keeps its size), then add both residuals",
    ),
    points=3,
)
def conv_refiner(your_class):
    for kernel in (3, 5):
        _compare_refiners(your_class, "conv", "MyConvRefiner", refiner_kernel=kernel)


@_exercise(
    "05",
    "experiment",
    "predict, then measure, what the leaky conv does to the validation loss",
    (
        "a model's final validation loss is the last one its training logged",
        "take the last entry of each of the two histories",
    ),
    points=2,
)
def leakage(prediction, measured, histories, recomputed=None):
    """The grader binds ``recomputed`` (:func:`_grader_final_losses`): its own validation losses of the two models the
    run trained, which the histories' last entries must be."""
    predicted = _prediction(prediction, "leaky_is_lower (your prediction)")
    measured = _given(measured, "final_losses (your measurement)")
    want = {name: histories[name][-1]["val_loss"] for name in ("conv k=3", "leaky_conv k=3")}
    if not isinstance(measured, dict) or set(measured) != set(want):
        raise Wrong(f"final_losses should be a dict with the keys {sorted(want)}")
    for name, value in want.items():
        got = _number(measured[name], f"final_losses[{name!r}]")
        if abs(got - histories[name][0].get("val_loss", math.nan)) <= 1e-9 and abs(got - value) > 1e-9:
            raise Wrong(
                f"final_losses[{name!r}] is the first val_loss of its history",
                hint="the final loss is the last entry of the history, not the first",
            )
        if abs(got - value) > 1e-9:
            raise Wrong(f"final_losses[{name!r}] is not the last val_loss of histories[{name!r}]")
    labels = {name: f"final validation loss of {name!r}" for name in want}
    if recomputed is not None:  # graded: the run's own models' losses, measured by the grader, not typed or copied
        _this_run(want, recomputed(), labels)
    truth, source = _measurement("leakage", want, labels)
    leaky, honest = truth["leaky_conv k=3"], truth["conv k=3"]
    shown = _distinct(leaky, honest, digits=4)
    if not _told_apart(leaky, honest):
        return _undecided_credit(
            2,
            f"in {source} the leaky model's final loss ({shown[0]}) and the honest one's ({shown[1]}) differ "
            f"by {abs(leaky - honest):.2g}",
        )
    lower = leaky < honest
    return _prediction_credit(
        2,
        predicted == lower,
        f"in {source} the leaky model's final loss ({shown[0]}) is {'lower' if lower else 'not lower'} than the "
        f"honest one's ({shown[1]})",
    )


def _grader_final_losses(answers, channel):
    """What the grader binds to leakage's ``recomputed``: the validation losses of the two models the run trained
    (its ``models["conv k=3"]`` and ``models["leaky_conv k=3"]``, rebuilt from their weights with notebook 05's
    config), on the windows ``md.train`` logs its last val_loss on (the budget's val_windows, seed 0). The leaky
    model runs in the papers' form over whole windows (``fast=False``): its refiner reads keys past each row."""

    def measure() -> dict[str, float]:
        from ...lab.data import fixed_windows
        from ...lab.train import validation_loss
        from ...model import GPTConfig

        budget = _books_budget()
        config = dict(n_layer=2, n_head=4, n_embd=64, block_size=budget.train_length, pe="kerple_log")
        config.update(refiner="conv", refiner_kernel=3)
        models = _run_models(
            channel, {"conv k=3": GPTConfig(**config), "leaky_conv k=3": GPTConfig(**config, fast=False)}
        )
        for block in models["leaky_conv k=3"].blocks:
            block.attn.refiner.__class__ = ConvRefinerWithoutTril  # the same parameters, the mask ignored
        windows = fixed_windows(_validation_tokens(), budget.train_length + 1, budget.val_windows, seed=0)
        return {
            name: validation_loss(model, windows, budget.batch, torch.device("cpu")) for name, model in models.items()
        }

    return measure


framework.MEASURED_BY_GRADER["leakage"] = _grader_final_losses
