"""The checks of notebook 08's exercises."""

from __future__ import annotations

import math

import torch

from . import framework
from .framework import Wrong, _exercise
from .helpers import (
    _books_budget,
    _choice,
    _compare,
    _fresh_generator,
    _given,
    _measurement,
    _number,
    _prediction_credit,
    _run_models,
    _this_run,
    _validation_tokens,
)

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
def where_fox_forgets(prediction, measured, mean_gate, recomputed=None):
    """The grader binds ``recomputed`` (:func:`_grader_fox_gates`): its own measurement of the gates of the FoX
    model the run trained, which ``mean_gate`` must be."""
    kinds = tuple(mean_gate)
    predicted = _choice(prediction, kinds, "fox_prediction (your prediction)")
    measured = _choice(measured, kinds, "forgets_most (your measurement)")
    gates = {kind: _number(gate, f"mean_gate[{kind!r}]") for kind, gate in mean_gate.items()}
    labels = {kind: f"mean forget gate after {kind} bytes" for kind in kinds}
    if recomputed is not None:  # graded: the run's own model's gates, measured by the grader, not typed or copied
        _this_run(gates, recomputed(), labels)
    # the gates must also agree with the teacher's reference run of the same mode, and the prediction is judged on
    # the full-mode reference
    truth, _ = _measurement(
        "where_fox_forgets",
        gates,
        labels,
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


FOX_TEXT = 4096  # 8.3 measures the gates over the first 4,096 bytes of the validation split


def _mean_forget_gates(model, text: torch.Tensor) -> dict[str, float]:
    """The mean forget gate $f_t$ of a FoX model after each kind of byte of ``text`` (over layers and heads): each
    layer's gates computed from that layer's own input, as FoX's bias reads them."""
    with torch.no_grad():
        x, layer_inputs = model.hidden_states(text[None].long(), upto_layer=0)
        per_layer = []
        for layer, block in enumerate(model.blocks):
            per_layer.append(block.attn.data_bias.log_forget(block.ln_1(x)).exp()[0])  # (n_head, T)
            x = block(x, layer_inputs[layer])
    per_byte = torch.cat(per_layer).mean(0)  # (T,)
    characters = [chr(byte) for byte in text.tolist()]
    kinds = {
        "letter": torch.tensor([c.isalpha() for c in characters]),
        "space": torch.tensor([c == " " for c in characters]),
        "newline": torch.tensor([c == "\n" for c in characters]),
        "punctuation": torch.tensor([c in ".,;:!?\"'-" for c in characters]),
    }
    return {kind: per_byte[where].mean().item() for kind, where in kinds.items() if where.any()}


def _grader_fox_gates(answers, channel):
    """What the grader binds to where_fox_forgets' ``recomputed``: the mean gates of the FoX model the run trained
    (its ``trained["FoX"]``, rebuilt from its weights with notebook 08's config) over the validation text."""

    def measure() -> dict[str, float]:
        from ...model import GPTConfig

        train_length = _books_budget().train_length
        cfg = GPTConfig(n_layer=4, n_head=4, n_embd=64, block_size=train_length, pe="fox")
        model = _run_models(channel, {"FoX": cfg}, variable="trained")["FoX"]
        return _mean_forget_gates(model, _validation_tokens()[:FOX_TEXT])

    return measure


framework.MEASURED_BY_GRADER["where_fox_forgets"] = _grader_fox_gates


def _stick_breaking_by_loops(z: torch.Tensor, first: int = 1, last: int = 0, oldest_first: bool = False):
    r"""Stick-breaking weights from the logits, one product per cell (Tan et al., ICLR 2025, eq. 4):
    $A_{ij} = \beta_{ij} \prod_{k} (1 - \beta_{ik})$, $\beta = \sigma(z)$, over $k = j + first .. i - 1 + last$
    (the paper: first = 1, last = 0, the keys strictly between) or, ``oldest_first``, over the keys $k < j$; 0
    where $j \ge i$. The other arguments give the usual mistakes."""
    beta = torch.sigmoid(z)
    T = z.shape[-1]
    weights = torch.zeros_like(z)
    for i in range(T):
        for j in range(i):
            passed = beta[..., i, :j] if oldest_first else beta[..., i, j + first : i + last]
            weights[..., i, j] = beta[..., i, j] * (1 - passed).prod(-1)
    return weights


@_exercise(
    "08",
    "implement",
    "stick-breaking attention weights from the logits",
    (
        "a query breaks one stick of length 1, starting from its nearest earlier key and going back: each key "
        "takes its share of what the keys nearer to the query left over",
        "what the nearer keys left over is a product of what each of them did not take: a cumulative sum of "
        "logarithms along the keys, run from the query's end, holds all those products at once",
    ),
    points=2,
)
def stick_breaking_weights(your_function):
    your_function = _given(your_function, "stick_breaking_weights")
    generator = _fresh_generator()
    batch, n_head, T = 2, 3, int(torch.randint(6, 14, (1,), generator=generator))
    z = 2 * torch.randn(batch, n_head, T, T, generator=generator, dtype=torch.float64)
    want = _stick_breaking_by_loops(z)
    earlier = torch.ones(T, T, dtype=torch.bool).tril(-1)  # the keys j < i a query attends to
    got = your_function(z.clone())
    masked = z.masked_fill(~earlier, float("-inf"))
    mistakes = {
        "each key also gives up its own share: the product runs over k = j .. i-1, not over the keys strictly "
        "between": (
            _stick_breaking_by_loops(z, first=0),
            "key j takes its share of what the nearer keys left: its own 1 - beta is not part of what is left",
        ),
        "your stick starts at the query itself (k = i is in the product): the query is not one of its keys": (
            _stick_breaking_by_loops(z, last=1),
            "the keys of query i are j < i: the nearest one, i - 1, is served first and takes its full share",
        ),
        "you break the stick from the oldest key forward: the first key, not the nearest, is served first": (
            _stick_breaking_by_loops(z, oldest_first=True),
            "the keys that come before j in the product are those between j and the query",
        ),
        "these are softmax weights over the earlier keys: stick-breaking has no softmax": (
            torch.softmax(masked, -1).nan_to_num(0.0),
            "each key's share is the sigmoid of its own logit, not a share of a sum over all keys",
        ),
        "your weights are transposed (key on the rows, query on the columns)": (
            want.transpose(-1, -2),
            "put the query on the rows and the key on the columns",
        ),
    }
    _compare(got, want, "stick_breaking_weights(z)", ("batch", "head", "query", "key"), earlier, mistakes, atol=1e-8)
    if got.detach().double().cpu().masked_fill(earlier, 0.0).abs().max() > 1e-8:
        raise Wrong(
            "stick_breaking_weights(z) is not 0 at some key j >= i (the query itself or a later key)",
            hint="a query attends to earlier keys only: every other weight is 0",
        )


def _path_by_matrices(q, k, w, beta, first: int = 1, last: int = 0, reverse: bool = False, sign: float = -1.0):
    r"""PaTH's scores with every transform written out as a matrix (Yang et al., NeurIPS 2025, eq. 2-3):
    $S_{ij} = q_i^\top H_i H_{i-1} \cdots H_{j+1} k_j$, $H_t = I - \beta_t w_t w_t^\top$, for $j \le i$ (0 above).
    The arguments give the usual mistakes: the transforms of $t = j + first .. i + last$, multiplied in
    ``reverse`` order, or $H_t = I + \beta_t w_t w_t^\top$ (``sign`` = +1)."""
    T, d = q.shape
    transforms = torch.eye(d, dtype=q.dtype) + sign * beta[:, None, None] * w[:, :, None] * w[:, None, :]
    transported = q.new_zeros(T, T)  # S_ij, 0 above the diagonal
    for i in range(T):
        for j in range(i + 1):
            product = torch.eye(d, dtype=q.dtype)
            for t in range(max(j + first, 0), min(i + last, T - 1) + 1):  # H_{j+1} acts on k_j first
                product = product @ transforms[t] if reverse else transforms[t] @ product
            transported[i, j] = q[i] @ product @ k[j]
    return transported


@_exercise(
    "08",
    "implement",
    "PaTH's scores: keys carried through the data's transforms",
    (
        "between key j and query i every token after the key, up to and including the query, transforms the key "
        "once, the token nearest the key first; the transforms do not commute",
        "carry the keys forward: at each new position apply that position's transform to every key carried so "
        "far, add the new key as it is, then score the query there against all of them",
    ),
    points=2,
)
def path_scores(your_function):
    your_function = _given(your_function, "path_scores")
    generator = _fresh_generator()
    T, d = int(torch.randint(5, 10, (1,), generator=generator)), 4
    q, k = (torch.randn(T, d, generator=generator, dtype=torch.float64) for _ in range(2))
    w = torch.nn.functional.normalize(torch.randn(T, d, generator=generator, dtype=torch.float64), dim=-1)
    beta = 2 * torch.rand(T, generator=generator, dtype=torch.float64)
    want = _path_by_matrices(q, k, w, beta)
    visible = torch.ones(T, T, dtype=torch.bool).tril()  # keys j <= i
    got = your_function(q.clone(), k.clone(), w.clone(), beta.clone())
    mistakes = {
        "your product also holds the key's own transform H_j": (
            _path_by_matrices(q, k, w, beta, first=0),
            "the key's own token does not transform it: the transforms start after the key",
        ),
        "your product stops before the query's transform H_i": (
            _path_by_matrices(q, k, w, beta, last=-1),
            "the query's own token transforms the keys too: up to and including i",
        ),
        "your transforms act in the reverse order (the one nearest the query first)": (
            _path_by_matrices(q, k, w, beta, reverse=True),
            "the key meets the tokens in the order they come after it: the nearest to the key acts first",
        ),
        "your transform adds beta (w . k) w to the key instead of taking it away": (
            _path_by_matrices(q, k, w, beta, sign=1.0),
            "beta = 2 must reflect the key across the plane orthogonal to w",
        ),
        "your scores are the plain dot products q_i . k_j: the tokens in between transform nothing": (
            q @ k.T,
            "each token between key and query transforms the key on its way",
        ),
        "your scores are transposed (key on the rows, query on the columns)": (
            want.T,
            "put the query on the rows and the key on the columns",
        ),
    }
    _compare(got, want, "path_scores(q, k, w, beta)", ("query", "key"), visible, mistakes, atol=1e-8)
