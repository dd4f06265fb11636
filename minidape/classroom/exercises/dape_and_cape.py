"""The checks of notebook 04's exercises."""

from __future__ import annotations

from functools import partial

import torch

from . import framework  # framework.CHECK_DEVICE is read at call time (the grader sets it)
from .framework import Credit, Wrong, _exercise
from .helpers import (
    _books_budget,
    _choice,
    _compare_refiners,
    _config,
    _distinct,
    _draw,
    _fresh_generator,
    _given,
    _measurement,
    _number,
    _prediction_credit,
    _run_models,
    _this_run,
    _validation_tokens,
)


@_exercise(
    "04",
    "implement",
    "DAPE's refiner, eq. (3): A = S + B + f([S, B])",
    (
        "f is a small MLP applied to every cell (i, j) on its own: it reads that cell's scores and biases of "
        "all heads (2h channels) and writes one correction per head",
        "bring B to the shape of S, concatenate them along the head axis, move that axis last so that the "
        "Linear layers act on each cell's channels, move it back, and add both residuals",
    ),
    points=3,
)
def dape_refiner(your_class):
    _compare_refiners(your_class, "dape", "MyDAPE")


@_exercise(
    "04",
    "derive",
    "parameters and multiply-accumulates of f, for the three DAPE variants",
    (
        "f is one MLP applied to every cell: count what one application costs, then how many cells it is "
        "applied to; a Linear layer holds a weight per (input, output) pair and a bias per output",
        "parameters do not depend on batch or T; multiply-accumulates are one application's (one per weight) "
        "times the number of cells f runs on, which the exercise states",
    ),
    points=2,
)
def dape_cost(your_function):
    from ...model import REFINER_REGISTRY

    generator = _fresh_generator()
    draw = partial(_draw, generator)
    for variant in ("dape", "dape_concat", "dape_add"):
        h, W, batch, T = draw(2, 17), draw(3, 65), draw(1, 9), draw(8, 600)
        cfg = _config(n_head=h, n_embd=4 * h, refiner=variant, refiner_width=W)
        refiner = REFINER_REGISTRY[variant](cfg)
        params = sum(p.numel() for p in refiner.parameters())
        layers = [m for m in refiner.modules() if isinstance(m, torch.nn.Linear)]
        n_in = layers[0].in_features  # what f reads per cell
        macs = batch * T**2 * sum(layer.weight.numel() for layer in layers)  # one MAC per weight per cell
        answer = _given(your_function, "dape_cost")(variant, h, W, batch, T)
        if not (isinstance(answer, (tuple, list)) and len(answer) == 2):
            raise Wrong(f"dape_cost should return a pair (parameters, MACs), got {answer!r}")
        got_params, got_macs = (_number(v, label) for v, label in zip(answer, ("the parameter count", "the MACs")))
        where = f"dape_cost({variant!r}, h={h}, W={W}, batch={batch}, T={T})"
        problems = []
        if got_params != params:
            known = {
                n_in * W + W * h: (
                    "counts the weights but not the biases",
                    "each Linear also has one bias per output",
                ),
                2 * h * W + W + W * h + h: ("gives dape_add 2h inputs", "dape_add feeds f the sum S + B: h channels"),
                h * W + W + W * h + h: ("gives f h inputs", "dape and dape_concat feed f [S, B]: 2h channels"),
            }
            what, hint = known.get(int(got_params), ("is not the parameter count of f", None))
            problems.append((f"your parameter count {got_params:g} {what}", hint))
        if got_macs != macs:
            known = {
                2 * macs: (
                    "counts FLOPs (2 per multiply-accumulate)",
                    "count multiply-accumulates: one per weight per cell",
                ),
                batch * T * (T + 1) // 2 * (n_in * W + W * h): (
                    "counts the causal triangle only",
                    "f runs on every cell of the grid, above the diagonal too: the mask comes after it",
                ),
                batch * T * T * (n_in * W + W * h + W + h): (
                    "counts the biases as multiply-accumulates",
                    "a bias is an addition, not a multiply-accumulate",
                ),
            }
            what, hint = known.get(int(got_macs), ("is not the multiply-accumulates of f", None))
            problems.append((f"your MAC count {got_macs:g} {what}", hint))
        if len(problems) == 2:
            raise Wrong(f"{where}: {problems[0][0]}; {problems[1][0]}", hint=problems[0][1] or problems[1][1])
        if problems:
            return Credit(
                1,
                f"{where}: {problems[0][0]} (hint: {problems[0][1] or 'recount'}); the other part is right",
                answer_right=False,
            )


@_exercise(
    "04",
    "implement",
    "attention mass beyond one training length",
    (
        "the far attention is the share of the last query's attention that lands on keys more than one "
        "training length back",
        "model.attention_maps(idx, layer)['probs'] is (batch, heads, queries, keys): for each layer take the "
        "last query's row, add up its far keys, and average over heads and layers",
    ),
    points=2,
)
def far_attention(your_function):
    from ...model import GPT

    generator = _fresh_generator()
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=generator)))
    model = GPT(_config(n_layer=2, pe="kerple_log", refiner="dape", refiner_width=8)).to(framework.CHECK_DEVICE).eval()
    idx = torch.randint(0, 256, (1, 48), generator=generator).to(framework.CHECK_DEVICE)
    L = 16
    with torch.no_grad():
        probs = torch.stack([model.attention_maps(idx, layer)["probs"][0, :, -1] for layer in range(2)]).cpu()
        got = _number(_given(your_function, "far_attention")(model, idx, L), "far_attention(model, idx, train_length)")
    want = probs[..., : 48 - L].sum(-1).mean().item()
    mistakes = {
        "the attention on the last train_length keys (the near ones), not the far ones": (
            probs[..., 48 - L :].sum(-1).mean().item(),
            "far keys are 0 .. T - train_length - 1",
        ),
        "one key too many: keys 0 .. T - train_length": (
            probs[..., : 48 - L + 1].sum(-1).mean().item(),
            "count the far keys: the last train_length keys are the near ones, every key before them is far",
        ),
        "one key too few": (
            probs[..., : 48 - L - 1].sum(-1).mean().item(),
            "count the far keys: the last train_length keys are the near ones, every key before them is far",
        ),
        "the first query's attention, not the last one's": (1.0, "the last query is index -1 of the query axis"),
        "summed over heads instead of averaged": (
            probs[..., : 48 - L].sum(-1).mean(0).sum().item(),
            "average over heads and layers",
        ),
    }
    if abs(got - want) <= 1e-5:
        return
    for description, (value, hint) in mistakes.items():
        if abs(got - value) <= 1e-5:
            raise Wrong(f"on a small random model you measured {got:.5f}: {description}", hint=hint)
    yours, theirs = _distinct(got, want, digits=5)
    raise Wrong(f"on a small random model your far attention is {yours}, minidape's attention maps give {theirs}")


@_exercise(
    "04",
    "experiment",
    "predict, then measure, which model keeps its attention more local at 16×",
    (
        "the more local model puts less of its attention beyond one training length: compare the two trained "
        "models' far shares",
        "measure each model with far_attention on both windows, and average the two windows per model",
    ),
    points=2,
)
def locality(prediction, shares, recomputed=None):
    """The grader binds ``recomputed`` (:func:`_grader_far_shares`): its own measurement of the run's two models,
    which the shares handed in must be."""
    predicted = _choice(prediction, ("kerple_log", "dape-kerple"), "more_local (your prediction)")
    shares = _given(shares, "far_shares (your measurement)")
    if not isinstance(shares, dict) or set(shares) != {"kerple_log", "dape-kerple"}:
        raise Wrong("far_shares should be a dict with the keys 'kerple_log' and 'dape-kerple'")
    values = {name: _number(value, f"far_shares[{name!r}]") for name, value in shares.items()}
    if not all(0 <= value <= 1 for value in values.values()):
        raise Wrong(
            f"attention shares lie between 0 and 1; yours are {values}",
            hint="far_attention returns a probability mass: a sum of softmax weights, averaged",
        )
    labels = {name: f"far attention share of {name}" for name in values}
    if recomputed is not None:
        _this_run(values, recomputed(), labels)
    truth, source = _measurement("locality", values, labels)
    local = min(truth, key=truth.get)
    shares = _distinct(100 * truth[local], 100 * max(truth.values()), digits=3)
    return _prediction_credit(
        2,
        predicted == local,
        f"in {source}, {local} puts less attention beyond one training length ({shares[0]}% against {shares[1]}%)",
    )


def _grader_far_shares(answers, channel):
    """What the grader binds to locality's ``recomputed``: its own far attention shares of the two models the run
    trained (rebuilt from their weights, notebook 04's ``config()`` and ``config(refiner="dape")``), each averaged
    over the notebook's two windows of the budget's longest length (the first and the last of the validation
    split), from minidape's attention maps."""

    def measure() -> dict[str, float]:
        from ...model import GPTConfig

        budget = _books_budget()
        L, T = budget.train_length, budget.lengths[-1]

        def config(refiner):
            return GPTConfig(
                n_layer=2, n_head=4, n_embd=64, block_size=L, pe="kerple_log", refiner=refiner, refiner_width=32
            )

        models = _run_models(channel, {"kerple_log": config("none"), "dape-kerple": config("dape")})
        tokens = _validation_tokens()
        windows = [tokens[:T].long()[None], tokens[-T:].long()[None]]
        with torch.no_grad():
            return {
                name: sum(
                    torch.stack(
                        [
                            model.attention_maps(window, layer)["probs"][0, :, -1, : T - L].sum(-1)
                            for layer in range(model.cfg.n_layer)
                        ]
                    )
                    .mean()
                    .item()
                    for window in windows
                )
                / len(windows)
                for name, model in models.items()
            }

    return measure


framework.MEASURED_BY_GRADER["locality"] = _grader_far_shares
