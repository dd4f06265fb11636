"""The checks of the notebooks' exercises.

Every exercise of notebooks 01-07 has a name and one check here. A notebook cell calls

    exercises.check("kerple_log_bias", kerple_log_bias)

which prints one verdict:

* ``passed`` — the answer behaves like minidape's own implementation (or like the maths) on random inputs;
* ``failed`` — what is wrong, and a hint;
* ``not done yet`` — the answer is still the stub (it calls :func:`todo` or is ``None``). A check never passes
  on a stub, and a stub never stops the notebook, so the student edition runs from top to bottom.

Implementations are compared by behaviour, never by the names of minidape's internal parameters: modules
are built from the same config and handed minidape's weights in the order of their parameters.

:func:`summary` ends each notebook: a table of the verdicts, and an error if an answer is wrong (so a broken
worked solution fails ``make test``, which also sets ``MINIDAPE_EXPECT_EXERCISES`` to ``all`` or ``none``).

Grading (:mod:`minidape.grade`) uses the same checks, but never in the student's process: there
:func:`check` only records its answer in :data:`answers`, and the grader later runs :func:`verdict` in its own
process with the answers as :class:`minidape.sandbox.Remote` handles. A check must therefore touch an answer
only by calling it with data (tensors, numbers, strings, configs, picklable objects) and through the helpers
below for anything else: :func:`_is_module`, :func:`_is_class`, :func:`_subclass_of`, :func:`_type_name`,
:func:`_parameter_shapes`, :func:`_hand_over`, :func:`_gradients`. What an answer returns comes back as data.
"""
from __future__ import annotations

import math
import os
import secrets
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

PASSED, FAILED, NOT_DONE = "passed", "failed", "not done yet"
EXPECT = "MINIDAPE_EXPECT_EXERCISES"     # "all" (worked solutions) or "none" (student edition): see summary()


class NotDone(NotImplementedError):
    """Raised by an exercise's stub: the student has not written this part yet."""


class Wrong(Exception):
    """Raised by a check: the answer runs, but does not do what the exercise asks. The message says how."""


class Partial(Wrong):
    """Raised by a check whose exercise has parts: ``fraction`` of its points are earned, the message says
    what is still wrong."""

    def __init__(self, fraction: float, message: str):
        super().__init__(message)
        self.fraction = min(1.0, max(0.0, float(fraction)))


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
    points: int = 1


EXERCISES: dict[str, Exercise] = {}
results: dict[str, str] = {}     # this session's verdicts, by exercise name
answers: dict | None = None      # the grader's worker sets {}: check() then records (answer, options) by name


def _exercise(notebook: str, kind: str, title: str, hint: str, points: int = 1):
    def register(checker):
        EXERCISES[checker.__name__] = Exercise(checker.__name__, notebook, kind, title, hint, checker, points)
        return checker
    return register


# Per exercise, minidape's own implementation of what it asks for (functions, classes: all their methods).
# While the grader calls an answer, entering any of these makes the exercise fail with a message naming it.
LIBRARY: dict[str, tuple[str, ...]] = {
    "sinusoidal_table": ("minidape.model.SinusoidalPositions",),
    "rope_ones_score": ("minidape.model.RotaryEmbedding", "minidape.model.apply_rotary"),
    "alibi_bias": ("minidape.model.ALiBiBias", "minidape.model.alibi_slopes"),
    "square_quadratic_form": ("minidape.kernels.gram",),
    "find_shift": ("minidape.kernels.pd_shift",),
    "kerple_log_bias": ("minidape.model.KerpleLogBias",),
    "dape_refiner": ("minidape.model.DAPERefiner", "minidape.model.DAPEConcatRefiner", "minidape.model.HeadMLP",
                     "minidape.fast.dape", "minidape.fast.head_mlp"),
    "dape_parameter_count": ("minidape.model.DAPERefiner", "minidape.model.HeadMLP"),
    "receptive_keys": ("minidape.model.ConvRefiner",),
    "conv_refiner": ("minidape.model.ConvRefiner",),
    "my_bias": ("minidape.model.ALiBiBias", "minidape.model.T5Bias", "minidape.model.KerpleLogBias",
                "minidape.model.KerplePowerBias", "minidape.model.FIREBias"),
    "parity_sample": ("minidape.tasks.ParityCheck",),
    "output_length": ("minidape.tasks.get_task", "minidape.tasks.ReverseString", "minidape.tasks.DuplicateString",
                      "minidape.tasks.ComputeSqrt", "minidape.tasks.BinaryAddition"),
    "masked_accuracy": ("minidape.tasks.accuracy", "minidape.tasks.output_mask"),
}


def exercises_of(notebook: str) -> list[Exercise]:
    """The exercises of one notebook ("01" .. "07"), in order."""
    return [exercise for exercise in EXERCISES.values() if exercise.notebook == notebook]


def verdict(name: str, *answer, **options) -> tuple[str, str, float]:
    """Run exercise ``name``'s check on an answer: (status, message, points earned). Random inputs are drawn
    afresh on every call (a seed nobody chose), and the caller's random stream is left as it was."""
    exercise = EXERCISES[name]
    earned = 0.0
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(secrets.randbits(63))
            note = exercise.checker(*answer, **options)
        status, message, earned = PASSED, "passed" + (f". {note}" if note else ""), float(exercise.points)
    except NotImplementedError:
        status, message = NOT_DONE, "not done yet (the stub is still there)"
    except Wrong as wrong:
        status, message = FAILED, f"not yet right: {wrong}\n    hint: {exercise.hint}"
        if isinstance(wrong, Partial):
            earned = round(wrong.fraction * exercise.points, 2)
    except Exception as error:  # the student's code itself failed: say where, never stop the notebook
        from .sandbox import StudentError, WorkerGone
        raised = (f"your code's worker {error}" if isinstance(error, WorkerGone) else
                  f"your code raised {error if isinstance(error, StudentError) else f'{type(error).__name__}: {error}'}")
        status, message = FAILED, f"{raised}\n    hint: {exercise.hint}"
    return status, message, earned


def check(name: str, *answer, **options) -> bool:
    """Check the answer to exercise ``name``; print the verdict and return True when it passed."""
    if name not in EXERCISES:
        raise ValueError(f"unknown exercise {name!r}; the exercises are: {', '.join(EXERCISES)}")
    if answers is not None:             # graded: the grader judges this answer in its own process
        answers[name] = (answer, options)
    exercise = EXERCISES[name]
    status, message, _ = verdict(name, *answer, **options)
    results[name] = status
    mark = {PASSED: "✓", FAILED: "✗", NOT_DONE: "…"}[status]
    print(f"{mark} exercise {exercise.notebook}·{name} ({exercise.kind}): {message}")
    return status == PASSED


def passed(name: str) -> bool:
    """Whether exercise ``name`` passed its check in this session."""
    return results.get(name) == PASSED


def summary(notebook: str) -> dict[str, str]:
    """Print this notebook's verdicts; raise :class:`ExerciseFailed` if an answer was checked and is wrong."""
    verdicts = {exercise.name: results.get(exercise.name, "not checked") for exercise in exercises_of(notebook)}
    width = max(map(len, verdicts))
    print(f"notebook {notebook}: {sum(v == PASSED for v in verdicts.values())} of {len(verdicts)} exercises passed")
    for name, verdict in verdicts.items():
        print(f"  {name:<{width}}  {EXERCISES[name].kind:<10}  {verdict}")
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


def _type_name(value) -> str:
    """The name of an answer's type, whether it lives here or in the grader's worker."""
    from .sandbox import Remote
    return value.describe().type_name if isinstance(value, Remote) else type(value).__name__


def _is_class(value) -> bool:
    from .sandbox import Remote
    return value.describe().is_class if isinstance(value, Remote) else isinstance(value, type)


def _is_module(value) -> bool:
    """Whether an answer is an ``nn.Module`` instance."""
    from .sandbox import Remote
    return value.describe().is_module if isinstance(value, Remote) else isinstance(value, nn.Module)


def _subclass_of(value, base: type) -> bool:
    """Whether an answer is a class that subclasses ``base`` (one of minidape's classes)."""
    from .sandbox import Remote
    if isinstance(value, Remote):
        described = value.describe()
        return described.is_class and f"{base.__module__}.{base.__qualname__}" in described.bases
    return isinstance(value, type) and issubclass(value, base)


def _parameter_shapes(module) -> list[tuple[int, ...]]:
    """The shapes of a module's parameters, in the order it registers them."""
    from .sandbox import Remote
    if isinstance(module, Remote):
        return [tuple(shape) for shape in module.describe().parameter_shapes]
    return [tuple(p.shape) for p in module.parameters()]


def _gradients(module, *inputs) -> list[torch.Tensor | None]:
    """The gradient of ``module(*inputs).sum()`` with respect to each parameter (None where none flows)."""
    from .sandbox import Remote
    if isinstance(module, Remote):
        return module._session.request("gradients", module._ref, inputs)
    module.zero_grad(set_to_none=True)
    module(*inputs).sum().backward()
    return [p.grad for p in module.parameters()]


def _tensor(value, what: str, shape: tuple | None = None) -> torch.Tensor:
    _given(value, what)
    if not isinstance(value, torch.Tensor):
        raise Wrong(f"{what} should be a torch.Tensor, got {_type_name(value)}")
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise Wrong(f"{what} has shape {tuple(value.shape)}, expected {tuple(shape)}")
    if not torch.isfinite(value).all():
        raise Wrong(f"{what} holds NaN or infinite values")
    return value


def _close(got: torch.Tensor, want: torch.Tensor, what: str, atol: float = 1e-5, rtol: float = 1e-4) -> None:
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    if not torch.allclose(got, want, atol=atol, rtol=rtol):
        where = ((got - want).abs() - atol - rtol * want.abs()).argmax()
        index = tuple(int(i) for i in torch.unravel_index(where, want.shape))
        raise Wrong(f"{what} differs from minidape's at index {index}: yours {got[index].item():.6g}, "
                    f"expected {want[index].item():.6g}")


def _generator() -> torch.Generator:
    """A generator for a check's random inputs, seeded from the stream :func:`verdict` seeds afresh: derive
    checks run on new inputs every time, so a table of answers to fixed inputs cannot pass."""
    return torch.Generator().manual_seed(int(torch.randint(0, 2**62, ())))


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


def _hand_over(source: nn.Module, target: nn.Module, what: str) -> None:
    """Copy ``source``'s parameters into ``target``'s, in the order the modules register them."""
    from .sandbox import Remote
    theirs, yours = list(source.parameters()), _parameter_shapes(target)
    if [tuple(p.shape) for p in theirs] != yours:
        raise Wrong(f"{what}'s parameters have shapes {yours}; minidape's, in the same "
                    f"order, are {[tuple(p.shape) for p in theirs]}, so its weights cannot be handed over")
    if isinstance(target, Remote):
        target._session.request("load_parameters", target._ref, [p.detach().clone() for p in theirs])
        return
    with torch.no_grad():
        for mine, own in zip(theirs, target.parameters()):
            own.copy_(mine)


def _refiner_inputs(cfg, batch: int, T: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(batch, cfg.n_head, T, T, generator=generator)
    bias = torch.randn(cfg.n_head, T, T, generator=generator)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    return scores, bias, mask


def _compare_refiners(your_class, name: str, what: str, **overrides) -> None:
    """Build minidape's refiner ``name`` and yours from the same config, hand over the weights, and compare
    the refined scores on the cells attention may see, for random scores and biases."""
    from .model import REFINER_REGISTRY
    cfg = _config(refiner=name, refiner_width=8, **overrides)
    theirs = REFINER_REGISTRY[name](cfg)            # fresh weights and inputs: nothing to look up in a table
    yours = _given(your_class, what)(cfg)
    if not _is_module(yours):
        raise Wrong(f"{what}(cfg) should build an nn.Module, got {_type_name(yours)}")
    _hand_over(theirs, yours, what)
    for T in (7, 12):
        scores, bias, mask = _refiner_inputs(cfg, 2, T, int(torch.randint(0, 2**62, ())))
        got = _tensor(yours(scores.clone(), bias.clone(), mask), f"{what}'s output", scores.shape)
        want = theirs(scores, bias, mask)
        _close(got[..., mask], want[..., mask], f"the refined score (on a cell attention may see, T = {T})")


# ---------------------------------------------------------------------------- 01 positional encodings


@_exercise("01", "implement", "the sinusoidal table P (Vaswani et al.)",
           "column 2i is sin(p·ω_i) and column 2i+1 is cos(p·ω_i), interleaved, with ω_i = 10000^(-2i/d)")
def sinusoidal_table(your_function):
    for d in (8, 64):
        positions = torch.cat([torch.tensor([0, 1]), torch.randint(2, 512, (4,), generator=_generator())])
        got = _tensor(_given(your_function, "sinusoidal_table")(positions, d), "sinusoidal_table(positions, d)",
                      (len(positions), d))
        want = _pe_module(pe="sinusoidal", n_embd=d, n_head=2)(positions)
        halves = torch.cat([want[:, 0::2], want[:, 1::2]], dim=1)
        if torch.allclose(got.double(), halves.double(), atol=1e-4):
            raise Wrong("you put all the sines first and all the cosines after; minidape interleaves them")
        _close(got, want, f"P (d = {d})", atol=1e-4, rtol=0)


@_exercise("01", "derive", "RoPE's score of two all-ones vectors at distance t, in closed form",
           "rotations compose: <R_m q, R_n k> = Σ_i (pair i's dot product) rotated by (m - n)θ_i; with q = k = 1 "
           "each pair contributes 2cos((m - n)θ_i), θ_i = 10000^(-2i/d)")
def rope_ones_score(your_function):
    for head_size in (8, 32):
        rope = _pe_module(pe="rope", n_embd=4 * head_size, n_head=4)
        for distance in [0, *torch.randint(1, 1000, (4,), generator=_generator()).tolist()]:
            cos, sin = rope(torch.tensor([distance, 0]), T=distance + 1)
            want = 2 * (cos[0] * cos[1] + sin[0] * sin[1]).sum()      # Σ_i 2 cos(mθ_i - nθ_i), from minidape's angles
            got = _number(_given(your_function, "rope_ones_score")(distance, head_size),
                          "rope_ones_score(t, head_size)")
            if abs(got - want.item()) > 1e-3 * max(1.0, abs(want.item())):
                raise Wrong(f"rope_ones_score({distance}, {head_size}) = {got:.5g} is not the score of two all-ones "
                            f"vectors rotated by minidape's RoPE ({'too high' if got > want else 'too low'})")


@_exercise("01", "implement", "ALiBi's bias for any query and key positions",
           "slope of head h (1-based) is 2^(-8h/H) for H heads; the bias is -slope·(i - j) on keys j <= i")
def alibi_bias(your_function):
    for n_head in (4, 8):
        start = int(torch.randint(0, 100, (), generator=_generator()))
        q_pos, k_pos = torch.arange(start + 20, start + 30), torch.arange(start, start + 30)
        got = _tensor(_given(your_function, "alibi_bias")(n_head, q_pos, k_pos), "alibi_bias(n_head, q_pos, k_pos)",
                      (n_head, len(q_pos), len(k_pos)))
        want = _pe_module(pe="alibi", n_head=n_head, n_embd=8 * n_head)(q_pos, k_pos)
        visible = q_pos[:, None] >= k_pos[None, :]
        _close(got[:, visible], want[:, visible], f"the bias with {n_head} heads")


# ------------------------------------------------------------------------------- 02 Kerple, CPD kernels


@_exercise("02", "derive", "cᵀKc for the kernel -|m-n|² and zero-sum c, in closed form",
           "expand (x_i - x_j)² = x_i² - 2x_i x_j + x_j²; the terms with x_i² alone vanish when Σ_j c_j = 0")
def square_quadratic_form(your_function):
    generator = _generator()
    for n in (3, 8, 20):
        x = torch.randn(n, generator=generator, dtype=torch.float64) * 5
        c = torch.randn(n, generator=generator, dtype=torch.float64)
        c = c - c.mean()                                              # zero-sum
        K = -(x[:, None] - x[None, :]) ** 2
        want = (c @ K @ c).item()
        got = _number(_given(your_function, "square_quadratic_form")(x, c), "square_quadratic_form(x, c)")
        if abs(got - want) > 1e-8 * max(1.0, abs(want)):
            raise Wrong(f"for {n} random points your form gives {got:.6g}, which is not cᵀKc "
                        f"({'too high' if got > want else 'too low'})")


@_exercise("02", "implement", "the geometric search for Kerple's shift c",
           "start at c = 1 and double until the smallest eigenvalue of c + K is >= -1e-10·max|c + K|; "
           "md.kernels.gram and md.kernels.smallest_eigenvalue do the linear algebra")
def find_shift(your_function):
    from . import kernels
    sizes = torch.randint(8, 65, (3,), generator=_generator()).tolist()
    cases = [(f"-|m-n| on 0..{sizes[0] - 1}", lambda m, n: -(m - n).abs(), sizes[0]),
             (f"-log(1+|m-n|) on 0..{sizes[1] - 1}", kernels.log_kernel(), sizes[1]),
             (f"-|m-n|^1.5 on 0..{sizes[2] - 1}", kernels.power_kernel(p=1.5), sizes[2])]
    for label, kernel, n in cases:
        got = _number(_given(your_function, "find_shift")(kernel, n), "find_shift(kernel, n)")
        want = kernels.pd_shift(kernel, n)
        if got != want:
            shifted = kernels.gram(kernel, n) + got
            psd = kernels.smallest_eigenvalue(shifted) >= -1e-10 * shifted.abs().max().item()
            raise Wrong(f"for {label} you found c = {got:g}; the doubling search stops at c = {want:g} "
                        f"(c + K is {'PSD' if psd else 'not PSD'} at your c)")


@_exercise("02", "implement", "Kerple-log's bias -r1·log(1 + r2·(i - j))",
           "r1 and r2 are per-head tensors (shape (h,)): index them as r1[:, None, None]; distances i - j are "
           "q_pos[:, None] - k_pos[None, :]")
def kerple_log_bias(your_function):
    generator = _generator()
    pe = _pe_module(pe="kerple_log")
    with torch.no_grad():
        pe.r1.copy_(torch.rand(4, generator=generator) * 2 + 0.05)
        pe.r2.copy_(torch.rand(4, generator=generator) + 0.05)
    q_pos, k_pos = torch.arange(40, 50), torch.arange(0, 50)
    got = _tensor(_given(your_function, "kerple_log_bias")(pe.r1.detach().clone(), pe.r2.detach().clone(), q_pos,
                                                          k_pos), "kerple_log_bias(r1, r2, q_pos, k_pos)", (4, 10, 50))
    with torch.no_grad():
        want = pe(q_pos, k_pos)
    visible = q_pos[:, None] >= k_pos[None, :]
    _close(got[:, visible], want[:, visible], "the bias")


# ------------------------------------------------------------------------- 03 train and extrapolate


@_exercise("03", "experiment", "predict, then measure, how RoPE degrades at 16× its training length",
           "the ratio is last_k['rope'][longest] / last_k['rope'][train_length], read from the table above")
def rope_ratio(prediction, measured_ratio, last_k, train_length, longest):
    predicted = _prediction(prediction, "rope_breaks (your prediction)")
    measured = _number(measured_ratio, "rope_ratio (your measurement)")
    want = last_k["rope"][longest] / last_k["rope"][train_length]
    if abs(measured - want) > 1e-6 * want:
        raise Wrong(f"your ratio {measured:.4g} is not last_k['rope'][{longest}] / last_k['rope'][{train_length}] "
                    f"= {want:.4g}")
    held = predicted == (want > 2)
    return (f"RoPE's ratio is {want:.2f}, so it {'more' if want > 2 else 'less'} than doubles; your prediction "
            f"{'held' if held else 'did not hold: what did you expect, and why did it not happen?'}")


@_exercise("03", "derive", "both protocols' perplexities from one position-wise loss curve",
           "last_k averages the k entries that end at T - 1, nonoverlap all T entries from 0; perplexity is "
           "exp of the mean loss")
def protocols_from_curve(your_function):
    generator = _generator()
    curve = 1 + torch.rand(300, generator=generator, dtype=torch.float64) * 3
    for T, k in ((300, 256), (64, 256), (200, 50)):
        answer = _given(your_function, "protocols_from_curve")(curve, T, k)
        if not (isinstance(answer, tuple) and len(answer) == 2):
            raise Wrong(f"protocols_from_curve should return a pair (last_k, nonoverlap), got {answer!r}")
        want = (math.exp(curve[T - min(k, T):T].mean()), math.exp(curve[:T].mean()))
        for got, expected, label in zip(answer, want, ("last_k", "nonoverlap")):
            got = _number(got, f"the {label} perplexity")
            if abs(got - expected) > 1e-6 * expected:
                raise Wrong(f"T = {T}, k = {k}: your {label} perplexity {got:.6g} is not exp of the mean loss of "
                            f"the entries it should average ({'too high' if got > expected else 'too low'})")


@_exercise("03", "implement", "a running mean that does not invent values before position 0",
           "entry t is the mean of curve[max(0, t - width + 1) : t + 1]; torch.cumsum gives every such sum at once")
def running_mean(your_function):
    generator = _generator()
    curve = torch.rand(50, generator=generator, dtype=torch.float64)
    for width in (1, 4, 16):
        got = _tensor(_given(your_function, "running_mean")(curve.clone(), width), "running_mean(curve, width)",
                      curve.shape)
        want = torch.stack([curve[max(0, t - width + 1):t + 1].mean() for t in range(len(curve))])
        if width > 1 and torch.allclose(got[:width].double(), ((width - 1 - torch.arange(width)) * curve[0]
                                        + torch.stack([curve[:t + 1].sum() for t in range(width)])) / width):
            raise Wrong("the first entries repeat position 0 (replicate padding): they average values that do not "
                        "exist, which flattens the start of the curve")
        _close(got, want, f"the running mean (width {width})", atol=1e-9, rtol=1e-9)


# ------------------------------------------------------------------------------------ 04 DAPE, CAPE


@_exercise("04", "implement", "DAPE's refiner, eq. (3): A = S + B + f([S, B])",
           "f is Linear(2h, W) -> LeakyReLU(0.01) -> Linear(W, h), applied at every cell over the head axis: "
           "move the heads last with permute(0, 2, 3, 1), apply f, move them back; expand B to S's shape first")
def dape_refiner(your_class):
    _compare_refiners(your_class, "dape", "MyDAPE")


@_exercise("04", "derive", "the number of parameters of DAPE's f in one layer",
           "two Linear layers with biases: (2h inputs -> W) then (W -> h); count weights and biases")
def dape_parameter_count(your_function):
    from .model import REFINER_REGISTRY
    generator = _generator()
    for n_head, width in zip(torch.randint(1, 17, (3,), generator=generator).tolist(),
                             torch.randint(1, 65, (3,), generator=generator).tolist()):
        cfg = _config(n_head=n_head, n_embd=4 * n_head, refiner="dape", refiner_width=width)
        want = sum(p.numel() for p in REFINER_REGISTRY["dape"](cfg).parameters())
        got = _number(_given(your_function, "dape_parameter_count")(n_head, width), "dape_parameter_count(h, W)")
        if got != want:
            raise Wrong(f"dape_parameter_count({n_head}, {width}) = {got:g} is not the number of parameters of "
                        f"minidape's refiner with {n_head} heads and width {width} "
                        f"({'too many' if got > want else 'too few'})")


@_exercise("04", "implement", "attention mass beyond one training length",
           "model.attention_maps(idx, layer)['probs'] is (B, heads, queries, keys); take the last query, keys "
           "0 .. T - train_length - 1, sum over keys, then average over heads and layers")
def far_attention(your_function):
    from .model import GPT
    model = GPT(_config(n_layer=2, pe="kerple_log", refiner="dape", refiner_width=8)).eval()
    idx = torch.randint(0, 256, (1, 48), generator=_generator())
    with torch.no_grad():
        want = torch.stack([model.attention_maps(idx, layer)["probs"][0, :, -1, :48 - 16].sum(-1)
                            for layer in range(2)]).mean().item()
        got = _number(_given(your_function, "far_attention")(model, idx, 16), "far_attention(model, idx, train_length)")
    if abs(got - want) > 1e-5:
        raise Wrong(f"on a small random model your far attention is {got:.5f}, expected {want:.5f}")


# ------------------------------------------------------------------------------------ 05 DAPE-V2 conv


@_exercise("05", "derive", "which keys a refined cell A[i, j] reads",
           "each 1×k layer reaches k // 2 keys to each side, two layers reach 2·(k // 2); tril removes keys > i")
def receptive_keys(your_function):
    from .model import REFINER_REGISTRY
    generator = _generator()
    for kernel in (1, 3, 5, 7, 3, 5):
        i = int(torch.randint(0, 16, (), generator=generator))
        j = int(torch.randint(0, i + 1, (), generator=generator))
        cfg = _config(pe="none", refiner="conv", refiner_kernel=kernel, refiner_width=8)
        torch.manual_seed(0)
        refiner = REFINER_REGISTRY["conv"](cfg)
        scores, _, mask = _refiner_inputs(cfg, 1, 16, kernel)
        scores.requires_grad_(True)
        refiner(scores, None, mask)[0, 0, i, j].backward()
        want = scores.grad[0, :, i].abs().sum(0).nonzero().flatten().tolist()
        got = _given(your_function, "receptive_keys")(i, j, kernel)
        if sorted(int(key) for key in got) != want:
            extra, missing = set(map(int, got)) - set(want), set(want) - set(map(int, got))
            raise Wrong(f"receptive_keys({i}, {j}, k={kernel}) = {sorted(got)}: by the gradient of minidape's conv "
                        f"refiner, {len(extra)} of these keys are not read and {len(missing)} keys that are read "
                        f"are missing")


@_exercise("05", "implement", "DAPE-V2's conv refiner: A = S + B + Conv(tril([S, B]))",
           "nn.Conv2d(2h, W, (1, k), padding=(0, k // 2)), LeakyReLU(0.01), nn.Conv2d(W, h, (1, k), same padding); "
           "zero the masked cells of [S, B] (masked_fill(~mask, 0)) before the first convolution")
def conv_refiner(your_class):
    for kernel in (3, 5):
        _compare_refiners(your_class, "conv", "MyConvRefiner", refiner_kernel=kernel)


@_exercise("05", "experiment", "predict, then measure, what the leaky conv does to the validation loss",
           "read the last 'val_loss' of each history")
def leakage(prediction, measured, histories):
    predicted = _prediction(prediction, "leaky_is_lower (your prediction)")
    measured = _given(measured, "final_losses (your measurement)")
    want = {name: histories[name][-1]["val_loss"] for name in ("conv k=3", "leaky_conv k=3")}
    if not isinstance(measured, dict) or set(measured) != set(want):
        raise Wrong(f"final_losses should be a dict with the keys {sorted(want)}")
    for name, value in want.items():
        if abs(_number(measured[name], f"final_losses[{name!r}]") - value) > 1e-9:
            raise Wrong(f"final_losses[{name!r}] is not the last val_loss of histories[{name!r}] ({value:.4f})")
    lower = want["leaky_conv k=3"] < want["conv k=3"]
    return (f"the leaky model's final loss is {'lower' if lower else 'not lower'} than the honest one's; your "
            f"prediction {'held' if predicted == lower else 'did not hold'}")


# ------------------------------------------------------------------------------- 06 your own bias


@_exercise("06", "implement", "a kernel of your own, CPD",
           "a function of m - n only, e.g. a / (1 + ((m - n) / s)²) with a, s > 0 (PD, hence CPD), or "
           "-a·log(1 + |m - n|) (Kerple's); test it with md.kernels.is_cpd")
def my_kernel(your_kernel):
    from . import kernels
    points = torch.arange(8, dtype=torch.float64)
    values = _tensor(_given(your_kernel, "my_kernel")(points[:, None], points[None, :]), "my_kernel(m, n)", (8, 8))
    shifted = your_kernel(points[:, None] + 5, points[None, :] + 5)
    if not torch.allclose(torch.as_tensor(shifted, dtype=torch.float64), values.double(), atol=1e-9):
        raise Wrong("my_kernel(m + 5, n + 5) differs from my_kernel(m, n): the kernel must depend on m - n only")
    if not kernels.is_cpd(your_kernel):
        raise Wrong(f"md.kernels.is_cpd found a point set on which it is not CPD (smallest eigenvalue on zero-sum "
                    f"vectors, positions 0..31: {kernels.cpd_min_eig(your_kernel, 32):.3g})")


@_exercise("06", "implement", "your kernel as a bias module (md.AdditiveBias)",
           "forward(q_pos, k_pos) returns (n_head, len(q_pos), len(k_pos)); use d = (q_pos[:, None] - "
           "k_pos[None, :]).clamp(min=0) for a decoder; keep per-head parameters in nn.Parameter")
def my_bias(your_class):
    from .model import AdditiveBias
    your_class = _given(your_class, "MyBias")
    if not _subclass_of(your_class, AdditiveBias):
        raise Wrong("MyBias should be a class that subclasses md.AdditiveBias")
    n_head = 4
    module = your_class(_config(n_head=n_head))
    q_pos, k_pos = torch.arange(5, 12), torch.arange(12)
    bias = _tensor(module(q_pos, k_pos), "MyBias()(q_pos, k_pos)", (n_head, len(q_pos), len(k_pos)))
    if not torch.allclose(module(q_pos + 100, k_pos + 100), bias, atol=1e-5):
        raise Wrong("the bias changes when every position is shifted by 100: it is not relative")
    if not _parameter_shapes(module):
        raise Wrong("MyBias has no learnable parameters (nn.Parameter)")
    if any(g is None or not torch.isfinite(g).all() for g in _gradients(module, q_pos, k_pos)):
        raise Wrong("some parameters get no (finite) gradient from the bias")


@_exercise("06", "experiment", "the runs that answer 'does my bias extrapolate, and does DAPE help it?'",
           "three configs equal in everything but pe and refiner: a built-in reference (e.g. kerple_log), "
           "pe='my_bias', and pe='my_bias' with refiner='dape'")
def my_runs(runs):
    from .model import GPTConfig
    from dataclasses import asdict
    runs = _given(runs or None, "my_runs")
    if not isinstance(runs, dict) or not all(isinstance(cfg, GPTConfig) for cfg in runs.values()):
        raise Wrong("my_runs should be a dict of name -> md.GPTConfig")
    pairs = {(cfg.pe, cfg.refiner) for cfg in runs.values()}
    for needed in (("my_bias", "none"), ("my_bias", "dape")):
        if needed not in pairs:
            raise Wrong(f"no run with pe={needed[0]!r} and refiner={needed[1]!r}")
    if not any(pe != "my_bias" for pe, _ in pairs):
        raise Wrong("no reference run with a built-in encoding to compare with")
    others = [{k: v for k, v in asdict(cfg).items() if k not in ("pe", "refiner")} for cfg in runs.values()]
    if any(other != others[0] for other in others):
        raise Wrong("the configs differ in more than pe and refiner: the comparison would not be fair")


# ------------------------------------------------------------------------------- 07 Chomsky hierarchy


@_exercise("07", "implement", "a CHE task generator: parity_check",
           "inputs are random bits (torch.randint(0, 2, (batch, n), generator=generator)); the answer is the "
           "number of 1s mod 2, shaped (batch, 1)")
def parity_sample(your_function):
    from . import tasks
    task = tasks.get_task("parity_check")
    answers = []
    for batch, n in ((64, 10), (64, 33)):
        sample = _given(your_function, "parity_sample")(batch, n, _generator())
        if not (isinstance(sample, tuple) and len(sample) == 2):
            raise Wrong("parity_sample should return a pair (inputs, targets)")
        inputs, targets = (_tensor(t, name) for t, name in zip(sample, ("inputs", "targets")))
        if tuple(inputs.shape) != (batch, n) or tuple(targets.shape) != (batch, task.output_length(n)):
            raise Wrong(f"shapes {tuple(inputs.shape)}, {tuple(targets.shape)}; expected {(batch, n)} and "
                        f"{(batch, task.output_length(n))}, as md.tasks.get_task('parity_check').sample gives")
        if inputs.dtype != torch.long or targets.dtype != torch.long:
            raise Wrong("inputs and targets should be LongTensors (token ids)")
        if not ((0 <= inputs) & (inputs < task.input_vocab)).all():
            raise Wrong(f"inputs should be ids 0 .. {task.input_vocab - 1}")
        if not torch.equal(targets[:, 0], inputs.sum(dim=1) % 2):
            raise Wrong("some targets are not the parity (number of 1s mod 2) of their input")
        answers.append(targets)
    labels = torch.cat(answers).float().mean().item()
    if not 0.2 < labels < 0.8:
        raise Wrong(f"{labels:.0%} of the answers are 'odd': the inputs are not random enough")


@_exercise("07", "derive", "the answer length of four tasks",
           "reverse_string: n; duplicate_string: 2n; compute_sqrt: ceil(n/2) digits of the root of an n-bit number; "
           "binary_addition: n + 1 (the input holds both numbers, the sum can carry)")
def output_length(your_function):
    from . import tasks
    for name in ("reverse_string", "duplicate_string", "compute_sqrt", "binary_addition"):
        task = tasks.get_task(name)
        for n in [1, 2, *torch.randint(3, 200, (4,), generator=_generator()).tolist()]:
            got = _given(your_function, "output_length")(name, n)
            if got != task.output_length(n):
                raise Wrong(f"output_length({name!r}, {n}) = {got!r} is not the length of the answer to an "
                            f"input of length {n}")


@_exercise("07", "implement", "per-token accuracy with the END mask",
           "score position t of a row when no END occurs before t (the first END itself is scored); accuracy is "
           "(correct and scored) summed over the batch / scored summed over the batch")
def masked_accuracy(your_function):
    from . import tasks
    task = tasks.get_task("stack_manipulation")
    generator = _generator()
    targets = torch.randint(0, task.output_vocab, (16, 9), generator=generator)
    targets[torch.arange(16), torch.randint(0, 9, (16,), generator=generator)] = task.end_token
    targets[0] = torch.randint(0, task.end_token, (9,), generator=generator)           # a row without END
    logits = torch.randn(16, 9, task.output_vocab, generator=generator)
    right = torch.rand(16, 9, 1, generator=generator) > 0.4                          # about 60% right
    logits += 3 * torch.nn.functional.one_hot(targets, task.output_vocab) * right
    got = _number(_given(your_function, "masked_accuracy")(logits, targets, task.end_token),
                  "masked_accuracy(logits, targets, end_token)")
    want = tasks.accuracy(logits, targets, task).item()
    if abs(got - want) > 1e-6:
        raise Wrong(f"your accuracy is {got:.4f}; md.tasks.accuracy gives {want:.4f}")
