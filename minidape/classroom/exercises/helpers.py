"""The shared helpers of the checks: reading answers, drawing inputs, and how a check touches an answer (the one
place to adapt when the answer lives in the grader's worker)."""

from __future__ import annotations

import math
import secrets
from pathlib import Path

import torch
from torch import nn

from .. import answering
from . import framework  # framework.CHECK_DEVICE is read at call time (the grader sets it)
from .framework import Credit, NotDone, RemoteAnswer, Wrong


def _given(value, what: str):
    """The answer, or :class:`NotDone` when it is still the stub's None (or ...)."""
    if value is None or value is Ellipsis:
        raise NotDone(what)
    return value


def _tensor(value, what: str, shape: tuple | None = None, visible: torch.Tensor | None = None) -> torch.Tensor:
    """A tensor of that shape, finite on the ``visible`` cells (all when None; masked cells may hold -inf)."""
    _given(value, what)
    if not isinstance(value, torch.Tensor):
        raise Wrong(f"{what} should be a torch.Tensor, got {_type_name(value)}")
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise Wrong(f"{what} has shape {tuple(value.shape)}, expected {tuple(shape)}")
    finite = torch.isfinite(value)
    if not (finite if visible is None else finite | ~visible.to(value.device).expand_as(finite)).all():
        raise Wrong(
            f"{what} holds NaN or infinite values" + (" where attention may look" if visible is not None else "")
        )
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
    from ...model import GPTConfig

    settings = dict(n_layer=1, n_head=4, n_embd=32, block_size=16, pe="kerple_log")
    return GPTConfig(**{**settings, **overrides})


def _pe_module(**overrides):
    from ...model import GPT

    return GPT(_config(**overrides)).pe


def _refiner_inputs(cfg, batch: int, T: int, generator: torch.Generator):
    scores = torch.randn(batch, cfg.n_head, T, T, generator=generator)
    bias = torch.randn(cfg.n_head, T, T, generator=generator)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    return scores, bias, mask


# ------------------------------------------------------------------ how a check touches an answer
# A check uses an answer only by calling it with data (tensors, numbers, configs) and through the small helpers
# below, the one place to adapt when the answer lives in another process (the grader's isolated kernel).


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
    return module if _remote(module) else module.to(framework.CHECK_DEVICE)


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


def _built(your_class, cfg, state: torch.Tensor) -> tuple:
    """``your_class(cfg)`` built from the random state ``state`` (see :func:`answering.built`), in the worker
    when ``your_class`` lives there."""
    if _remote(your_class):
        return your_class._session.request("built", your_class._ref, cfg, state)
    return answering.built(your_class, cfg, state)


def _bias_with(module, values, q_pos, k_pos, weights=None):
    """:func:`answering.bias_with`, in the worker when ``module`` lives there."""
    if _remote(module):
        return module._session.request("bias_with", module._ref, values, q_pos, k_pos, weights)
    return answering.bias_with(module, values, q_pos, k_pos, weights)


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
    or a transpose (see :func:`_as_shape`), or one of its halves (a layer split in two: ``Linear(2h, W)`` as
    one ``Linear(h, W)`` for S and one for B, both halves then taken), or zeros (the second bias of such a split
    layer). A check tries each and keeps the one that behaves like ``source``, so layers declared in another
    order, a 1×1 convolution for a linear map, a transposed weight or a split layer all pass."""
    theirs, yours = [p.detach().to(framework.CHECK_DEVICE) for p in source.parameters()], _parameter_shapes(target)
    if len(yours) < len(theirs):
        raise Wrong(
            f"{what} has {len(yours)} parameter tensors {yours}; minidape's has {len(theirs)} "
            f"{[tuple(p.shape) for p in theirs]}, so its weights cannot be handed over",
            hint="a layer without its bias (bias=False)?",
        )
    # (source index or None for zeros, which half (axis, i) or None for whole, the tensor)
    pieces = [(k, None, t) for k, t in enumerate(theirs)]
    for k, tensor in enumerate(theirs):
        for axis in range(tensor.dim() if tensor.dim() == 2 else 0):
            if tensor.shape[axis] % 2 == 0:
                pieces += [(k, (axis, i), half) for i, half in enumerate(tensor.chunk(2, axis))]
    zeros = {tuple(t.shape): torch.zeros_like(t) for t in theirs if t.dim() == 1}
    pieces += [(None, None, zero) for zero in zeros.values()]
    ways: list[list[torch.Tensor]] = []

    def complete(used: dict) -> bool:  # every parameter of theirs handed over whole, or both halves of one axis
        return all(used.get(k) in ("whole", *((a, frozenset({0, 1})) for a in (0, 1))) for k in range(len(theirs)))

    def assign(index: int, chosen: list[torch.Tensor], used: dict) -> None:
        if len(ways) >= 48:
            return
        if index == len(yours):
            if complete(used):
                ways.append(list(chosen))
            return
        for k, half, tensor in pieces:
            if k is not None and (
                used.get(k) == "whole"
                or (half is None and k in used)
                or (half is not None and k in used and (used[k][0] != half[0] or half[1] in used[k][1]))
            ):
                continue
            shaped = _as_shape(tensor, yours[index])
            if shaped is None:
                continue
            now = dict(used)
            if k is not None:
                now[k] = "whole" if half is None else (half[0], used.get(k, (half[0], frozenset()))[1] | {half[1]})
            assign(index + 1, chosen + [shaped], now)

    assign(0, [], {})
    if not ways and len(yours) > len(theirs):
        raise Wrong(
            f"{what} has {len(yours)} parameter tensors {yours}; minidape's has {len(theirs)} "
            f"{[tuple(p.shape) for p in theirs]}, so its weights cannot be handed over",
            hint="an extra layer or parameter? f has two layers, each with a weight and a bias",
        )
    if not ways:
        raise Wrong(
            f"{what}'s parameters have shapes {yours}; minidape's are {[tuple(p.shape) for p in theirs]} "
            f"and no layer of yours has the shape of one of them",
            hint="Linear(2h, W), then Linear(W, h) (or 1×1 convolutions): check the widths of your layers",
        )
    return ways


def _distinct(yours: float, theirs: float, digits: int = 6) -> tuple[str, str]:
    """Both numbers with at least ``digits`` significant digits, and as many more as it takes for two different
    numbers to read differently (a failure never shows "yours 0.655539, minidape's 0.655539")."""
    for shown in range(digits, 18):
        written = f"{yours:.{shown}g}", f"{theirs:.{shown}g}"
        if written[0] != written[1] or yours == theirs:
            return written
    return repr(yours), repr(theirs)


def _where(index: tuple[int, ...], axes: tuple[str, ...]) -> str:
    return ", ".join(f"{axis} {i}" for axis, i in zip(axes, index))


def _first_difference(
    got: torch.Tensor, want: torch.Tensor, visible: torch.Tensor | None, atol: float, rtol: float
) -> tuple[int, ...] | None:
    """The index, in the student's own tensor, of the cell that differs most (among the visible ones)."""
    excess = (got - want).abs() - atol - rtol * want.abs()
    if visible is not None:
        excess = excess.masked_fill(~visible.expand_as(excess), -math.inf)
    if excess.max() <= 0:
        return None
    return tuple(int(i) for i in torch.unravel_index(excess.argmax(), excess.shape))


def _compare(
    got,
    want: torch.Tensor,
    what: str,
    axes: tuple[str, ...],
    visible: torch.Tensor | None = None,
    mistakes: dict | None = None,
    atol: float = 1e-5,
    rtol: float = 1e-4,
) -> None:
    """Pass when ``got`` equals ``want`` (on the ``visible`` cells). Otherwise name the first known mistake whose
    output ``got`` equals — ``mistakes`` maps a description to (that mistake's output, its hint) — or the cell,
    by its named ``axes``, where the answer differs most."""
    visible = None if visible is None else visible.cpu()
    got = _tensor(got, what, tuple(want.shape), visible).detach().double().cpu()
    want = want.detach().double().cpu()
    if _first_difference(got, want, visible, atol, rtol) is None:
        return
    for description, (output, hint) in (mistakes or {}).items():
        output = output.detach().double().cpu()
        if output.shape == got.shape and _first_difference(got, output, visible, atol, rtol) is None:
            raise Wrong(f"{what}: {description}", hint=hint)
    index = _first_difference(got, want, visible, atol, rtol)
    yours, theirs = _distinct(got[index].item(), want[index].item())
    raise Wrong(f"{what} differs from minidape's at {_where(index, axes)}: yours {yours}, minidape's {theirs}")


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


def _told_apart(first: float, second: float) -> bool:
    """Whether two measurements differ by more than two honest runs of one of them may (:data:`AGREE`, the
    tolerance a check grants a run against the teacher's): only then does a run say which one is lower."""
    return abs(first - second) > AGREE * max(abs(first), abs(second)) + 0.01


def _undecided_credit(points: int, note: str) -> Credit:
    """An experiment's credit when its run cannot tell the two measurements apart: the measurement's points; the
    prediction is neither held nor missed, and earns nothing."""
    return Credit(
        points - 1,
        f"{note}: closer than two runs of the same notebook may differ ({AGREE:.0%} + 0.01), so this run "
        f"cannot say which is lower, and your prediction is not judged on it (no point for it)",
    )


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
                scores + f(SB),
                "eq. (3) adds B back: A = S + B + f([S, B]); f only learns a correction to it",
            ),
            "your refined scores are B + f([S, B]): the residual + S is missing": (
                B + f(SB),
                "eq. (3) keeps the scores: A = S + B + f([S, B])",
            ),
            "you return f([S, B]) alone, without S + B": (f(SB), "A = S + B + f([S, B]): add both residuals"),
            "f reads [B, S]: the bias channels come first": (
                scores + B + f(torch.cat([B, scores], dim=1)),
                "concatenate the scores first, then the bias: torch.cat([S, B], dim=1)",
            ),
            "f uses ReLU, not LeakyReLU(0.01)": (scores + B + f(SB, F.relu), "DAPE's f uses LeakyReLU(0.01)"),
            "f uses GELU, not LeakyReLU(0.01)": (scores + B + f(SB, F.gelu), "DAPE's f uses LeakyReLU(0.01)"),
            "f has no activation between its two layers": (
                scores + B + f(SB, lambda h: h),
                "put LeakyReLU(0.01) between the two linear layers",
            ),
        }

    def conv(x, activation=None):
        return theirs.conv2((activation or (lambda h: F.leaky_relu(h, 0.01)))(theirs.conv1(x)))

    SB = torch.cat([scores, B], dim=1)
    lower = SB.masked_fill(~mask, 0)
    return {
        "your convolution reads the future: the masked cells of [S, B] are not zeroed before it (no tril)": (
            scores + B + conv(SB),
            "zero the masked cells of [S, B] before the first convolution",
        ),
        "your refined scores are S + Conv(tril([S, B])): the residual + B is missing": (
            scores + conv(lower),
            "DAPE-V2 adds B back: A = S + B + Conv(tril([S, B]))",
        ),
        "your refined scores are B + Conv(tril([S, B])): the residual + S is missing": (
            B + conv(lower),
            "DAPE-V2 keeps the scores: A = S + B + Conv(tril([S, B]))",
        ),
        "the convolution reads [B, S]: the bias channels come first": (
            scores + B + conv(torch.cat([B, scores], 1).masked_fill(~mask, 0)),
            "concatenate the scores first, then the bias: torch.cat([S, B], dim=1)",
        ),
        "the convolutions use ReLU, not LeakyReLU(0.01)": (
            scores + B + conv(lower, F.relu),
            "DAPE-V2's Conv uses LeakyReLU(0.01) between the layers",
        ),
        "there is no activation between the two convolutions": (
            scores + B + conv(lower, lambda h: h),
            "put LeakyReLU(0.01) between the two convolutions",
        ),
    }


def _compare_refiners(your_class, name: str, what: str, **overrides) -> None:
    """Build minidape's refiner ``name`` and yours from the same config, hand yours minidape's weights (by role,
    see :func:`_hand_over`), and compare the refined scores on the cells attention may see, for fresh random
    scores and biases; a difference is named as a known mistake or located as (batch, head, query, key)."""
    from ...model import REFINER_REGISTRY

    cfg = _config(refiner=name, refiner_width=6, **overrides)  # 2h = 8 inputs, W = 6, h = 4: roles distinct
    theirs = REFINER_REGISTRY[name](cfg).to(framework.CHECK_DEVICE)
    yours = _build(your_class, cfg, what)
    generator = _fresh_generator()
    with torch.no_grad():
        for parameter in theirs.parameters():  # fresh weights, large enough to matter
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    cases = [_refiner_inputs(cfg, 2, T, generator) for T in (7, 12)]
    cases = [tuple(t.to(framework.CHECK_DEVICE) for t in case) for case in cases]
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
                _compare(
                    got,
                    want,
                    f"{what}'s refined scores (T = {T})",
                    ("batch", "head", "query", "key"),
                    visible=mask,
                    mistakes=mistakes,
                )
            return
        except Wrong as wrong:
            failure = failure or wrong
    raise failure


# ------------------------------------------------------------------ experiments: the measurement a verdict uses
# An experiment on the models a notebook trains (03-05) is judged against the teacher's reference measurement:
# `make notebooks` runs the teacher's edition with RECORD set, in full mode and in quick mode, and each such check
# writes its measurement to minidape/classroom/references.json, package data: it ships in the wheel, so a
# student's quick run anywhere (a hand-out, Colab) has it. The grader loads that file into framework.references: the
# tables a submission hands in must agree with the reference of the mode it was re-run in (an invented table does
# not), and its prediction is judged against the full-mode reference, whatever the grading mode. A notebook run in
# quick mode judges itself the same way, from the same file (see _references); in full mode it uses its own run.

RECORD = "MINIDAPE_RECORD_REFERENCES"  # a path: the teacher's edition records its measurements there
# The teacher's reference measurements (`make notebooks` writes them; the grader loads this file). The grader's
# workers never hold it: their copy of the package has only the classroom files of sandbox.censor.CLASSROOM.
TEACHER_REFERENCES = Path(__file__).resolve().parents[1] / "references.json"
AGREE = 0.25  # relative difference between two honest runs' tables (other CPUs),
# with 0.01 more for shares near 0


def _graded_in_quick_mode() -> bool:
    """Whether the grader (which loads the references) judges this answer in quick mode."""
    return framework.references is not None and _mode() == "quick"


def _mode() -> str:
    from ...utils import quick_mode

    return "quick" if quick_mode() else "full"


def _references() -> dict | None:
    """The reference measurements a verdict judges against: the grader's; in a notebook run in quick mode, the
    teacher's file the grader loads (the package's classroom/references.json), so that the notebook's own feedback
    judges a quick run's prediction exactly as the grader does (quick mode trains too little to show the effects
    the predictions are about); None (the run's own measurement) in full mode, in the grader's worker, and where
    the teacher's file is missing (a package built without it)."""
    import json

    if framework.references is not None or framework.answers is not None or _mode() != "quick":
        return framework.references
    try:
        return json.loads(TEACHER_REFERENCES.read_text())
    except (OSError, ValueError):
        return None


def _record(path: str, name: str, measured: dict) -> None:
    """Merge this run's measurement of ``name`` into the references file (written whole or not at all: a full disk
    leaves the file as it was, no partial copy beside it, and says which file)."""
    import json
    import platform

    from ...utils import atomic_path

    target = Path(path)
    try:
        recorded = json.loads(target.read_text()) if target.exists() else {}
    except json.JSONDecodeError as err:  # merged into, it would lose every other measurement: say which file
        raise ValueError(f"{target} is not whole JSON ({err.msg} at line {err.lineno}); restore or delete it") from None
    cpu = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor(),
        )
        if Path("/proc/cpuinfo").exists()
        else platform.processor()
    )
    recorded.setdefault(_mode(), {})[name] = {**measured, "_machine": cpu}
    with atomic_path(target) as partial:
        partial.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")


def _books_budget():
    """The books notebooks' budget (``notebook.books_budget``, 03-06 and 08) of the mode this answer is judged in."""
    from ..notebook import books_budget

    return books_budget(quick=_mode() == "quick")


def _budget_lengths(train_length, longest) -> None:
    """An experiment of the books notebooks (03-06) reads its table at the budget's training length and longest
    length (``notebook.books_budget`` of the mode it runs in), not at lengths the notebook was edited to use: a
    table cut to one length (``LONGEST = TRAIN_LENGTH``) measures nothing beyond the training length."""
    budget = _books_budget()
    if (train_length, longest) != (budget.train_length, budget.lengths[-1]):
        raise Wrong(
            f"your run reads its table at TRAIN_LENGTH = {train_length!r} and LONGEST = {longest!r}; the "
            f"notebook's budget ({_mode()} mode) trains at {budget.train_length} and measures up to "
            f"{budget.lengths[-1]}",
            code="lengths-not-the-budgets",
            hint="keep the notebook's settings (BUDGET, LENGTHS, LONGEST) as they are: the experiment is judged on "
            "its run",
        )


# ------------------------------------------------------------------ experiments: the grader's own measurement
# In the grader a table handed in must be the judged run's own: the grader takes the weights of the models the run
# trained (its variable `models`) as data, loads them into models it builds itself from the notebook's config, and
# measures them with its own code on its own copy of the validation split over the budget's lengths. A table typed
# in or copied from a classmate is not what the run's models measure; nothing the run redefines (minidape's or
# torch's functions, its variables) takes part in the grader's measurement.

OWN_RUN = 1e-3  # relative difference allowed between the run's table and the grader's measurement of the run's
# models: the same weights and code, another process (thread count, summation order)


def _run_models(channel, configs: dict, variable: str = "models") -> dict:
    """The judged run's trained models named in ``configs`` ({name in its dict ``variable``: the notebook's
    config}), rebuilt in the grader's process from their weights (taken as data, loaded strictly)."""
    from ...model import GPT

    def refused(why: str) -> Wrong:
        return Wrong(
            f"the grader measures the models your run trained (its variable {variable}, {sorted(configs)} as the "
            f"notebook builds them) and could not take them: {why[:300]}",
            code="run-models-missing",
            hint="keep the notebook's training cell and its models as they are: the grader measures those",
        )

    try:
        models = channel.request("variable", variable)
    except framework.StudentError as error:
        raise refused(str(error)) from None
    if not isinstance(models, dict) or not set(configs) <= set(models):
        raise refused(f"{variable} is {sorted(map(str, models)) if isinstance(models, dict) else _type_name(models)}")
    rebuilt = {}
    for name, cfg in configs.items():
        try:
            weights = models[name].state_dict()
            model = GPT(cfg)
            model.load_state_dict(weights, strict=True)
        except (framework.StudentError, NotDone, RuntimeError, TypeError, AttributeError) as error:
            raise refused(f"{variable}[{name!r}]: {error}") from None
        rebuilt[name] = model.eval()
    return rebuilt


def _validation_tokens() -> torch.Tensor:
    """The books notebooks' validation split, read by the grader itself (as their ``val_tokens``)."""
    from ...lab.data import load_corpus

    return load_corpus("austen", "val")


def _this_run(yours: dict[str, float], grader: dict[str, float], labels: dict[str, str]) -> None:
    """The table handed in is the grader's measurement of the run's own models (:data:`OWN_RUN`)."""
    for key, value in grader.items():
        if not abs(yours[key] - value) <= OWN_RUN * abs(value) + 1e-6:
            raise Wrong(
                f"your table's {labels[key]} is {yours[key]:.6g}; the models your run trained measure {value:.6g} "
                f"(the grader's own measurement of their weights)",
                code="measurement-not-this-runs",
                hint="a measurement comes from the models the notebook trains, in this run: take the numbers from "
                "its tables, never type or copy them in",
            )


def _measurement(
    name: str, measured: dict[str, float], labels: dict[str, str], agree: float = AGREE
) -> tuple[dict[str, float], str]:
    """The measurement experiment ``name``'s verdict uses, and where it comes from. ``measured``: what the check
    derived from the tables the notebook handed in; ``labels`` says in words what each entry is; ``agree``: the
    relative difference allowed from the reference (values that all lie near one value need less)."""
    import os

    if os.environ.get(RECORD):
        _record(os.environ[RECORD], name, measured)
    references = _references()
    mode = _mode()
    if references is None:  # a notebook in full mode, or in quick mode without the teacher's file (a wheel)
        return measured, "your run" if mode == "full" else (
            "your quick run, which trains too little to show this effect (the grader judges your prediction "
            "against the teacher's full-mode run)"
        )
    same_mode, full = (references.get(m, {}).get(name) for m in (mode, "full"))
    if (same_mode is None or full is None) and framework.references is None:
        return measured, "your run"  # a notebook's own run, where the teacher's file has no reference of it yet
    if same_mode is None or full is None:
        raise framework.NeedsFullMode(
            f"the teacher's edition holds no reference measurement of {name} in "
            f"{mode if same_mode is None else 'full'} mode: your teacher runs `make "
            f"notebooks` once, then grades again"
        )
    expected = {key for key in same_mode if not key.startswith("_")}
    if set(measured) != expected:  # a table cut to one entry (LONGEST = TRAIN_LENGTH) measures something else
        raise Wrong(
            f"your run's table holds {sorted(measured)}; the notebook's run measures {sorted(expected)}",
            code="measurement-not-the-notebooks",
            hint="keep the notebook's settings (lengths, models) as they are: the experiment is judged on its run",
        )
    for key, value in measured.items():
        reference = same_mode[key]
        if not abs(value - reference) <= agree * abs(reference) + 0.01 * agree / AGREE:
            raise Wrong(
                f"your run's {labels[key]} is {value:.4g}; the teacher's reference run ({mode} mode, the "
                f"same notebook) measured {reference:.4g}",
                code="measurement-not-reproduced",
                hint="a measurement comes from the models the notebook trains, as it trains them: re-run "
                "the notebook's cells unchanged and take the numbers from its tables, never type them in",
            )
    return {key: full[key] for key in measured}, "the teacher's reference run (full mode)"
