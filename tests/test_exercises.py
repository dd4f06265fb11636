"""Every exercise check passes a correct answer, says "not done yet" for the stub, and fails wrong answers.

The correct answers here are written independently of minidape's code (from the papers' formulas), so a check
that compared against the wrong thing would fail them.
"""
import math

import pytest
import torch
from torch import nn

import minidape as md
from minidape import exercises
from minidape.exercises import FAILED, NOT_DONE, PASSED
from minidape.model import PE_REGISTRY


def verdict(name, *answer):
    exercises.check(name, *answer)
    return exercises.results[name]


# ------------------------------------------------------------------------------------- correct answers


def sinusoidal_table(positions, d):
    omega = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = positions.double()[:, None] * omega
    table = torch.empty(len(positions), d, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = angle.sin(), angle.cos()
    return table


def rope_ones_score(distance, head_size):
    theta = 10000.0 ** (-torch.arange(0, head_size, 2, dtype=torch.float64) / head_size)
    return (2 * torch.cos(distance * theta)).sum().item()


def alibi_bias(n_head, q_pos, k_pos):
    slopes = torch.tensor([2.0 ** (-8 * h / n_head) for h in range(1, n_head + 1)])
    return -slopes[:, None, None] * (q_pos[:, None] - k_pos[None, :]).clamp(min=0).float()


def find_shift(kernel, n):
    K = md.kernels.gram(kernel, n)
    c = 1.0
    while md.kernels.smallest_eigenvalue(K + c) < -1e-10 * (K + c).abs().max().item():
        c *= 2
    return c


def square_quadratic_form(x, c):
    return 2 * (c @ x) ** 2


def kerple_log_bias(r1, r2, q_pos, k_pos):
    distance = (q_pos[:, None] - k_pos[None, :]).clamp(min=0).float()
    return -r1[:, None, None] * torch.log1p(r2[:, None, None] * distance)


def protocols_from_curve(curve, T, k):
    k = min(k, T)
    return math.exp(curve[T - k:T].mean()), math.exp(curve[:T].mean())


def running_mean(curve, width):
    sums = torch.cat([curve.new_zeros(1), curve.cumsum(0)])
    ends = torch.arange(1, len(curve) + 1)
    starts = (ends - width).clamp(min=0)
    return (sums[ends] - sums[starts]) / (ends - starts)


class MyDAPE(nn.Module):
    """Eq. (3) with the per-cell MLP written as contractions over the channel axis."""

    def __init__(self, cfg):
        super().__init__()
        self.first = nn.Linear(2 * cfg.n_head, cfg.refiner_width)
        self.second = nn.Linear(cfg.refiner_width, cfg.n_head)

    def forward(self, scores, bias, mask):
        both = torch.cat([scores, bias.expand_as(scores)], dim=1)                       # (B, 2h, T, T)
        hidden = torch.einsum("wc,bcij->bwij", self.first.weight, both) + self.first.bias[:, None, None]
        hidden = torch.nn.functional.leaky_relu(hidden, 0.01)
        out = torch.einsum("hw,bwij->bhij", self.second.weight, hidden) + self.second.bias[:, None, None]
        return scores + bias + out


def dape_parameter_count(n_head, width):
    return 2 * n_head * width + width + width * n_head + n_head


def far_attention(model, idx, train_length):
    T = idx.shape[1]
    masses = [model.attention_maps(idx, layer)["probs"][0, :, -1, :T - train_length].sum(-1)
              for layer in range(model.cfg.n_layer)]
    return torch.stack(masses).mean().item()


class MyConvRefiner(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        k = cfg.refiner_kernel
        self.conv = nn.Sequential(nn.Conv2d(2 * cfg.n_head, cfg.refiner_width, (1, k), padding=(0, k // 2)),
                                  nn.LeakyReLU(0.01),
                                  nn.Conv2d(cfg.refiner_width, cfg.n_head, (1, k), padding=(0, k // 2)))

    def forward(self, scores, bias, mask):
        bias = bias.expand_as(scores)
        features = torch.cat([scores, bias], dim=1).masked_fill(~mask, 0)
        return scores + bias + self.conv(features)


def receptive_keys(i, j, k):
    reach = 2 * (k // 2)
    return list(range(max(0, j - reach), min(i, j + reach) + 1))


def cauchy(m, n):
    return 1.0 / (1 + ((m - n) / 8.0) ** 2)


class CauchyBias(md.AdditiveBias):
    def __init__(self, cfg):
        super().__init__()
        self.width = nn.Parameter(torch.linspace(1.0, 4.0, cfg.n_head))

    def forward(self, q_pos, k_pos):
        distance = (q_pos[:, None] - k_pos[None, :]).clamp(min=0).float()
        return 1 / (1 + (distance / self.width.exp()[:, None, None]) ** 2)


def parity_sample(batch, n, generator):
    inputs = torch.randint(0, 2, (batch, n), generator=generator)
    return inputs, inputs.sum(dim=1, keepdim=True) % 2


def output_length(name, n):
    return {"reverse_string": n, "duplicate_string": 2 * n, "compute_sqrt": math.ceil(n / 2),
            "binary_addition": n + 1}[name]


def masked_accuracy(logits, targets, end_token):
    is_end = (targets == end_token).int()
    scored = (is_end.cumsum(1) - is_end) == 0              # no END strictly before
    correct = (logits.argmax(-1) == targets) & scored
    return (correct.sum() / scored.sum()).item()


def stub(*args, **kwargs):
    exercises.todo()


class StubBias(md.AdditiveBias):
    """The notebook's stub of exercise my_bias: the class exists, its forward is not written."""

    def __init__(self, cfg):
        super().__init__()

    def forward(self, q_pos, k_pos):
        exercises.todo()


class Runs(dict):
    """The runs of exercise my_runs, built when the check reads them (pe="my_bias" exists only in a test)."""

    def __init__(self, **first_overrides):
        super().__init__()
        self.first_overrides = first_overrides

    def built(self):
        config = dict(n_layer=2, n_head=4, n_embd=64, block_size=64)
        return {"kerple": md.GPTConfig(pe="kerple_log", **{**config, **self.first_overrides}),
                "mine": md.GPTConfig(pe="my_bias", **config),
                "dape-mine": md.GPTConfig(pe="my_bias", refiner="dape", **config)}


LAST_K = {"rope": {64: 10.0, 1024: 31.0}}
HISTORIES = {"conv k=3": [{"val_loss": 2.0}], "leaky_conv k=3": [{"val_loss": 0.5}]}

# name -> (correct answer, a wrong answer); each tuple is the argument list of exercises.check
CASES = {
    "sinusoidal_table": ((sinusoidal_table,),
                         (lambda p, d: torch.cat([sinusoidal_table(p, d)[:, 0::2], sinusoidal_table(p, d)[:, 1::2]], 1),)),
    "rope_ones_score": ((rope_ones_score,), (lambda t, d: float(d),)),
    "alibi_bias": ((alibi_bias,), (lambda h, q, k: alibi_bias(h, q, k) / 2,)),
    "find_shift": ((find_shift,), (lambda kernel, n: 2 * find_shift(kernel, n),)),
    "square_quadratic_form": ((square_quadratic_form,), (lambda x, c: (c @ x) ** 2,)),
    "kerple_log_bias": ((kerple_log_bias,), (lambda r1, r2, q, k: kerple_log_bias(r2, r1, q, k),)),
    "protocols_from_curve": ((protocols_from_curve,), (lambda curve, T, k: protocols_from_curve(curve, T, k)[::-1],)),
    "running_mean": ((running_mean,), (lambda curve, w: torch.nn.functional.avg_pool1d(
        torch.nn.functional.pad(curve[None, None], (w - 1, 0), mode="replicate"), w, stride=1)[0, 0],)),
    "rope_ratio": ((True, 3.1, LAST_K, 64, 1024), (True, 31.0, LAST_K, 64, 1024)),
    "dape_refiner": ((MyDAPE,), (type("NoResidual", (MyDAPE,), {"forward": lambda self, s, b, m: MyDAPE.forward(
        self, s, b, m) - b}),)),
    "dape_parameter_count": ((dape_parameter_count,), (lambda h, w: 3 * h * w,)),
    "far_attention": ((far_attention,), (lambda model, idx, L: far_attention(model, idx, L // 2),)),
    "conv_refiner": ((MyConvRefiner,), (type("NoTril", (MyConvRefiner,), {"forward": lambda self, s, b, m: s + b
                                                                         + self.conv(torch.cat([s, b.expand_as(s)], 1))}),)),
    "receptive_keys": ((receptive_keys,), (lambda i, j, k: list(range(max(0, j - k // 2), j + k // 2 + 1)),)),
    "leakage": ((True, {"conv k=3": 2.0, "leaky_conv k=3": 0.5}, HISTORIES),
                (True, {"conv k=3": 0.5, "leaky_conv k=3": 2.0}, HISTORIES)),
    "my_kernel": ((cauchy,), (lambda m, n: (m - n).abs(),)),
    "my_bias": ((CauchyBias,), (type("Absolute", (CauchyBias,), {"forward": lambda self, q, k: CauchyBias.forward(
        self, q, k) + q[:, None].float() / 100}),)),
    "my_runs": ((Runs(),), (Runs(n_layer=1),)),
    "parity_sample": ((parity_sample,), (lambda b, n, g: (torch.randint(0, 2, (b, n), generator=g),
                                                           torch.zeros(b, 1, dtype=torch.long)),)),
    "output_length": ((output_length,), (lambda name, n: n,)),
    "masked_accuracy": ((masked_accuracy,), (lambda logits, targets, end: (logits.argmax(-1) == targets)
                                             .float().mean().item(),)),
}


@pytest.fixture(autouse=True)
def my_bias_registered(monkeypatch):
    """pe="my_bias" registered for one test only, so that tests looping over md.PE_NAMES never meet it."""
    monkeypatch.setitem(PE_REGISTRY, "my_bias", CauchyBias)


def resolved(answer):
    return tuple(value.built() if isinstance(value, Runs) else value for value in answer)


def test_every_exercise_has_a_case_and_every_notebook_three_exercises():
    assert set(CASES) == set(exercises.EXERCISES)
    for notebook in ("01", "02", "03", "04", "05", "06", "07"):
        assert len(exercises.exercises_of(notebook)) >= 3, notebook
    kinds = {exercise.kind for exercise in exercises.EXERCISES.values()}
    assert kinds == {"derive", "implement", "experiment"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_correct_answer_passes(name):
    assert verdict(name, *resolved(CASES[name][0])) == PASSED


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_wrong_answer_fails_with_a_hint(name, capsys):
    assert verdict(name, *resolved(CASES[name][1])) == FAILED
    assert "hint:" in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_stub_is_not_done_yet(name):
    correct = resolved(CASES[name][0])
    # the stub of an exercise is its first argument left as `todo()` (a function or class) or None (a value)
    first = correct[0]
    if isinstance(first, type) and issubclass(first, md.AdditiveBias):
        stubbed = StubBias
    else:
        stubbed = stub if callable(first) and not isinstance(first, dict) else None
    assert verdict(name, stubbed, *correct[1:]) == NOT_DONE


def test_a_class_stub_that_calls_todo_in_init_is_not_done_yet():
    class Stub(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            exercises.todo()
    assert verdict("dape_refiner", Stub) == NOT_DONE


def test_summary_raises_on_a_wrong_answer_only(capsys):
    exercises.results.clear()
    exercises.check("output_length", stub)
    assert exercises.summary("07")["output_length"] == NOT_DONE
    exercises.check("output_length", CASES["output_length"][1][0])
    with pytest.raises(exercises.ExerciseFailed, match="output_length"):
        exercises.summary("07")


def test_in_the_graders_worker_checks_record_their_answers_for_the_grader(monkeypatch):
    monkeypatch.setattr(exercises, "answers", {})
    exercises.check("output_length", output_length)
    exercises.check("running_mean", stub, width=3)
    assert exercises.answers == {"output_length": ((output_length,), {}), "running_mean": ((stub,), {"width": 3})}


def test_an_unknown_exercise_names_the_valid_ones():
    with pytest.raises(ValueError, match="unknown exercise 'nope'.*sinusoidal_table"):
        exercises.check("nope", None)
