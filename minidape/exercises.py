"""The checks of the notebooks' exercises.

Every exercise of notebooks 01-07 has a name and one check here. A notebook cell calls

    exercises.check("kerple_log_bias", kerple_log_bias)

which prints one verdict:

* ``passed`` — the answer behaves like minidape's own implementation (or like the maths) on random inputs
  (derive exercises: drawn afresh at every check, so a table of answers cannot pass); an experiment whose
  measurement is right passes even when its recorded prediction missed, without the prediction's point;
* ``failed`` — which mistake the check recognises (or where the answer differs), and a hint for that mistake;
* ``partly right`` — some parts of an exercise with parts earned their points, others did not;
* ``not done yet`` — the answer is still the stub (it calls :func:`todo` or is ``None``). A check never passes
  on a stub, and a stub never stops the notebook, so the student edition runs from top to bottom.

Each verdict comes with points (``Exercise.points``; a checker returns a :class:`Credit` for less).
Implementations are compared by behaviour, never by the names or order of minidape's internal parameters:
modules are built from the same config and handed minidape's weights by role (:func:`_hand_over`), and a
difference is named as a known mistake when the check recognises it (:func:`_compare`). A check touches an
answer only by calling it with data and through the small helpers of "how a check touches an answer" below.

:func:`summary` ends each notebook: a table of the verdicts, and an error if an answer is wrong (so a broken
worked solution fails ``make test``, which also sets ``MINIDAPE_EXPECT_EXERCISES`` to ``all`` or ``none``).

Grading (:mod:`minidape.grade`) uses the same checks, but never in the student's process: there :func:`check`
only records its answer in :data:`answers`, and the grader later runs :func:`verdict` in its own process with
the answers as :class:`minidape.sandbox.Remote` handles. A check therefore touches an answer only by calling
it with data (tensors, numbers, strings, configs, picklable objects) and through the helpers of "how a check
touches an answer" below, each of which works on a local object and on a handle alike. What an answer returns
comes back as data.
"""
from __future__ import annotations

import math
import os
import secrets
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch
from torch import nn

PASSED, PARTLY, FAILED, NOT_DONE = "passed", "partly right", "failed", "not done yet"
EXPECT = "MINIDAPE_EXPECT_EXERCISES"     # "all" (worked solutions) or "none" (student edition): see summary()


class NotDone(NotImplementedError):
    """Raised by an exercise's stub: the student has not written this part yet."""


class Wrong(Exception):
    """Raised by a check: the answer runs, but does not do what the exercise asks. The message says how; ``hint``
    (when the check recognised a known mistake) replaces the exercise's general hint."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


# When the grader runs a submission, its answers live in a worker process (``minidape.sandbox``, which builds on
# this module): the checks hold handles on them, and the student's code fails in two more ways.


class RemoteAnswer:
    """Base of the grader's handles on answers that live in its worker (``sandbox.Remote``)."""


class StudentError(Exception):
    """The student's code raised (in the worker): the message names its type and text."""


class WorkerGone(RuntimeError):
    """The worker ended, broke the protocol or did not answer in time."""


@dataclass(frozen=True)
class Credit:
    """What a checker returns when an answer earns less than the exercise's points: the points earned, a note,
    and whether the answer itself is right (``answer_right``: only a prediction missed, so the exercise still
    counts as passed) or only some of its parts are (status "partly right")."""
    points: float
    note: str = ""
    answer_right: bool = True


class ExerciseFailed(AssertionError):
    """Raised by :func:`summary` when a checked answer is wrong."""


def todo(what: str = "this exercise") -> None:
    """The body of a stub: ``def my_function(...): todo()``."""
    raise NotDone(f"{what} is not written yet")


@dataclass(frozen=True)
class Exercise:
    name: str
    notebook: str           # "01" .. "07"
    kind: str               # "derive", "implement" or "experiment"
    title: str
    hint: str
    checker: Callable
    points: int = 1         # what a fully right answer earns; a checker may return a Credit for less


EXERCISES: dict[str, Exercise] = {}
results: dict[str, str] = {}     # this session's verdicts, by exercise name
earned: dict[str, float] = {}    # this session's points, by exercise name
answers: dict | None = None      # the grader's worker sets {}: check() then records (answer, options) by name


def _exercise(notebook: str, kind: str, title: str, hint: str, points: int = 1):
    def register(checker):
        EXERCISES[checker.__name__] = Exercise(checker.__name__, notebook, kind, title, hint, checker, points)
        return checker
    return register


# Per exercise, minidape's own implementation of what it asks for (functions, classes: all their methods, and
# the functions defined inside them). While the grader calls an answer, entering any of these makes the exercise
# fail with a message naming it. Experiments answer with data (measurements, predictions, configs): nothing of
# theirs is called, so nothing is forbidden; a derive exercise that minidape does not compute forbids nothing.
LIBRARY: dict[str, tuple[str, ...]] = {
    # 01
    "sinusoidal_table": ("minidape.model.SinusoidalPositions",),
    "rope_score": ("minidape.model.RotaryEmbedding", "minidape.model.apply_rotary"),
    "alibi_bias": ("minidape.model.ALiBiBias", "minidape.model.alibi_slopes"),
    "alibi_entropy": (),
    # 02
    "square_quadratic_form": ("minidape.kernels.gram",),
    "find_shift": ("minidape.kernels.pd_shift",),
    "shift_growth": (),
    "kerple_log_bias": ("minidape.model.KerpleLogBias",),
    # 03
    "rope_ratio": (),
    "protocols_from_curve": (),
    "running_mean": (),
    # 04
    "dape_refiner": ("minidape.model.DAPERefiner", "minidape.model.DAPEConcatRefiner", "minidape.model.HeadMLP",
                     "minidape.fast.dape", "minidape.fast.dape_concat", "minidape.fast.head_mlp"),
    "dape_cost": ("minidape.model.DAPERefiner", "minidape.model.DAPEConcatRefiner", "minidape.model.DAPEAddRefiner",
                  "minidape.model.HeadMLP"),
    "far_attention": (),
    "locality": (),
    # 05
    "receptive_keys": ("minidape.model.ConvRefiner", "minidape.fast.conv"),
    "conv_refiner": ("minidape.model.ConvRefiner", "minidape.fast.conv"),
    "leakage": (),
    # 06
    "my_kernel": ("minidape.kernels.log_kernel", "minidape.kernels.power_kernel"),
    "far_mass": (),
    "my_bias": ("minidape.model.ALiBiBias", "minidape.model.T5Bias", "minidape.model.KerpleLogBias",
                "minidape.model.KerplePowerBias", "minidape.model.FIREBias"),
    "my_runs": (),
    "best_run": (),
    # 07
    "addition_sample": ("minidape.tasks.BinaryAddition", "minidape.tasks._BinaryOperation"),
    "output_length": ("minidape.tasks.get_task", "minidape.tasks.ReverseString", "minidape.tasks.DuplicateString",
                      "minidape.tasks.ComputeSqrt", "minidape.tasks.BinaryMultiplication",
                      "minidape.tasks.ParityCheck"),
    "masked_accuracy": ("minidape.tasks.accuracy", "minidape.tasks.output_mask"),
    "shuffle_invariance": (),
}


def exercises_of(notebook: str) -> list[Exercise]:
    """The exercises of one notebook ("01" .. "07"), in order."""
    return [exercise for exercise in EXERCISES.values() if exercise.notebook == notebook]


def verdict(name: str, *answer, **options) -> tuple[str, str, float]:
    """Run exercise ``name``'s check on an answer: (status, message, points earned). Random inputs are drawn
    afresh on every call (a seed nobody chose), and the caller's random stream is left as it was."""
    exercise = EXERCISES[name]
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(secrets.randbits(63))
            note = exercise.checker(*answer, **options)
        credit = note if isinstance(note, Credit) else Credit(exercise.points, note or "")
        status = PASSED if credit.answer_right else PARTLY
        points = min(credit.points, exercise.points)
        message = f"{status}, {points:g} of {exercise.points} points" + (f". {credit.note}" if credit.note else "")
    except NotImplementedError:
        status, points, message = NOT_DONE, 0, "not done yet (the stub is still there)"
    except Wrong as wrong:
        status, points, message = FAILED, 0, f"not yet right: {wrong}\n    hint: {wrong.hint or exercise.hint}"
    except Exception as error:  # the student's code itself failed: say where, never stop the notebook
        raised = (f"your code's worker {error}" if isinstance(error, WorkerGone) else
                  f"your code raised {error if isinstance(error, StudentError) else f'{type(error).__name__}: {error}'}")
        status, points, message = FAILED, 0, f"{raised}\n    hint: {exercise.hint}"
    return status, message, points


def check(name: str, *answer, **options) -> bool:
    """Check the answer to exercise ``name``; print the verdict and return True when it passed."""
    if name not in EXERCISES:
        raise ValueError(f"unknown exercise {name!r}; the exercises are: {', '.join(EXERCISES)}")
    if answers is not None:             # graded: the grader judges this answer in its own process
        answers[name] = (answer, options)
    exercise = EXERCISES[name]
    status, message, points = verdict(name, *answer, **options)
    results[name], earned[name] = status, points
    mark = {PASSED: "✓", PARTLY: "±", FAILED: "✗", NOT_DONE: "…"}[status]
    print(f"{mark} exercise {exercise.notebook}·{name} ({exercise.kind}): {message}")
    return status == PASSED


def passed(name: str) -> bool:
    """Whether exercise ``name`` passed its check in this session."""
    return results.get(name) == PASSED


def summary(notebook: str) -> dict[str, str]:
    """Print this notebook's verdicts; raise :class:`ExerciseFailed` if an answer was checked and is wrong."""
    verdicts = {exercise.name: results.get(exercise.name, "not checked") for exercise in exercises_of(notebook)}
    width = max(map(len, verdicts))
    total = sum(EXERCISES[name].points for name in verdicts)
    print(f"notebook {notebook}: {sum(v == PASSED for v in verdicts.values())} of {len(verdicts)} exercises passed, "
          f"{sum(earned.get(name, 0) for name in verdicts):g} of {total} points")
    for name, verdict in verdicts.items():
        score = f"{earned.get(name, 0):g}/{EXERCISES[name].points}"
        print(f"  {name:<{width}}  {EXERCISES[name].kind:<10}  {score:>5}  {verdict}")
    wrong = [name for name, verdict in verdicts.items() if verdict == FAILED]
    if wrong:
        raise ExerciseFailed(f"exercises with a wrong answer: {', '.join(wrong)} (see their check cells above)")
    # `make test` runs both editions and says what to expect: every check passes on the worked solutions, and
    # none on the stubs of the student edition (a check that passed there would accept an empty answer).
    expected = os.environ.get(EXPECT)
    if expected == "all" and any(verdict != PASSED for verdict in verdicts.values()):
        raise ExerciseFailed(f"{EXPECT}=all, but not every exercise of notebook {notebook} passed: {verdicts}")
    if expected == "none" and any(verdict == PASSED for verdict in verdicts.values()):
        raise ExerciseFailed(f"{EXPECT}=none, but a check passed on a stub in notebook {notebook}: {verdicts}")
    return verdicts


# ---------------------------------------------------------------------------------------------- helpers


def _given(value, what: str):
    """The answer, or :class:`NotDone` when it is still the stub's None (or ...)."""
    if value is None or value is Ellipsis:
        raise NotDone(what)
    return value


def _tensor(value, what: str, shape: tuple | None = None) -> torch.Tensor:
    _given(value, what)
    if not isinstance(value, torch.Tensor):
        raise Wrong(f"{what} should be a torch.Tensor, got {_type_name(value)}")
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise Wrong(f"{what} has shape {tuple(value.shape)}, expected {tuple(shape)}")
    if not torch.isfinite(value).all():
        raise Wrong(f"{what} holds NaN or infinite values")
    return value


def _number(value, what: str) -> float:
    _given(value, what)
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise Wrong(f"{what} should be a finite number, got {value!r}")
    return float(value)


def _prediction(value, what: str) -> bool:
    _given(value, what)
    if not isinstance(value, bool):
        raise Wrong(f"{what} should be True or False, written before you look at the result; got {value!r}")
    return value


def _config(**overrides):
    from .model import GPTConfig
    settings = dict(n_layer=1, n_head=4, n_embd=32, block_size=16, pe="kerple_log")
    return GPTConfig(**{**settings, **overrides})


def _pe_module(**overrides):
    from .model import GPT
    return GPT(_config(**overrides)).pe


def _refiner_inputs(cfg, batch: int, T: int, generator: torch.Generator):
    scores = torch.randn(batch, cfg.n_head, T, T, generator=generator)
    bias = torch.randn(cfg.n_head, T, T, generator=generator)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    return scores, bias, mask


# ------------------------------------------------------------------ how a check touches an answer
# A check uses an answer only by calling it with data (tensors, numbers, configs) and through the small helpers
# below, the one place to adapt when the answer lives in another process (the grader's isolated kernel).

CHECK_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"   # where answers' modules run: the models' device


def _draw(generator: torch.Generator, low: int, high: int) -> int:
    """One integer of low .. high - 1."""
    return int(torch.randint(low, high, (1,), generator=generator))


def _fresh_generator() -> torch.Generator:
    """A generator seeded from the operating system: derive exercises get new inputs at every check."""
    return torch.Generator().manual_seed(secrets.randbits(62))


def _remote(answer) -> bool:
    """Whether an answer lives in the grader's worker (a ``sandbox.Remote`` handle)."""
    return isinstance(answer, RemoteAnswer)


def _type_name(answer) -> str:
    return answer.describe().type_name if _remote(answer) else type(answer).__name__


def _is_module(answer) -> bool:
    return answer.describe().is_module if _remote(answer) else isinstance(answer, nn.Module)


def _is_subclass(answer, base: type) -> bool:
    """Whether an answer is a class that subclasses ``base`` (one of minidape's classes)."""
    if _remote(answer):
        described = answer.describe()
        return described.is_class and f"{base.__module__}.{base.__qualname__}" in described.bases
    return isinstance(answer, type) and issubclass(answer, base)


def _build(your_class, cfg, what: str):
    """``your_class(cfg)``: an ``nn.Module`` (on the checks' device) or :class:`Wrong`. In the grader's worker it
    stays on the CPU: what it returns comes back to the grader as CPU tensors anyway."""
    module = _given(your_class, what)(cfg)
    if not _is_module(module):
        raise Wrong(f"{what}(cfg) should build an nn.Module, got {_type_name(module)}")
    return module if _remote(module) else module.to(CHECK_DEVICE)


def _parameter_shapes(module) -> list[tuple[int, ...]]:
    """The shapes of a module's parameters, in the order it registers them."""
    if _remote(module):
        return [tuple(shape) for shape in module.describe().parameter_shapes]
    return [tuple(p.shape) for p in module.parameters()]


def _load_parameters(module, tensors) -> None:
    """Copy ``tensors`` (one per parameter, in the module's order, already of the right shapes) into it."""
    if _remote(module):
        module._session.request("load_parameters", module._ref, [t.detach().cpu().clone() for t in tensors])
        return
    with torch.no_grad():
        for parameter, tensor in zip(module.parameters(), tensors):
            parameter.copy_(tensor)


def _gradients_of_sum(module, *inputs) -> list[torch.Tensor | None]:
    """Gradients of ``module(*inputs).sum()`` for each parameter (None where none reached it)."""
    if _remote(module):
        return module._session.request("gradients", module._ref, tuple(t.cpu() for t in inputs))
    for parameter in module.parameters():
        parameter.grad = None
    module(*inputs).sum().backward()
    return [None if p.grad is None else p.grad.detach().cpu() for p in module.parameters()]


def _as_shape(tensor: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor | None:
    """``tensor`` laid out as ``shape`` when it is the same weights: equal up to size-1 axes (a 1×1 Conv2d's
    weight for a Linear's), or a matrix stored transposed (input-first); otherwise None."""
    squeezed, wanted = tuple(n for n in tensor.shape if n != 1), tuple(n for n in shape if n != 1)
    if squeezed == wanted:
        return tensor.reshape(shape)
    if len(squeezed) == 2 and squeezed[::-1] == wanted:
        return tensor.reshape(squeezed).T.reshape(shape)
    return None


def _hand_over(source: nn.Module, target, what: str) -> list[list[torch.Tensor]]:
    """Every way to give ``target`` the weights of ``source``, by role rather than by name or order: each
    parameter of ``target`` takes a distinct parameter of ``source`` holding the same weights up to size-1 axes
    or a transpose (see :func:`_as_shape`). A check tries each and keeps the one that behaves like ``source``,
    so layers declared in another order, a 1×1 convolution for a linear map or a transposed weight all pass."""
    theirs, yours = [p.detach().to(CHECK_DEVICE) for p in source.parameters()], _parameter_shapes(target)
    if len(yours) != len(theirs):
        hint = ("a layer without its bias (bias=False)?" if len(yours) < len(theirs) else
                "an extra layer or parameter? f has two layers, each with a weight and a bias")
        raise Wrong(f"{what} has {len(yours)} parameter tensors {yours}; minidape's has {len(theirs)} "
                    f"{[tuple(p.shape) for p in theirs]}, so its weights cannot be handed over", hint=hint)
    ways: list[list[torch.Tensor]] = []

    def assign(index: int, chosen: list[torch.Tensor], used: set[int]) -> None:
        if len(ways) >= 24:
            return
        if index == len(yours):
            ways.append(list(chosen))
            return
        for k, tensor in enumerate(theirs):
            shaped = None if k in used else _as_shape(tensor, yours[index])
            if shaped is not None:
                assign(index + 1, chosen + [shaped], used | {k})

    assign(0, [], set())
    if not ways:
        raise Wrong(f"{what}'s parameters have shapes {yours}; minidape's are {[tuple(p.shape) for p in theirs]} "
                    f"and no layer of yours has the shape of one of them",
                    hint="Linear(2h, W), then Linear(W, h) (or 1×1 convolutions): check the widths of your layers")
    return ways


def _where(index: tuple[int, ...], axes: tuple[str, ...]) -> str:
    return ", ".join(f"{axis} {i}" for axis, i in zip(axes, index))


def _first_difference(got: torch.Tensor, want: torch.Tensor, visible: torch.Tensor | None, atol: float,
                      rtol: float) -> tuple[int, ...] | None:
    """The index, in the student's own tensor, of the cell that differs most (among the visible ones)."""
    excess = (got - want).abs() - atol - rtol * want.abs()
    if visible is not None:
        excess = excess.masked_fill(~visible.expand_as(excess), -math.inf)
    if excess.max() <= 0:
        return None
    return tuple(int(i) for i in torch.unravel_index(excess.argmax(), excess.shape))


def _compare(got, want: torch.Tensor, what: str, axes: tuple[str, ...], visible: torch.Tensor | None = None,
             mistakes: dict | None = None, atol: float = 1e-5, rtol: float = 1e-4) -> None:
    """Pass when ``got`` equals ``want`` (on the ``visible`` cells). Otherwise name the first known mistake whose
    output ``got`` equals — ``mistakes`` maps a description to (that mistake's output, its hint) — or the cell,
    by its named ``axes``, where the answer differs most."""
    got = _tensor(got, what, tuple(want.shape)).detach().double().cpu()
    want = want.detach().double().cpu()
    visible = None if visible is None else visible.cpu()
    if _first_difference(got, want, visible, atol, rtol) is None:
        return
    for description, (output, hint) in (mistakes or {}).items():
        output = output.detach().double().cpu()
        if output.shape == got.shape and _first_difference(got, output, visible, atol, rtol) is None:
            raise Wrong(f"{what}: {description}", hint=hint)
    index = _first_difference(got, want, visible, atol, rtol)
    raise Wrong(f"{what} differs from minidape's at {_where(index, axes)}: yours {got[index].item():.6g}, "
                f"minidape's {want[index].item():.6g}")


def _choice(value, choices, what: str):
    """A recorded prediction that is one of ``choices``."""
    _given(value, what)
    if value not in choices:
        raise Wrong(f"{what} should be one of {list(choices)}, written before the run; got {value!r}")
    return value


def _prediction_credit(points: int, held: bool, note: str) -> Credit:
    """An experiment's credit: a right measurement earns ``points - 1``, a prediction that held one more."""
    missed = "did not hold (no point for it): what did you expect, and why did it not happen?"
    return Credit(points if held else points - 1, f"{note}; your prediction {'held' if held else missed}")


def _mlp(linear1: nn.Module, linear2: nn.Module, x: torch.Tensor, activation=None) -> torch.Tensor:
    """DAPE's f with minidape's weights over the channel axis of (batch, C, T, T), with another activation."""
    activation = activation or (lambda h: torch.nn.functional.leaky_relu(h, 0.01))
    cells = x.permute(0, 2, 3, 1)
    return linear2(activation(linear1(cells))).permute(0, 3, 1, 2)


def _refiner_mistakes(name: str, theirs: nn.Module, scores, bias, mask) -> dict:
    """The refined scores of the common wrong versions of minidape's refiner ``name``, with their hints."""
    F = torch.nn.functional
    B = bias.expand_as(scores)
    if name == "dape":
        first, second = theirs.f.mlp[0], theirs.f.mlp[2]

        def f(x, activation=None):
            return _mlp(first, second, x, activation)

        SB = torch.cat([scores, B], dim=1)
        return {
            "your refined scores are S + f([S, B]): the residual + B is missing": (
                scores + f(SB), "eq. (3) adds B back: A = S + B + f([S, B]); f only learns a correction to it"),
            "your refined scores are B + f([S, B]): the residual + S is missing": (
                B + f(SB), "eq. (3) keeps the scores: A = S + B + f([S, B])"),
            "you return f([S, B]) alone, without S + B": (f(SB), "A = S + B + f([S, B]): add both residuals"),
            "f reads [B, S]: the bias channels come first": (
                scores + B + f(torch.cat([B, scores], dim=1)),
                "concatenate the scores first, then the bias: torch.cat([S, B], dim=1)"),
            "f uses ReLU, not LeakyReLU(0.01)": (scores + B + f(SB, F.relu), "DAPE's f uses LeakyReLU(0.01)"),
            "f uses GELU, not LeakyReLU(0.01)": (scores + B + f(SB, F.gelu), "DAPE's f uses LeakyReLU(0.01)"),
            "f has no activation between its two layers": (
                scores + B + f(SB, lambda h: h), "put LeakyReLU(0.01) between the two linear layers"),
        }

    def conv(x, activation=None):
        return theirs.conv2((activation or (lambda h: F.leaky_relu(h, 0.01)))(theirs.conv1(x)))

    SB = torch.cat([scores, B], dim=1)
    lower = SB.masked_fill(~mask, 0)
    return {
        "your convolution reads the future: the masked cells of [S, B] are not zeroed before it (no tril)": (
            scores + B + conv(SB), "zero the masked cells first: torch.cat([S, B], 1).masked_fill(~mask, 0)"),
        "your refined scores are S + Conv(tril([S, B])): the residual + B is missing": (
            scores + conv(lower), "DAPE-V2 adds B back: A = S + B + Conv(tril([S, B]))"),
        "your refined scores are B + Conv(tril([S, B])): the residual + S is missing": (
            B + conv(lower), "DAPE-V2 keeps the scores: A = S + B + Conv(tril([S, B]))"),
        "the convolution reads [B, S]: the bias channels come first": (
            scores + B + conv(torch.cat([B, scores], 1).masked_fill(~mask, 0)),
            "concatenate the scores first, then the bias: torch.cat([S, B], dim=1)"),
        "the convolutions use ReLU, not LeakyReLU(0.01)": (scores + B + conv(lower, F.relu),
                                                          "DAPE-V2's Conv uses LeakyReLU(0.01) between the layers"),
        "there is no activation between the two convolutions": (
            scores + B + conv(lower, lambda h: h), "put LeakyReLU(0.01) between the two convolutions"),
    }


def _compare_refiners(your_class, name: str, what: str, **overrides) -> None:
    """Build minidape's refiner ``name`` and yours from the same config, hand yours minidape's weights (by role,
    see :func:`_hand_over`), and compare the refined scores on the cells attention may see, for fresh random
    scores and biases; a difference is named as a known mistake or located as (batch, head, query, key)."""
    from .model import REFINER_REGISTRY
    cfg = _config(refiner=name, refiner_width=6, **overrides)       # 2h = 8 inputs, W = 6, h = 4: roles distinct
    theirs = REFINER_REGISTRY[name](cfg).to(CHECK_DEVICE)
    yours = _build(your_class, cfg, what)
    generator = _fresh_generator()
    with torch.no_grad():
        for parameter in theirs.parameters():                      # fresh weights, large enough to matter
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    cases = [_refiner_inputs(cfg, 2, T, generator) for T in (7, 12)]
    cases = [tuple(t.to(CHECK_DEVICE) for t in case) for case in cases]
    failure = None
    for way in _hand_over(theirs, yours, what):
        _load_parameters(yours, way)
        try:
            for scores, bias, mask in cases:
                T = scores.shape[-1]
                with torch.no_grad():
                    got = yours(scores.clone(), bias.clone(), mask)
                    want = theirs(scores, bias, mask)
                    mistakes = _refiner_mistakes(name, theirs, scores, bias, mask)
                _compare(got, want, f"{what}'s refined scores (T = {T})", ("batch", "head", "query", "key"),
                         visible=mask, mistakes=mistakes)
            return
        except Wrong as wrong:
            failure = failure or wrong
    raise failure


# ---------------------------------------------------------------------------- 01 positional encodings


@_exercise("01", "implement", "the sinusoidal table P (Vaswani et al.)",
           "column 2i is sin(p·ω_i) and column 2i+1 is cos(p·ω_i), interleaved, with ω_i = 10000^(-2i/d)",
           points=2)
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
                table(-2, interleave=False), "interleave: table[:, 0::2] = sin, table[:, 1::2] = cos"),
            "sin and cos are swapped: your even columns hold cosines": (
                table(-2, torch.cos, torch.sin), "column 2i is sin(p·ω_i), column 2i + 1 is cos(p·ω_i)"),
            "your frequencies are ω_i = 10000^(-i/d), too slow": (
                table(-1), "the exponent is -2i/d for pair i = 0 .. d/2 - 1 (torch.arange(0, d, 2) / d)"),
            "your frequencies grow with i (ω_i = 10000^(+2i/d))": (
                table(2), "ω_i = 10000^(-2i/d): the first pair turns fastest (ω_0 = 1), the last slowest"),
        }
        _compare(got, want, f"P (d = {d})", ("row", "channel"), mistakes=mistakes, atol=1e-4, rtol=0)


@_exercise("01", "derive", "RoPE's score <R_t q, R_0 k> of any q and k, in closed form",
           "in pair i (channels i and i + d/2), rotating (q1, q2) by α and dotting with (k1, k2) gives "
           "cos α (q1k1 + q2k2) plus a sin α term; work out which", points=2)
def rope_score(your_function):
    from .model import apply_rotary
    generator = _fresh_generator()

    def score(q, k, t, pairs="halves", exponent=-2, sin_sign=1):
        d = len(q)
        theta = 10000.0 ** (exponent * torch.arange(d // 2, dtype=torch.float64) / d)
        cos, sin = torch.cos(t * theta)[None], sin_sign * torch.sin(t * theta)[None]
        if pairs == "interleaved":                     # pair i = channels (2i, 2i + 1): reorder to halves
            order = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])
            q, k = q[order], k[order]
        rotated = apply_rotary(q[None, None, None], cos, sin)
        return (rotated * k).sum().item()

    for head_size in (8, 32):
        for t in [0] + torch.randint(1, 3000, (3,), generator=generator).tolist():
            q, k = (torch.randn(head_size, generator=generator, dtype=torch.float64) for _ in range(2))
            got = _number(_given(your_function, "rope_score")(q.clone(), k.clone(), t), "rope_score(q, k, t)")
            want = score(q, k, t)
            tolerance = 1e-6 * (1 + q.abs().sum().item() * k.abs().max().item())
            if abs(got - want) <= tolerance:
                continue
            where = f"rope_score(q, k, t={t}) for random q, k of size {head_size} is {got:.6g}"
            half = head_size // 2
            no_sin = (torch.cos(t * 10000.0 ** (-2 * torch.arange(half, dtype=torch.float64) / head_size))
                      * (q[:half] * k[:half] + q[half:] * k[half:])).sum().item()
            mistakes = {
                "it is the score at -t: q and k swapped roles, or the sin term has the wrong sign": (
                    score(q, k, t, sin_sign=-1), "R_t rotates q forward by tθ_i: <R_t q, R_0 k> = <q, R_{-t} k>"),
                "it has only the cos term": (no_sin, "the rotation mixes the two channels of a pair: a sin(tθ_i) "
                                             "term remains; write R_α (q1, q2) out and collect it"),
                "it pairs channels (2i, 2i+1); minidape (apply_rotary) pairs channel i with channel i + d/2": (
                    score(q, k, t, pairs="interleaved"), "pair i is (x[i], x[i + d/2]): q[:d//2] with q[d//2:]"),
                "it uses θ_i = 10000^(-i/d), too slow": (score(q, k, t, exponent=-1), "θ_i = 10000^(-2i/d)"),
            }
            for description, (value, hint) in mistakes.items():
                if abs(got - value) <= tolerance:
                    raise Wrong(f"{where}: {description}", hint=hint)
            if t == 0:
                raise Wrong(f"{where}, but at t = 0 nothing is rotated: the score is q·k",
                            hint="check your sum at t = 0 first: it must be the plain dot product")
            raise Wrong(f"{where}, which is not <R_t q, R_0 k>")


@_exercise("01", "implement", "ALiBi's bias for any query and key positions",
           "slope of head h (1-based) is 2^(-8h/H) for H heads; the bias is -slope·(i - j) on keys j <= i", points=2)
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
                bias(range(n_head)), "h = 1 .. H: the first head's slope is 2^(-8/H)"),
            "your bias is positive: far keys get more attention, not less": (
                bias(range(1, n_head + 1), sign=1), "ALiBi subtracts: b = -s_h·(i - j)"),
            "your heads are in reverse order (the gentlest slope first)": (
                bias(range(n_head, 0, -1)), "head h = 1 has the steepest slope 2^(-8/H)"),
            "your slopes are 2^(-h/H): the factor 8 is missing": (
                -torch.tensor([2.0 ** (-h / n_head) for h in range(1, n_head + 1)])[:, None, None] * distance,
                "s_h = 2^(-8h/H)"),
        }
        visible = q_pos[:, None] >= k_pos[None, :]
        _compare(got, want, f"the bias with {n_head} heads", ("head", "query", "key"), visible=visible,
                 mistakes=mistakes)


ENTROPY_LENGTH, ENTROPY_TOLERANCE = 1024, 0.5


def _alibi_entropies(T: int = ENTROPY_LENGTH) -> torch.Tensor:
    """Entropy (nats) of the last query's attention under ALiBi's bias alone (zero content scores), 4 heads."""
    slopes = torch.tensor([2.0 ** (-8 * h / 4) for h in range(1, 5)], dtype=torch.float64)
    p = torch.softmax(-slopes[:, None] * torch.arange(T, dtype=torch.float64), dim=-1)
    return -(p * p.log()).sum(-1)


@_exercise("01", "experiment", "predict, then measure, how spread out ALiBi's attention is at T = 1024",
           "attention of the last query = softmax over keys of its bias row (content scores 0); entropy "
           "-Σ p ln p in nats, averaged over the 4 heads", points=2)
def alibi_entropy(prediction, measured):
    predicted = _number(prediction, "entropy_prediction (your prediction, in nats)")
    measured = _number(measured, "entropy_measured (your measurement)")
    entropies = _alibi_entropies()
    want = entropies.mean().item()
    mistakes = {"bits, not nats": (want / math.log(2), "use the natural log: -Σ p ln p"),
                "the sum over heads, not the mean": (entropies.sum().item(), "average the 4 heads' entropies"),
                "the entropy of uniform attention, ln T: the bias never reached the softmax": (
                    math.log(ENTROPY_LENGTH), "softmax the bias row itself: p = softmax(b[h, -1, :])")}
    for description, (value, hint) in mistakes.items():
        if abs(measured - value) < 1e-3:
            raise Wrong(f"your measurement {measured:.4g} is {description}", hint=hint)
    if abs(measured - want) > 1e-3:
        raise Wrong(f"your measurement {measured:.4g} is not the mean entropy of the last query's attention")
    held = abs(predicted - want) <= ENTROPY_TOLERANCE
    return _prediction_credit(2, held, f"measured {want:.2f} nats (uniform attention over {ENTROPY_LENGTH} keys: "
                                       f"{math.log(ENTROPY_LENGTH):.2f}); you predicted {predicted:.2f}, "
                                       f"tolerance ±{ENTROPY_TOLERANCE}")


# ------------------------------------------------------------------------------- 02 Kerple, CPD kernels


@_exercise("02", "derive", "cᵀKc for the kernel -|m-n|² and zero-sum c, in closed form",
           "expand (x_i - x_j)² = x_i² - 2x_i x_j + x_j²; which sums vanish when Σ_j c_j = 0?", points=2)
def square_quadratic_form(your_function):
    generator = _fresh_generator()
    for n in (3, 8, 20):
        x = torch.randn(n, generator=generator, dtype=torch.float64) * 5
        c = torch.randn(n, generator=generator, dtype=torch.float64)
        c = c - c.mean()                                              # zero-sum
        want = (c @ -(x[:, None] - x[None, :]) ** 2 @ c).item()
        answer = _given(your_function, "square_quadratic_form")
        got = _number(answer(x.clone(), c.clone()), "square_quadratic_form(x, c)")
        if abs(got - want) <= 1e-8 * max(1.0, abs(want)):
            continue
        where = f"for {n} random points and a random zero-sum c your form gives {got:.6g}"
        ratio = got / want if want else math.inf
        named = {-1.0: ("which is minus cᵀKc: the sign is wrong",
                        "-|m-n|² is CPD, so cᵀKc >= 0 on zero-sum c; recheck the sign of the cross term"),
                 0.5: ("which is half of cᵀKc", "the cross term -2x_i x_j is summed over all pairs (i, j)"),
                 2.0: ("which is twice cᵀKc", "the cross term -2x_i x_j is summed once over all pairs (i, j)")}
        for value, (what, hint) in named.items():
            if abs(ratio - value) < 1e-6:
                raise Wrong(f"{where}, {what}", hint=hint)
        shifted = _number(answer(x + 3.0, c.clone()), "square_quadratic_form(x + 3, c)")
        if abs(shifted - got) > 1e-8 * max(1.0, abs(got)):
            raise Wrong(f"{where}; it changes to {shifted:.6g} when every x_i moves by 3, but K depends on "
                        f"differences only, so cᵀKc cannot",
                        hint="terms like Σ c_i x_i² must cancel: use Σ c_i = 0")
        raise Wrong(f"{where}, which is not cᵀKc")


# Kernels handed to answers: module-level functions, so that they travel to another process (pickle) as they are.
def _triangle_kernel(m, n):
    return -(m - n).abs()


def _log_kernel(m, n):
    return -torch.log1p((m - n).abs())


def _power_kernel_1_5(m, n):
    return -(m - n).abs() ** 1.5


@_exercise("02", "implement", "the geometric search for Kerple's shift c",
           "start at c = 1 and double until the smallest eigenvalue of c + K is >= -1e-10·max|c + K|; "
           "md.kernels.gram and md.kernels.smallest_eigenvalue do the linear algebra", points=2)
def find_shift(your_function):
    from . import kernels
    generator = _fresh_generator()

    n = partial(_draw, generator)
    cases = [("-|m-n|", _triangle_kernel, n(8, 48)), ("-log(1+|m-n|)", _log_kernel, n(16, 96)),
             ("-|m-n|^1.5", _power_kernel_1_5, n(8, 24))]
    for label, kernel, size in cases:
        got = _number(_given(your_function, "find_shift")(kernel, size), "find_shift(kernel, n)")
        want = kernels.pd_shift(kernel, size)
        if got == want:
            continue
        shifted = kernels.gram(kernel, size) + got
        psd = kernels.smallest_eigenvalue(shifted) >= -1e-10 * shifted.abs().max().item()
        where = f"for {label} on 0..{size - 1} you found c = {got:g} (c + K is {'PSD' if psd else 'not PSD'} there)"
        if got <= 0:
            raise Wrong(f"{where}: c must be positive", hint="start at c = 1, not 0: doubling 0 stays 0")
        if got != 2.0 ** round(math.log2(got)):
            raise Wrong(f"{where}, not one of 1, 2, 4, 8, …", hint="start at c = 1.0 and multiply by 2 each step")
        if got == 2 * want:
            raise Wrong(f"{where}, but c / 2 already makes c + K PSD: one doubling too many",
                        hint="test before you double: return c as soon as c + K is PSD")
        if got < want:
            raise Wrong(f"{where}: the search stopped too early", hint="double while the smallest eigenvalue is "
                        "below -1e-10·max|c + K|, and test the matrix c + K, not K")
        raise Wrong(f"{where}, but a smaller power of 2 already makes c + K PSD",
                    hint="compare with the rounding tolerance -1e-10·max|c + K|, not with 0")


SHIFT_POINTS = 512


@_exercise("02", "experiment", "predict, then measure, how Kerple's shift c grows with the number of points",
           "measured = {'triangle': find_shift(triangle, 512), 'log': find_shift(md.kernels.log_kernel(), 512)}",
           points=3)
def shift_growth(prediction, measured):
    from . import kernels
    want = {name: kernels.pd_shift(kernel, SHIFT_POINTS) for name, kernel in (("triangle", _triangle_kernel),
                                                                              ("log", _log_kernel))}
    for value, what in ((prediction, "shift_prediction (your prediction)"), (measured, "shift_measured")):
        if _given(value, what) is not None and (not isinstance(value, dict) or set(value) != set(want)):
            raise Wrong(f"{what} should be a dict with the keys {sorted(want)}, got {value!r}")
    for name, value in want.items():
        got = _number(measured[name], f"shift_measured[{name!r}]")
        if got != value:
            raise Wrong(f"shift_measured[{name!r}] = {got:g} is not the c the geometric search finds on "
                        f"0..{SHIFT_POINTS - 1}", hint="call your find_shift (or md.kernels.pd_shift) with n = 512")
    # within a factor of 2: one doubling of the search either way
    held = {name: _number(prediction[name], f"shift_prediction[{name!r}]") > 0
            and abs(math.log2(_number(prediction[name], "") / value)) <= 1 for name, value in want.items()}
    note = "; ".join(f"{name}: measured c = {value:g}, you predicted {prediction[name]:g} "
                     f"({'within' if held[name] else 'outside'} a factor of 2)" for name, value in want.items())
    return Credit(1 + sum(held.values()), note)


@_exercise("02", "implement", "Kerple-log's bias -r1·log(1 + r2·(i - j))",
           "r1 and r2 are per-head tensors (shape (h,)): index them as r1[:, None, None]; distances i - j are "
           "q_pos[:, None] - k_pos[None, :]", points=2)
def kerple_log_bias(your_function):
    generator = _fresh_generator()
    pe = _pe_module(pe="kerple_log")
    with torch.no_grad():
        pe.r1.copy_(torch.rand(4, generator=generator) * 2 + 0.05)
        pe.r2.copy_(torch.rand(4, generator=generator) + 0.05)
    start = int(torch.randint(0, 500, (1,), generator=generator))
    q_pos, k_pos = torch.arange(start + 40, start + 50), torch.arange(start, start + 50)
    r1, r2 = pe.r1.detach().clone(), pe.r2.detach().clone()
    got = _given(your_function, "kerple_log_bias")(r1.clone(), r2.clone(), q_pos, k_pos)
    with torch.no_grad():
        want = pe(q_pos, k_pos)
    visible = q_pos[:, None] >= k_pos[None, :]
    if isinstance(got, torch.Tensor) and got.shape == want.shape and torch.isinf(got[:, visible]).any():
        raise Wrong("your bias is infinite on the diagonal (distance 0)",
                    hint="log(r2·d) is -∞ at d = 0: Kerple uses log(1 + r2·d) (torch.log1p)")
    d = (q_pos[:, None] - k_pos[None, :]).clamp(min=0).double()
    a, b = r1.double()[:, None, None], r2.double()[:, None, None]
    mistakes = {"r1 and r2 swapped": (-b * torch.log1p(a * d), "r1 multiplies the log, r2 scales the distance"),
                "your bias is positive: far keys get more attention": (a * torch.log1p(b * d),
                                                                       "the bias is -r1·log(1 + r2·d)"),
                "r2 is missing inside the log": (-a * torch.log1p(d), "scale the distance: log(1 + r2·d)"),
                "your bias is linear in the distance, not logarithmic": (-a * b * d, "take log(1 + r2·d)")}
    _compare(got, want, "the bias", ("head", "query", "key"), visible=visible, mistakes=mistakes)


# ------------------------------------------------------------------------- 03 train and extrapolate


@_exercise("03", "experiment", "predict, then measure, how RoPE degrades at 16× its training length",
           "the ratio is last_k['rope'][longest] / last_k['rope'][train_length], read from the table above",
           points=2)
def rope_ratio(prediction, measured_ratio, last_k, train_length, longest):
    predicted = _prediction(prediction, "rope_breaks (your prediction)")
    measured = _number(measured_ratio, "rope_ratio (your measurement)")
    want = last_k["rope"][longest] / last_k["rope"][train_length]
    if abs(measured - 1 / want) <= 1e-6 / want:
        raise Wrong(f"your ratio {measured:.4g} is upside down", hint="divide the perplexity at the longest length "
                    "by the one at the training length")
    if abs(measured - want) > 1e-6 * want:
        raise Wrong(f"your ratio {measured:.4g} is not last_k['rope'][{longest}] / last_k['rope'][{train_length}]")
    return _prediction_credit(2, predicted == (want > 2), f"RoPE's ratio is {want:.2f}, so it "
                                                          f"{'more' if want > 2 else 'less'} than doubles")


@_exercise("03", "derive", "both protocols' perplexities from one position-wise loss curve",
           "last_k scores the last k positions of a window of T tokens, nonoverlap all T of them; perplexity is "
           "exp of the mean loss", points=2)
def protocols_from_curve(your_function):
    generator = _fresh_generator()
    curve = 1 + torch.rand(300, generator=generator, dtype=torch.float64) * 3
    lengths = torch.randint(2, 300, (3,), generator=generator).tolist()
    for T, k in zip([300] + lengths, [256, 256, int(lengths[1]) + 7, max(1, lengths[2] // 3)]):
        answer = _given(your_function, "protocols_from_curve")(curve.clone(), T, k)
        if not (isinstance(answer, tuple) and len(answer) == 2):
            raise Wrong(f"protocols_from_curve should return a pair (last_k, nonoverlap), got {answer!r}")
        got = [_number(value, f"the {label} perplexity") for value, label in zip(answer, ("last_k", "nonoverlap"))]
        kk = min(k, T)
        want = (math.exp(curve[T - kk:T].mean()), math.exp(curve[:T].mean()))
        if all(abs(g - w) <= 1e-6 * w for g, w in zip(got, want)):
            continue
        where = f"T = {T}, k = {k}: your pair is ({got[0]:.6g}, {got[1]:.6g})"
        mistakes = {
            "the two perplexities are swapped": ((want[1], want[0]), "return (last_k, nonoverlap), in that order"),
            "your last_k window ends one position early": ((math.exp(curve[max(0, T - kk - 1):T - 1].mean()), want[1]),
                                                           "the last k positions are T - k .. T - 1"),
            "your last_k perplexity averages exp(loss), not the loss": (
                (curve[T - kk:T].exp().mean().item(), want[1]), "perplexity is exp(mean loss), not mean(exp(loss))"),
            "your nonoverlap perplexity uses the whole curve, not the first T positions": (
                (want[0], math.exp(curve.mean())), "a window of T tokens has T positions: curve[:T]"),
        }
        for description, (values, hint) in mistakes.items():
            if all(abs(g - v) <= 1e-6 * abs(v) for g, v in zip(got, values)):
                raise Wrong(f"{where}: {description}", hint=hint)
        wrong = [label for g, w, label in zip(got, want, ("last_k", "nonoverlap")) if abs(g - w) > 1e-6 * w]
        raise Wrong(f"{where}; the {' and the '.join(wrong)} perplexity is not what the protocol measures")


@_exercise("03", "implement", "a running mean that does not invent values before position 0",
           "entry t is the mean of curve[max(0, t - width + 1) : t + 1]; torch.cumsum gives every such sum at once",
           points=2)
def running_mean(your_function):
    F = torch.nn.functional
    generator = _fresh_generator()
    curve = torch.rand(50, generator=generator, dtype=torch.float64)
    for width in (1, 4, 16):
        got = _given(your_function, "running_mean")(curve.clone(), width)
        want = torch.stack([curve[max(0, t - width + 1):t + 1].mean() for t in range(len(curve))])

        def windows(padded):
            return padded.unfold(0, width, 1).mean(-1)

        mistakes = {
            "the first entries repeat position 0 (replicate padding): they average values that do not exist": (
                windows(F.pad(curve[None, None], (width - 1, 0), mode="replicate")[0, 0]),
                "at the start average only the positions that exist: divide by min(t + 1, width)"),
            "the first entries count zeros before position 0 (zero padding, divided by width)": (
                windows(F.pad(curve, (width - 1, 0))), "divide by the number of real positions, min(t + 1, width)"),
            "your window is centred on t; the running mean looks back only": (
                torch.stack([curve[max(0, t - width // 2):t + (width - 1) // 2 + 1].mean() for t in range(50)]),
                "entry t averages curve[t - width + 1 .. t]"),
            "your window ends at t - 1 instead of t": (
                torch.stack([curve[max(0, t - width):max(t, 1)].mean() for t in range(50)]),
                "entry t includes curve[t]: the slice is curve[max(0, t - width + 1) : t + 1]"),
        }
        _compare(got, want, f"the running mean (width {width})", ("position",), mistakes=mistakes, atol=1e-9,
                 rtol=1e-9)


# ------------------------------------------------------------------------------------ 04 DAPE, CAPE


@_exercise("04", "implement", "DAPE's refiner, eq. (3): A = S + B + f([S, B])",
           "f is Linear(2h, W) -> LeakyReLU(0.01) -> Linear(W, h), applied at every cell over the head axis: "
           "move the heads last with permute(0, 2, 3, 1), apply f, move them back; expand B to S's shape first",
           points=3)
def dape_refiner(your_class):
    _compare_refiners(your_class, "dape", "MyDAPE")


@_exercise("04", "derive", "parameters and multiply-accumulates of f, for the three DAPE variants",
           "per cell f maps n_in -> W -> h with biases (n_in = 2h, or h for dape_add); it runs on every one of "
           "the batch·T² cells, masked ones too", points=2)
def dape_cost(your_function):
    from .model import REFINER_REGISTRY
    generator = _fresh_generator()
    draw = partial(_draw, generator)
    for variant in ("dape", "dape_concat", "dape_add"):
        h, W, batch, T = draw(2, 17), draw(3, 65), draw(1, 9), draw(8, 600)
        n_in = h if variant == "dape_add" else 2 * h
        cfg = _config(n_head=h, n_embd=4 * h, refiner=variant, refiner_width=W)
        params = sum(p.numel() for p in REFINER_REGISTRY[variant](cfg).parameters())
        macs = batch * T * T * (n_in * W + W * h)
        answer = _given(your_function, "dape_cost")(variant, h, W, batch, T)
        if not (isinstance(answer, tuple) and len(answer) == 2):
            raise Wrong(f"dape_cost should return a pair (parameters, MACs), got {answer!r}")
        got_params, got_macs = (_number(v, label) for v, label in zip(answer, ("the parameter count", "the MACs")))
        where = f"dape_cost({variant!r}, h={h}, W={W}, batch={batch}, T={T})"
        problems = []
        if got_params != params:
            known = {n_in * W + W * h: ("counts the weights but not the biases", "each Linear has a bias of its "
                                        "output size: + W and + h"),
                     2 * h * W + W + W * h + h: ("gives dape_add 2h inputs", "dape_add feeds f the sum S + B: h "
                                                 "channels"),
                     h * W + W + W * h + h: ("gives f h inputs", "dape and dape_concat feed f [S, B]: 2h channels")}
            what, hint = known.get(int(got_params), ("is not the parameter count of f", None))
            problems.append((f"your parameter count {got_params:g} {what}", hint))
        if got_macs != macs:
            known = {2 * macs: ("counts FLOPs (2 per multiply-accumulate)", "count multiply-accumulates: one per "
                                "weight per cell"),
                     batch * T * (T + 1) // 2 * (n_in * W + W * h): (
                         "counts the causal triangle only", "f runs on all T² cells; the mask is applied after it"),
                     batch * T * T * (n_in * W + W * h + W + h): ("counts the biases as multiply-accumulates",
                                                                  "a bias is an addition, not a multiply-accumulate")}
            what, hint = known.get(int(got_macs), ("is not the multiply-accumulates of f", None))
            problems.append((f"your MAC count {got_macs:g} {what}", hint))
        if len(problems) == 2:
            raise Wrong(f"{where}: {problems[0][0]}; {problems[1][0]}", hint=problems[0][1] or problems[1][1])
        if problems:
            return Credit(1, f"{where}: {problems[0][0]} (hint: {problems[0][1] or 'recount'}); the other part "
                             f"is right", answer_right=False)


@_exercise("04", "implement", "attention mass beyond one training length",
           "model.attention_maps(idx, layer)['probs'] is (batch, heads, queries, keys); take the last query, keys "
           "0 .. T - train_length - 1, sum over keys, then average over heads and layers", points=2)
def far_attention(your_function):
    from .model import GPT
    generator = _fresh_generator()
    torch.manual_seed(int(torch.randint(0, 2 ** 31, (1,), generator=generator)))
    model = GPT(_config(n_layer=2, pe="kerple_log", refiner="dape", refiner_width=8)).to(CHECK_DEVICE).eval()
    idx = torch.randint(0, 256, (1, 48), generator=generator).to(CHECK_DEVICE)
    L = 16
    with torch.no_grad():
        probs = torch.stack([model.attention_maps(idx, layer)["probs"][0, :, -1] for layer in range(2)]).cpu()
        got = _number(_given(your_function, "far_attention")(model, idx, L), "far_attention(model, idx, train_length)")
    want = probs[..., :48 - L].sum(-1).mean().item()
    mistakes = {"the attention on the last train_length keys (the near ones), not the far ones": (
                    probs[..., 48 - L:].sum(-1).mean().item(), "far keys are 0 .. T - train_length - 1"),
                "one key too many: keys 0 .. T - train_length": (
                    probs[..., :48 - L + 1].sum(-1).mean().item(), "the slice is [:T - train_length]"),
                "one key too few": (probs[..., :48 - L - 1].sum(-1).mean().item(), "the slice is [:T - train_length]"),
                "the first query's attention, not the last one's": (
                    1.0, "the last query is index -1 of the query axis"),
                "summed over heads instead of averaged": (probs[..., :48 - L].sum(-1).mean(0).sum().item(),
                                                          "average over heads and layers")}
    if abs(got - want) <= 1e-5:
        return
    for description, (value, hint) in mistakes.items():
        if abs(got - value) <= 1e-5:
            raise Wrong(f"on a small random model you measured {got:.5f}: {description}", hint=hint)
    raise Wrong(f"on a small random model your far attention is {got:.5f}, minidape's attention maps give "
                f"{want:.5f}")


@_exercise("04", "experiment", "predict, then measure, which model keeps its attention more local at 16×",
           "far_shares = {name: far_attention(models[name], window, TRAIN_LENGTH)} for 'kerple_log' and "
           "'dape-kerple', averaged over the two windows", points=2)
def locality(prediction, shares):
    predicted = _choice(prediction, ("kerple_log", "dape-kerple"), "more_local (your prediction)")
    shares = _given(shares, "far_shares (your measurement)")
    if not isinstance(shares, dict) or set(shares) != {"kerple_log", "dape-kerple"}:
        raise Wrong("far_shares should be a dict with the keys 'kerple_log' and 'dape-kerple'")
    values = {name: _number(value, f"far_shares[{name!r}]") for name, value in shares.items()}
    if not all(0 <= value <= 1 for value in values.values()):
        raise Wrong(f"attention shares lie between 0 and 1; yours are {values}", hint="far_attention returns a "
                    "probability mass: a sum of softmax weights, averaged")
    local = min(values, key=values.get)
    return _prediction_credit(2, predicted == local, f"{local} puts less attention beyond one training length "
                                                     f"({100 * values[local]:.1f}% against "
                                                     f"{100 * max(values.values()):.1f}%)")


# ------------------------------------------------------------------------------------ 05 DAPE-V2 conv


@_exercise("05", "derive", "which keys a refined cell A[i, j] reads",
           "each 1×k layer reaches k // 2 keys to each side, two layers reach 2·(k // 2); tril removes keys > i",
           points=2)
def receptive_keys(your_function):
    from .model import REFINER_REGISTRY
    generator = _fresh_generator()
    draw = partial(_draw, generator)
    cases = [(1, draw(1, 16), None), (3, draw(4, 16), "diagonal"), (5, draw(6, 16), "edge"), (3, draw(2, 16), None),
             (7, draw(8, 16), None), (5, draw(1, 16), None)]
    for kernel, i, where in cases:
        j = i if where == "diagonal" else 0 if where == "edge" else draw(0, i + 1)
        cfg = _config(pe="none", refiner="conv", refiner_kernel=kernel, refiner_width=8)
        refiner = REFINER_REGISTRY["conv"](cfg)
        scores, _, mask = _refiner_inputs(cfg, 1, 16, generator)
        scores.requires_grad_(True)
        refiner(scores, None, mask)[0, 0, i, j].backward()
        want = scores.grad[0, :, i].abs().sum(0).nonzero().flatten().tolist()
        got = _given(your_function, "receptive_keys")(i, j, kernel)
        try:
            got = sorted(int(key) for key in got)
        except (TypeError, ValueError):
            raise Wrong(f"receptive_keys should return a list of key indices, got {got!r}") from None
        if got == want:
            continue
        where = f"receptive_keys({i}, {j}, k={kernel}) = {got}"
        reach, one = 2 * (kernel // 2), kernel // 2
        if got == list(range(max(0, j - reach), j + reach + 1)):
            raise Wrong(f"{where} includes keys after the query: tril zeroes them before the first layer",
                        hint="the keys j' > i hold zeros after tril, so no score there reaches A[i, j]")
        if got == list(range(max(0, j - one), min(i, j + one) + 1)):
            raise Wrong(f"{where} is what one layer reads; there are two", hint="two stacked 1×k layers reach "
                        "k // 2 keys per layer to each side")
        if got == list(range(j - reach, min(i, j + reach) + 1)):
            raise Wrong(f"{where} has negative keys", hint="keys start at 0: the padding is zeros, not scores")
        if got and min(got) >= 0 and max(got) <= i:
            extra, missing = set(got) - set(want), set(want) - set(got)
            raise Wrong(f"{where}, but the gradient of minidape's conv refiner disagrees: your list "
                        + ("holds keys A[i, j] does not read" if extra else "")
                        + (" and " if extra and missing else "")
                        + ("misses keys it reads" if missing else ""))
        raise Wrong(f"{where}: keys outside 0..{i} cannot be read by query {i}'s row after tril")


@_exercise("05", "implement", "DAPE-V2's conv refiner: A = S + B + Conv(tril([S, B]))",
           "nn.Conv2d(2h, W, (1, k), padding=(0, k // 2)), LeakyReLU(0.01), nn.Conv2d(W, h, (1, k), same padding); "
           "zero the masked cells of [S, B] (masked_fill(~mask, 0)) before the first convolution", points=3)
def conv_refiner(your_class):
    for kernel in (3, 5):
        _compare_refiners(your_class, "conv", "MyConvRefiner", refiner_kernel=kernel)


@_exercise("05", "experiment", "predict, then measure, what the leaky conv does to the validation loss",
           "read the last 'val_loss' of each history", points=2)
def leakage(prediction, measured, histories):
    predicted = _prediction(prediction, "leaky_is_lower (your prediction)")
    measured = _given(measured, "final_losses (your measurement)")
    want = {name: histories[name][-1]["val_loss"] for name in ("conv k=3", "leaky_conv k=3")}
    if not isinstance(measured, dict) or set(measured) != set(want):
        raise Wrong(f"final_losses should be a dict with the keys {sorted(want)}")
    for name, value in want.items():
        got = _number(measured[name], f"final_losses[{name!r}]")
        if abs(got - histories[name][0].get("val_loss", math.nan)) <= 1e-9 and abs(got - value) > 1e-9:
            raise Wrong(f"final_losses[{name!r}] is the first val_loss of its history",
                        hint="the final loss is the last entry: histories[name][-1]['val_loss']")
        if abs(got - value) > 1e-9:
            raise Wrong(f"final_losses[{name!r}] is not the last val_loss of histories[{name!r}]")
    lower = want["leaky_conv k=3"] < want["conv k=3"]
    return _prediction_credit(2, predicted == lower, f"the leaky model's final loss is "
                                                     f"{'lower' if lower else 'not lower'} than the honest one's")


# ------------------------------------------------------------------------------- 06 your own bias


def _decreasing(row: torch.Tensor, what: str) -> None:
    """``row[d]``, the bias at distance d = 0, 1, ...: not constant, never growing with d (where it says so)."""
    steps = row[1:] - row[:-1]
    tolerance = 1e-6 * (1 + row.abs().max().item())
    if (row.max() - row.min()).item() <= tolerance:
        raise Wrong(f"{what} is the same at every distance ({row[0].item():.4g}): softmax ignores a constant, so "
                    f"it carries no position", hint="make it larger for near tokens than for far ones, e.g. "
                    "a / (1 + (d / s)²) with a, s > 0")
    if (steps > tolerance).any():
        d = int((steps > tolerance).nonzero()[0])
        raise Wrong(f"{what} grows with distance (from d = {d} to d = {d + 1}: {row[d].item():.4g} -> "
                    f"{row[d + 1].item():.4g}): far tokens would get more attention than near ones",
                    hint="the bias should fall (or stay level) as the distance grows; check the sign of your "
                    "kernel, and use the distance d = i - j >= 0")


@_exercise("06", "implement", "a kernel of your own, CPD, decreasing with distance",
           "a function of |m - n| only that falls with distance, e.g. a / (1 + ((m - n) / s)²) with a, s > 0 "
           "(PD, hence CPD), or -a·log(1 + |m - n|) (Kerple's); test it with md.kernels.is_cpd", points=2)
def my_kernel(your_kernel):
    from . import kernels
    your_kernel = _given(your_kernel, "my_kernel")
    points = torch.arange(8, dtype=torch.float64)
    values = _tensor(your_kernel(points[:, None], points[None, :]), "my_kernel(m, n)", (8, 8)).double()
    shifted = torch.as_tensor(your_kernel(points[:, None] + 5, points[None, :] + 5), dtype=torch.float64)
    if not torch.allclose(shifted, values, atol=1e-9):
        raise Wrong("my_kernel(m + 5, n + 5) differs from my_kernel(m, n): the kernel must depend on m - n only",
                    hint="write it as a function of the difference m - n")
    if not torch.allclose(values, values.T, atol=1e-9):
        raise Wrong("my_kernel(m, n) differs from my_kernel(n, m): a kernel is symmetric",
                    hint="use the distance |m - n|, not the signed m - n")
    distances = torch.arange(64, dtype=torch.float64)
    row = torch.as_tensor(your_kernel(distances, torch.zeros(1, dtype=torch.float64)), dtype=torch.float64)
    _tensor(row, "my_kernel(d, 0) for d = 0..63")
    _decreasing(row, "your kernel")
    if not kernels.is_cpd(your_kernel):
        raise Wrong(f"md.kernels.is_cpd found a point set on which it is not CPD (smallest eigenvalue on zero-sum "
                    f"vectors, positions 0..31: {kernels.cpd_min_eig(your_kernel, 32):.3g})",
                    hint="Corollary 1 (notebook 02): -a|d|^p and -b·log(1 + a|d|^p) are CPD for 0 < p <= 2, "
                    "and PD kernels (Gaussian, Cauchy with a > 0) are CPD")


@_exercise("06", "derive", "how much attention a bounded bias leaves on far keys",
           "with zero content scores the last query's attention is softmax of its bias row: p_d ∝ exp(b(d)) "
           "over the distances d = 0 .. T - 1; add up the p_d with d >= L", points=2)
def far_mass(your_function):
    generator = _fresh_generator()
    for _ in range(4):
        a = 0.5 + 7.5 * torch.rand(1, generator=generator, dtype=torch.float64).item()
        s = 1 + 31 * torch.rand(1, generator=generator, dtype=torch.float64).item()
        L = int(torch.randint(4, 65, (1,), generator=generator))
        T = int(torch.randint(L + 2, 4097, (1,), generator=generator))
        d = torch.arange(T, dtype=torch.float64)
        bias = a / (1 + (d / s) ** 2)
        shifted = a / (1 + ((d + 1) / s) ** 2)                       # distances 1 .. T instead of 0 .. T - 1

        def mass(weights, first=L):
            return (weights[first:].sum() / weights.sum()).item()

        got = _number(_given(your_function, "far_mass")(a, s, L, T), "far_mass(a, s, L, T)")
        want = mass(bias.exp())
        if abs(got - want) <= 1e-9 + 1e-6 * want:
            continue
        where = f"far_mass(a={a:.3g}, s={s:.3g}, L={L}, T={T}) = {got:.6g}"
        mistakes = {"the near keys' share (d < L), not the far keys'": (1 - want, "far keys are d >= L"),
                    "your weights are the bias itself, not exp(bias): softmax exponentiates": (
                        mass(bias), "p_d = exp(b(d)) / Σ_d' exp(b(d'))"),
                    "you start the far keys at d = L + 1": (mass(bias.exp(), L + 1), "d >= L: keys 0 .. T - 1 - L"),
                    "you start the far keys at d = L - 1": (mass(bias.exp(), L - 1), "d >= L: keys 0 .. T - 1 - L"),
                    "your distances run 1 .. T, not 0 .. T - 1": (mass(shifted.exp()),
                                                                  "the query's own key is at distance 0")}
        for description, (value, hint) in mistakes.items():
            if abs(got - value) <= 1e-9 + 1e-6 * abs(value):
                raise Wrong(f"{where}: {description}", hint=hint)
        if not 0 <= got <= 1:
            raise Wrong(f"{where}: a share of attention lies between 0 and 1")
        raise Wrong(f"{where}, which is not the share of the softmax weights on the keys at distance >= L")


@_exercise("06", "implement", "your kernel as a bias module (md.AdditiveBias)",
           "forward(q_pos, k_pos) returns (n_head, len(q_pos), len(k_pos)); use d = (q_pos[:, None] - "
           "k_pos[None, :]).clamp(min=0) for a decoder; keep per-head parameters in nn.Parameter; create new "
           "tensors on q_pos.device", points=3)
def my_bias(your_class):
    from . import kernels
    from .model import AdditiveBias
    your_class = _given(your_class, "MyBias")
    if not _is_subclass(your_class, AdditiveBias):
        raise Wrong("MyBias should be a class that subclasses md.AdditiveBias", hint="class MyBias(md.AdditiveBias)")
    n_head = 4
    module = _build(your_class, _config(n_head=n_head), "MyBias")
    q_pos, k_pos = torch.arange(5, 12, device=CHECK_DEVICE), torch.arange(12, device=CHECK_DEVICE)
    with torch.no_grad():
        bias = _tensor(module(q_pos, k_pos), "MyBias()(q_pos, k_pos)", (n_head, len(q_pos), len(k_pos))).cpu()
        moved = module(q_pos + 100, k_pos + 100).cpu()
        far = torch.arange(64, device=CHECK_DEVICE)
        rows = module(far[-1:], far)[:, 0].flip(-1).double().cpu()                     # (h, d = 0..63)
    visible = (q_pos[:, None] >= k_pos[None, :]).cpu()
    if not torch.allclose(moved[:, visible], bias[:, visible], atol=1e-5):
        raise Wrong("the bias changes when every position is shifted by 100: it is not relative",
                    hint="compute it from the distance q_pos[:, None] - k_pos[None, :] only, never from a position")
    _tensor(rows, "the bias of query 63 against keys 0..63")
    flat = [(row.max() - row.min()).item() <= 1e-6 * (1 + row.abs().max().item()) for row in rows]
    if all(flat):
        _decreasing(rows[0], "your bias")                        # names the constant (or zero) bias
    for h, row in enumerate(rows):
        if not flat[h]:                                          # a head may start flat; none may grow
            _decreasing(row, f"head {h}'s bias")
    for h, row in enumerate(rows[:, :32]):
        minimum = kernels.cpd_min_eig(lambda m, n, row=row: row[(m - n).abs().round().long()], 32)
        if minimum < -1e-5 * row.abs().max().item():            # float32 rounding of the bias allowed
            raise Wrong(f"head {h}'s bias, as the kernel b(|m - n|), is not CPD on positions 0..31 (smallest "
                        f"eigenvalue on zero-sum vectors {minimum:.3g})", hint="use your CPD kernel from 6.1, "
                        "with per-head parameters kept in the range where it is CPD (e.g. a > 0 via softplus)")
    if not _parameter_shapes(module):
        raise Wrong("MyBias has no learnable parameters (nn.Parameter)",
                    hint="give each head its own nn.Parameter, e.g. a width per head")
    gradients = _gradients_of_sum(module, q_pos, k_pos)
    if any(g is None or not torch.isfinite(g).all() for g in gradients):
        raise Wrong("some parameters get no (finite) gradient from the bias",
                    hint="every nn.Parameter must be used in forward, through differentiable operations")


@_exercise("06", "experiment", "the runs that answer 'does my bias extrapolate, and does DAPE help it?'",
           "three configs equal in everything but pe and refiner: a built-in reference (e.g. kerple_log), "
           "pe='my_bias', and pe='my_bias' with refiner='dape'", points=2)
def my_runs(runs):
    from .model import GPTConfig
    from dataclasses import asdict
    runs = _given(runs or None, "my_runs")
    if not isinstance(runs, dict) or not all(isinstance(cfg, GPTConfig) for cfg in runs.values()):
        raise Wrong("my_runs should be a dict of name -> md.GPTConfig", hint="use config(pe, refiner) for each run")
    pairs = {(cfg.pe, cfg.refiner) for cfg in runs.values()}
    for needed in (("my_bias", "none"), ("my_bias", "dape")):
        if needed not in pairs:
            raise Wrong(f"no run with pe={needed[0]!r} and refiner={needed[1]!r}",
                        hint="to see what DAPE adds you need your bias both without and with it")
    if not any(pe != "my_bias" for pe, _ in pairs):
        raise Wrong("no reference run with a built-in encoding to compare with",
                    hint="without a reference you cannot tell a good curve from a bad one: add kerple_log")
    others = [{k: v for k, v in asdict(cfg).items() if k not in ("pe", "refiner")} for cfg in runs.values()]
    differing = sorted({k for other in others for k in other if other[k] != others[0][k]})
    if differing:
        raise Wrong(f"the configs differ in more than pe and refiner ({', '.join(differing)}): the comparison "
                    f"would not be fair", hint="build every run with config(pe, refiner) and nothing else")


@_exercise("06", "experiment", "predict, then measure, which of your runs extrapolates best",
           "best_run = min(last_k, key=lambda name: last_k[name][LENGTHS[-1]]): the run with the lowest "
           "perplexity at the longest length", points=2)
def best_run(prediction, measured, last_k, longest):
    predicted = _choice(prediction, tuple(last_k), "best_prediction (your prediction)")
    measured = _choice(measured, tuple(last_k), "best_run (your measurement)")
    best = min(last_k, key=lambda name: last_k[name][longest])
    if measured != best:
        worst = max(last_k, key=lambda name: last_k[name][longest])
        raise Wrong(f"best_run = {measured!r} is not the run with the lowest perplexity at {longest}",
                    hint="lower perplexity is better: use min, not max" if measured == worst else
                    f"compare the perplexities at the longest length, {longest}")
    return _prediction_credit(2, predicted == best, f"{best} has the lowest perplexity at {longest} "
                                                    f"({last_k[best][longest]:.2f})")


# ------------------------------------------------------------------------------- 07 Chomsky hierarchy


def _little_endian(bits) -> int:
    return sum(int(bit) << i for i, bit in enumerate(bits))


def _addition_answer(a: int, b: int, length: int, end: int, *, big_endian=False, with_end=True, pad=0) -> list:
    """binary_addition's answer for a + b (little-endian bits without trailing zeros, END, then 0s), or one of
    its common wrong versions."""
    bits = [int(bit) for bit in format(a + b, "b")]
    answer = (bits if big_endian else bits[::-1]) + ([end] if with_end else [])
    return answer + [pad] * (length - len(answer))


@_exercise("07", "implement", "a CHE task generator: binary_addition",
           "little-endian: bit i of an operand is worth 2^i; a random split puts the operator '+' (id 2) between "
           "two non-zero operands; the answer is the sum's bits, little-endian without trailing zeros, then END "
           "(id 2), then 0s up to n + 1 tokens", points=3)
def addition_sample(your_function):
    from . import tasks
    task = tasks.get_task("binary_addition")
    end = task.end_token
    generator = _fresh_generator()
    splits = set()
    for seed, (batch, n) in zip(torch.randint(0, 2 ** 31, (2,), generator=generator).tolist(), ((64, 7), (64, 20))):
        sample = _given(your_function, "addition_sample")(batch, n, torch.Generator().manual_seed(seed))
        if not (isinstance(sample, tuple) and len(sample) == 2):
            raise Wrong("addition_sample should return a pair (inputs, targets)")
        inputs, targets = (_tensor(t, name) for t, name in zip(sample, ("inputs", "targets")))
        if tuple(inputs.shape) != (batch, n):
            raise Wrong(f"inputs have shape {tuple(inputs.shape)}, not (batch_size, n) = {(batch, n)}")
        if tuple(targets.shape) != (batch, n + 1):
            raise Wrong(f"targets have shape {tuple(targets.shape)}, not (batch_size, n + 1) = {(batch, n + 1)}",
                        hint="the answer has room for n + 1 tokens: the sum, END, then 0s")
        if inputs.dtype != torch.long or targets.dtype != torch.long:
            raise Wrong("inputs and targets should be LongTensors (token ids)")
        if not ((0 <= inputs) & (inputs <= 2)).all():
            raise Wrong("inputs hold ids outside 0 ('0'), 1 ('1') and 2 ('+')")
        operators = (inputs == 2).sum(dim=1)
        if (operators != 1).any():
            raise Wrong(f"a row holds {int(operators[operators != 1][0])} operators; every row holds exactly one "
                        f"'+' (id 2)", hint="write the operator at the split position, after the first operand")
        for row, target in zip(inputs.tolist(), targets.tolist()):
            split = row.index(2)
            splits.add(split)
            if not 1 <= split <= n - 2:
                raise Wrong(f"a row has its operator at position {split}: both operands need at least one bit",
                            hint="draw the split from 1 .. n - 2")
            a, b = _little_endian(row[:split]), _little_endian(row[split + 1:])
            if a == 0 or b == 0:
                raise Wrong("a row has an operand equal to 0", hint="each operand is a non-zero number: redraw a "
                            "row whose operand bits are all 0")
            if target == _addition_answer(a, b, n + 1, end):
                continue
            shown = f"{''.join('+' if t == 2 else str(t) for t in row)} -> {target}"
            mistakes = {
                "your sum is written big-endian": (_addition_answer(a, b, n + 1, end, big_endian=True),
                                                   "write the sum little-endian: least significant bit first"),
                "you read the operands big-endian": (
                    _addition_answer(_little_endian(row[:split][::-1]), _little_endian(row[split + 1:][::-1]),
                                     n + 1, end), "bit i of an operand (in input order) is worth 2^i"),
                "there is no END after the sum": (_addition_answer(a, b, n + 1, end, with_end=False),
                                                  "end the answer with END (id 2), then pad with 0"),
                "the padding after END is END again": (_addition_answer(a, b, n + 1, end, pad=end),
                                                       "pad with 0 after the first END"),
            }
            for description, (wrong, hint) in mistakes.items():
                if target == wrong:
                    raise Wrong(f"{shown}: {description}", hint=hint)
            raise Wrong(f"{shown}: the targets are not the sum of the two operands, little-endian, then END")
        again = _given(your_function, "addition_sample")(batch, n, torch.Generator().manual_seed(seed))
        if not torch.equal(again[0], inputs):
            raise Wrong("two calls with equally seeded generators gave different inputs: the sample does not come "
                        "from the generator you are given", hint="pass generator=generator to every torch.randint")
    if len(splits) < 4:
        raise Wrong(f"the operator sits only at positions {sorted(splits)}", hint="draw the split at random from "
                    "1 .. n - 2 for each row: the operands have random lengths")


OUTPUT_LENGTH_TASKS = ("reverse_string", "duplicate_string", "compute_sqrt", "binary_multiplication", "parity_check")


@_exercise("07", "derive", "the answer length of five tasks",
           "what does each task compute? an n-bit number's square root has ceil(n/2) bits; a product of an a-bit "
           "and a b-bit number has at most a + b bits, and the answer ends with END", points=2)
def output_length(your_function):
    from . import tasks
    generator = _fresh_generator()
    lengths = [3, 4] + torch.randint(5, 200, (4,), generator=generator).tolist()
    for name in OUTPUT_LENGTH_TASKS:
        task = tasks.get_task(name)
        for n in lengths:
            got = _given(your_function, "output_length")(name, n)
            want = task.output_length(n)
            if got == want:
                continue
            where = f"output_length({name!r}, {n}) = {got!r}"
            known = {("compute_sqrt", n // 2): "the root of an n-bit number with n odd needs (n + 1) / 2 bits: "
                                               "round up",
                     ("binary_multiplication", n - 1): "the product's bits are n - 1 at most, and then comes END",
                     ("duplicate_string", n): "the answer is the input twice",
                     ("parity_check", n): "parity is a classification: one answer token"}
            if (name, got) in known:
                raise Wrong(where, hint=known[name, got])
            raise Wrong(f"{where}, which is not the length of {name}'s answer")


@_exercise("07", "implement", "per-token accuracy with the END mask",
           "score position t of a row when no END occurs before t (the first END itself is scored); accuracy is "
           "(correct and scored) summed over the batch / scored summed over the batch", points=2)
def masked_accuracy(your_function):
    from . import tasks
    task = tasks.get_task("stack_manipulation")
    generator = _fresh_generator()
    for _ in range(100):            # inputs on which every known mistake gives another accuracy than the right one
        targets = torch.randint(0, task.output_vocab, (16, 9), generator=generator)
        targets[torch.arange(16), torch.randint(0, 9, (16,), generator=generator)] = task.end_token
        targets[0] = torch.randint(0, task.end_token, (9,), generator=generator)       # a row without END
        logits = torch.randn(16, 9, task.output_vocab, generator=generator)
        right = torch.rand(16, 9, 1, generator=generator) > 0.4                      # about 60% right
        logits += 3 * torch.nn.functional.one_hot(targets, task.output_vocab) * right
        want = tasks.accuracy(logits, targets, task).item()
        correct = logits.argmax(-1) == targets
        is_end = (targets == task.end_token).int()
        before = (is_end.cumsum(1) - is_end) == 0                                    # no END strictly before
        through = is_end.cumsum(1) == 0                                              # no END up to here
        per_row = torch.stack([(correct[r] & before[r]).sum() / before[r].sum() for r in range(16)]).mean().item()
        mistakes = {"you score every position, padding after END too": (correct.float().mean().item(),
                                                                        "mask the positions after the first END"),
                    "you leave out the END token itself": (((correct & through).sum() / through.sum()).item(),
                                                           "the first END is scored: count END strictly before t"),
                    "you average the rows' accuracies instead of pooling the scored tokens": (
                        per_row, "divide the batch's correct scored tokens by the batch's scored tokens")}
        if all(abs(value - want) > 1e-6 for value, _ in mistakes.values()):
            break
    got = _number(_given(your_function, "masked_accuracy")(logits.clone(), targets.clone(), task.end_token),
                  "masked_accuracy(logits, targets, end_token)")
    if abs(got - want) <= 1e-6:
        return
    for description, (value, hint) in mistakes.items():
        if abs(got - value) <= 1e-6:
            raise Wrong(f"your accuracy is {got:.4f}: {description}", hint=hint)
    raise Wrong(f"your accuracy is {got:.4f}; md.tasks.accuracy gives {want:.4f}")


SHUFFLE_CASES = {"none, encoder": ("none", False), "none, decoder": ("none", True), "alibi, encoder": ("alibi", False),
                 "rope, encoder": ("rope", False)}


def _shuffle_unchanged(pe: str, causal: bool, seed: int = 0) -> bool:
    """Whether an untrained model's answer logits stay the same when the input part of parity_check is shuffled."""
    import dataclasses
    from . import che, tasks
    from .model import GPT, GPTConfig
    task = tasks.get_task("parity_check")
    inputs, _ = task.sample(4, 30, torch.Generator().manual_seed(seed + 2))
    shuffled = inputs[:, torch.randperm(30, generator=torch.Generator().manual_seed(seed + 3))]
    cfg = che.task_config(task, GPTConfig(pe=pe, n_layer=2, n_embd=64, n_head=4))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT(dataclasses.replace(cfg, causal=causal)).eval()
    with torch.no_grad():
        before = model(tasks.encoder_inputs(inputs, task))[0][:, -1]
        after = model(tasks.encoder_inputs(shuffled, task))[0][:, -1]
    return torch.allclose(before, after, atol=1e-5)


@_exercise("07", "experiment", "predict, then measure, which models cannot see the order of the input",
           "answer_unchanged(pe, causal) for each case of SHUFFLE_CASES", points=2)
def shuffle_invariance(prediction, measured):
    for value, what in ((prediction, "unchanged_prediction (your prediction)"), (measured, "unchanged_measured")):
        _given(value, what)
        if not isinstance(value, dict) or set(value) != set(SHUFFLE_CASES) or \
                not all(isinstance(v, bool) for v in value.values()):
            raise Wrong(f"{what} should map each of {list(SHUFFLE_CASES)} to True or False, got {value!r}")
    want = {case: _shuffle_unchanged(pe, causal) for case, (pe, causal) in SHUFFLE_CASES.items()}
    if measured != want:
        raise Wrong(f"your measurement {measured} is not what the models do",
                    hint="call answer_unchanged(pe, causal) for each case of SHUFFLE_CASES")
    wrong = [case for case in want if prediction[case] != want[case]]
    return _prediction_credit(2, not wrong, "unchanged by shuffling: " + ", ".join(
        case for case, same in want.items() if same) + (f"; you predicted wrongly for {', '.join(wrong)}" if wrong
                                                        else ""))
