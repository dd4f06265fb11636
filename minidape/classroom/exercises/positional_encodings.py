"""The checks of notebook 01's exercises."""

from __future__ import annotations

import math

import torch

from .framework import Wrong, _exercise
from .helpers import _compare, _distinct, _fresh_generator, _given, _number, _pe_module, _prediction_credit


@_exercise(
    "01",
    "implement",
    "the sinusoidal table P (Vaswani et al.)",
    (
        "each position gets, for every frequency, the sine and the cosine of one angle (position times "
        "frequency); the frequencies fall geometrically from 1 for the first pair to nearly 1/10000 for the last",
        "build the table of angles (positions × frequencies) by broadcasting, then put its sines in the even "
        "columns and its cosines in the odd ones",
    ),
    points=2,
)
def sinusoidal_table(your_function):
    generator = _fresh_generator()
    for d in (8, 64):
        positions = torch.randint(0, 2000, (6,), generator=generator)
        positions[0] = 0
        want = _pe_module(pe="sinusoidal", n_embd=d, n_head=2)(positions).double()
        got = _given(your_function, "sinusoidal_table")(positions.clone(), d)

        def table(exponent, first=torch.sin, second=torch.cos, interleave=True):
            angle = positions.double()[:, None] * 10000.0 ** (exponent * torch.arange(d // 2, dtype=torch.float64) / d)
            if not interleave:
                return torch.cat([first(angle), second(angle)], dim=1)
            return torch.stack([first(angle), second(angle)], dim=2).flatten(1)

        mistakes = {
            "all the sines come first and all the cosines after; minidape interleaves them": (
                table(-2, interleave=False),
                "minidape interleaves: the sine and the cosine of one frequency sit side by side, sine first",
            ),
            "sin and cos are swapped: your even columns hold cosines": (
                table(-2, torch.cos, torch.sin),
                "the even column of each pair holds the sine, the odd one the cosine",
            ),
            "your frequencies are ω_i = 10000^(-i/d), too slow": (
                table(-1),
                "the exponent grows by 2/d from one pair to the next: the last pair's frequency is close to "
                "1/10000, not 1/100",
            ),
            "your frequencies grow with i (ω_i = 10000^(+2i/d))": (
                table(2),
                "ω_i = 10000^(-2i/d): the first pair turns fastest (ω_0 = 1), the last slowest",
            ),
        }
        _compare(got, want, f"P (d = {d})", ("row", "channel"), mistakes=mistakes, atol=1e-4, rtol=0)


@_exercise(
    "01",
    "derive",
    "RoPE's score <R_t q, R_0 k> of any q and k, in closed form",
    (
        "a rotation acts on each pair of channels (i, i + d/2) on its own, so the score is a sum over pairs of "
        "2-D dot products, each between a rotated q-pair and an unrotated k-pair",
        "write out one pair: rotate (q1, q2) by the angle α, dot it with (k1, k2), and collect the terms that "
        "carry cos α and those that carry sin α; then sum over the pairs with the angles t·θ_i",
    ),
    points=2,
)
def rope_score(your_function):
    from ...model import apply_rotary

    generator = _fresh_generator()

    def score(q, k, t, pairs="halves", exponent=-2, sin_sign=1):
        d = len(q)
        theta = 10000.0 ** (exponent * torch.arange(d // 2, dtype=torch.float64) / d)
        cos, sin = torch.cos(t * theta)[None], sin_sign * torch.sin(t * theta)[None]
        if pairs == "interleaved":  # pair i = channels (2i, 2i + 1): reorder to halves
            order = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])
            q, k = q[order], k[order]
        rotated = apply_rotary(q[None, None, None], cos, sin)
        return (rotated * k).sum().item()

    ambiguous = None  # the first check whose value two of the mistakes below would give
    for head_size in (8, 32):
        for t in [0] + torch.randint(1, 3000, (3,), generator=generator).tolist():
            q, k = (torch.randn(head_size, generator=generator, dtype=torch.float64) for _ in range(2))
            got = _number(_given(your_function, "rope_score")(q.clone(), k.clone(), t), "rope_score(q, k, t)")
            want = score(q, k, t)
            # θ and tθ in float32 (torch's default dtype) are right too: an angle tθ near t rounds by up to
            # t·2⁻²⁴, which moves each pair's term by that much times |q||k|
            tolerance = (1e-6 + 2 * max(t, 1) * 2.0**-24) * (1 + q.abs().sum().item() * k.abs().max().item())
            if abs(got - want) <= tolerance:
                continue
            yours, theirs = _distinct(got, want)
            where = f"rope_score(q, k, t={t}) for random q, k of size {head_size} is {yours}"
            half = head_size // 2
            no_sin = (
                (
                    torch.cos(t * 10000.0 ** (-2 * torch.arange(half, dtype=torch.float64) / head_size))
                    * (q[:half] * k[:half] + q[half:] * k[half:])
                )
                .sum()
                .item()
            )
            mistakes = {
                "it is the score at -t: q and k swapped roles, or the sin term has the wrong sign": (
                    score(q, k, t, sin_sign=-1),
                    "R_t rotates q forward by tθ_i: <R_t q, R_0 k> = <q, R_{-t} k>",
                ),
                "it has only the cos term": (
                    no_sin,
                    "the rotation mixes the two channels of a pair, so a term with the sine of the angle "
                    "remains: write the rotated pair out and collect it",
                ),
                "it pairs channels (2i, 2i+1); minidape (apply_rotary) pairs channel i with channel i + d/2": (
                    score(q, k, t, pairs="interleaved"),
                    "pair i is (x[i], x[i + d/2]): q[:d//2] with q[d//2:]",
                ),
                "it uses θ_i = 10000^(-i/d), too slow": (score(q, k, t, exponent=-1), "θ_i = 10000^(-2i/d)"),
            }
            named = [
                (description, hint) for description, (value, hint) in mistakes.items() if abs(got - value) <= tolerance
            ]
            if len(named) == 1:
                raise Wrong(f"{where}: {named[0][0]}", hint=named[0][1])
            if named:  # two mistakes give this value at this t (within its tolerance): the next t tells them apart
                ambiguous = ambiguous or where
                continue
            if t == 0:
                raise Wrong(
                    f"{where}, but at t = 0 nothing is rotated: the score is q·k",
                    hint="check your sum at t = 0 first: it must be the plain dot product",
                )
            raise Wrong(f"{where}, which is not <R_t q, R_0 k> ({theirs}, with float32's rounding allowed)")
    if ambiguous is not None:
        raise Wrong(f"{ambiguous}, which is not <R_t q, R_0 k>")


@_exercise(
    "01",
    "implement",
    "ALiBi's bias for any query and key positions",
    (
        "each head subtracts a penalty proportional to the distance i - j, with a slope of its own; the "
        "slopes fall geometrically from head to head (the notebook gives them)",
        "make the slopes a (heads, 1, 1) tensor and the distances a (queries, keys) one by broadcasting, "
        "and combine them; what the masked cells (j > i) hold does not matter",
    ),
    points=2,
)
def alibi_bias(your_function):
    generator = _fresh_generator()
    for n_head in (4, 8):
        start = int(torch.randint(0, 500, (1,), generator=generator))
        q_pos, k_pos = torch.arange(start + 20, start + 30), torch.arange(start, start + 30)
        got = _given(your_function, "alibi_bias")(n_head, q_pos.clone(), k_pos.clone())
        want = _pe_module(pe="alibi", n_head=n_head, n_embd=8 * n_head)(q_pos, k_pos).detach()
        distance = (q_pos[:, None] - k_pos[None, :]).clamp(min=0).double()

        def bias(heads, sign=-1):
            return sign * torch.tensor([2.0 ** (-8 * h / n_head) for h in heads])[:, None, None] * distance

        mistakes = {
            "your slopes count heads from 0 (2^0 = 1 for the first head)": (
                bias(range(n_head)),
                "h = 1 .. H: the first head's slope is 2^(-8/H)",
            ),
            "your bias is positive: far keys get more attention, not less": (
                bias(range(1, n_head + 1), sign=1),
                "ALiBi subtracts: b = -s_h·(i - j)",
            ),
            "your heads are in reverse order (the gentlest slope first)": (
                bias(range(n_head, 0, -1)),
                "head h = 1 has the steepest slope 2^(-8/H)",
            ),
            "your slopes are 2^(-h/H): the factor 8 is missing": (
                -torch.tensor([2.0 ** (-h / n_head) for h in range(1, n_head + 1)])[:, None, None] * distance,
                "s_h = 2^(-8h/H)",
            ),
        }
        visible = q_pos[:, None] >= k_pos[None, :]
        _compare(
            got, want, f"the bias with {n_head} heads", ("head", "query", "key"), visible=visible, mistakes=mistakes
        )


ENTROPY_LENGTH, ENTROPY_TOLERANCE = 1024, 0.5


def _alibi_entropies(T: int = ENTROPY_LENGTH) -> torch.Tensor:
    """Entropy (nats) of the last query's attention under ALiBi's bias alone (zero content scores), 4 heads."""
    slopes = torch.tensor([2.0 ** (-8 * h / 4) for h in range(1, 5)], dtype=torch.float64)
    p = torch.softmax(-slopes[:, None] * torch.arange(T, dtype=torch.float64), dim=-1)
    return -(p * p.log()).sum(-1)


@_exercise(
    "01",
    "experiment",
    "predict, then measure, how spread out ALiBi's attention is at T = 1024",
    (
        "with content scores 0, a head's attention is the softmax of its bias row, and its entropy (in nats) "
        "says how many keys it reads: weights that fall by a factor e every n keys are about as spread out "
        "as e·n equally weighted keys",
        "measure per head on the last query's row of 1024 keys (softmax, then the entropy with the natural "
        "log), and average the 4 heads",
    ),
    points=2,
)
def alibi_entropy(prediction, measured):
    predicted = _number(prediction, "entropy_prediction (your prediction, in nats)")
    measured = _number(measured, "entropy_measured (your measurement)")
    entropies = _alibi_entropies()
    want = entropies.mean().item()
    mistakes = {
        "bits, not nats": (want / math.log(2), "use the natural log: -Σ p ln p"),
        "the sum over heads, not the mean": (entropies.sum().item(), "average the 4 heads' entropies"),
        "the entropy of uniform attention, ln T: the bias never reached the softmax": (
            math.log(ENTROPY_LENGTH),
            "softmax the bias row itself: p = softmax(b[h, -1, :])",
        ),
    }
    for description, (value, hint) in mistakes.items():
        if abs(measured - value) < 1e-3:
            raise Wrong(f"your measurement {measured:.4g} is {description}", hint=hint)
    if abs(measured - want) > 1e-3:
        raise Wrong(f"your measurement {measured:.4g} is not the mean entropy of the last query's attention")
    held = abs(predicted - want) <= ENTROPY_TOLERANCE
    return _prediction_credit(
        2,
        held,
        f"measured {want:.2f} nats (uniform attention over {ENTROPY_LENGTH} keys: "
        f"{math.log(ENTROPY_LENGTH):.2f}); you predicted {predicted:.2f}, "
        f"tolerance ±{ENTROPY_TOLERANCE}",
    )
