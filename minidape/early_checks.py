"""The command line's mistakes refused once its flags are read and before anything loads torch (`refuse_before_loading`,
called by `__main__` between the parser and the command): the rules each flag alone cannot state — a config that
GPTConfig refuses, compare's models, bench's table off CUDA, grade's files and modes, a missing extra — each checked by
the package's own code where that code needs no torch (`declared.code_without_torch` runs model.py's and the
study's configuration code without it). And `flags_named`, which puts the flags' names into the API's messages."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import re
import sys

from . import declared
from .flags import CHE_SETS
from .threads import environment_threads


@functools.cache
def setting_names() -> re.Pattern:
    """The API's names of the settings a command line sets by flags, as they appear in errors: `name=value`, `name
    must`. Built at the first error, not at import: reading lab/train.py's source costs --help 0.07 s."""
    return re.compile(
        r"(?<![-\w])("
        + "|".join(
            [name for name, _, _ in declared.config_fields()]
            + list(declared.constant("lab/train.py", "RUN_SETTINGS"))
            + ["eval_every", "checkpoint_every"]
        )
        + r")(?==| must\b)"
    )


@contextlib.contextmanager
def flags_named():
    """A ValueError raised inside says `--block-size=1`, `--lr must ...` where the API's message says
    `block_size=1`, `lr must ...`: the command line's user sees the flag to change."""
    try:
        yield
    except ValueError as err:
        named = setting_names().sub(lambda name: "--" + name[1].replace("_", "-"), str(err))
        if named == str(err):
            raise
        raise ValueError(named) from err


def config_flags(args: argparse.Namespace) -> dict:
    """The GPTConfig fields given on the command line (flags left unset keep the config's default)."""
    fields = {name for name, _, _ in declared.config_fields()}
    return {name: value for name, value in vars(args).items() if name in fields}


# train's flags that `md.train` takes as they are (its `check_arguments` checks them)
TRAIN_ARGUMENTS = (
    "steps",
    "batch_size",
    "lr",
    "min_lr",
    "warmup",
    "weight_decay",
    "grad_clip",
    "eval_every",
    "checkpoint_every",
    "seed",
)


def refuse_before_loading(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """The rules that need no torch, checked before any loads, so that a mistake answers at once: train's own rule
    of `--block-size`; the config `train` (a new run: a resumed one takes its checkpoint's) and `che` build from
    their flags checked by GPTConfig's own code, run without torch (`declared.check_config`): a per-layer `--pe`
    longer than `--n-layer`, an unknown `@` option, fields that do not go together; compare's models
    (`_refuse_compare_models`); bench's `--bias-table` off CUDA; grade's and handout's extra, and the files grade is
    given; and the rules of train's settings, a device's name, a corpus's or a checkpoint's file, the seeds of a
    study, and the environment's variables of quick mode, threads and the compiled kernel."""
    declared.code_without_torch("utils.py")["quick_mode"]()  # MINIDAPE_QUICK's value, whatever the command
    declared.code_without_torch("native.py")["enabled"]()  # MINIDAPE_NATIVE's
    environment_threads()  # MINIDAPE_THREADS's and OMP_NUM_THREADS's values
    if args.command == "train" and getattr(args, "causal", True) and getattr(args, "block_size", 2) < 2:
        parser.error(
            f"--block-size {args.block_size} is too short for a language model: it must be >= 2, so that a window "
            "holds a token and the next one to predict"
        )
    fixed = [name for name in CHE_SETS if args.command == "che" and name in vars(args)]
    if fixed:
        raise ValueError(
            f"the task sets {', '.join(fixed)}; drop {', '.join('--' + name.replace('_', '-') for name in fixed)}"
        )
    settings = {name: getattr(args, name) for name in TRAIN_ARGUMENTS} if args.command == "train" else {}
    if any(value is not None for value in settings.values()):  # none given: train's defaults
        with flags_named():
            declared.code_without_torch("lab/train.py")["check_arguments"](**settings, optimizer=None, metrics=None)
    if args.command == "che" or args.command == "train" and not args.resume:
        try:
            with flags_named():
                declared.check_config(config_flags(args))
        except ValueError as err:
            parser.error(" ".join(str(err).split()))
    _refuse_missing_files_and_devices(args)
    if args.command in ("compare", "reproduce"):
        declared.code_without_torch("study/runs.py")["check_seeds"](args.seeds)
    if args.command == "reproduce":
        declared.code_without_torch("study/runs.py")["check_corpora"](args.corpus)
    if args.command == "compare":
        _refuse_compare_models(args, parser)
    if args.command == "bench" and args.bias_table and args.device.partition(":")[0] in ("cpu", "mps"):
        parser.error(
            f"--bias-table compares FlexAttention with SDPA, which runs on CUDA only; got --device {args.device} "
            "(give --device cuda, cuda:N, or auto on a machine with CUDA)"
        )
    if args.command == "handout":
        require("handing out", ("jupytext", "nbformat"), "grade")
    if args.command == "grade":
        _refuse_grade_files(args)


def _refuse_missing_files_and_devices(args: argparse.Namespace) -> None:
    """`--device` an unknown kind, `--corpus` a file that is not there (or a folder, or no regular file), a
    checkpoint `eval` or `train --resume` reads that is not there, with the words of the functions that check them
    once torch has loaded (utils.py's `device_kind`, lab/data.py's `corpus_file`, lab/checkpoints.py's
    `checkpoint_file`), run without it. Whether the device is there is for torch to say."""
    if getattr(args, "device", None) is not None:  # every command but grade and handout
        declared.code_without_torch("utils.py")["device_kind"](args.device)
    corpora = getattr(args, "corpus", None)  # reproduce takes several
    for corpus in [corpora] if isinstance(corpora, str) else corpora or ():
        declared.code_without_torch("lab/data.py")["corpus_file"](corpus)
    code = declared.code_without_torch("lab/checkpoints.py")
    resumed = [os.path.join(args.out, code["CHECKPOINT_NAME"])] if getattr(args, "resume", False) else []
    for checkpoint in args.checkpoints if args.command == "eval" else resumed:
        code["checkpoint_file"](checkpoint)


def _refuse_compare_models(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """compare's models (`--pe`, `--against`) and the budget its flags make, checked by compare's own code run
    without torch (`declared.code_without_torch`: comparison.py's `study_budget` and `parse_model`, budgets.py's
    `lm_config`, GPTConfig): an unknown encoding or refiner, a bad refiner option, a per-layer spec longer than the
    model, `--lengths` that do not fit the training length. The budget depends on the device (CUDA's builds larger
    models): with --device auto a model is refused here only when the budgets of both would refuse it, else compare
    decides once the device is known. A user's file (`--import`, or a model written FILE.py:ClassName) may register
    names of its own: then compare checks every model itself, once the file has run."""
    if "minidape.model" in sys.modules:  # a user's --import has loaded the model: its registry is compare's
        return
    import types

    code = declared.code_without_torch("study/comparison.py")
    kind = args.device.partition(":")[0]
    devices = [types.SimpleNamespace(type=name) for name in (("cpu", "cuda") if kind == "auto" else (kind,))]
    knobs = dict(steps=args.steps, batch_size=args.batch_size, lr=args.lr, n_layer=args.n_layer)
    knobs.update(n_embd=args.n_embd, n_head=args.n_head, train_length=args.train_length, lengths=args.lengths)
    models = [("--pe", args.pe)] + [("--against", spec) for spec in args.against]
    parsed, mistakes = [], []
    for flag, spec in models:
        try:
            parsed.append((flag, spec, code["parse_model"](spec)[1]))
        except NameError:  # a model written FILE.py:ClassName: registering it needs the user's file and torch
            return
        except ValueError as err:
            mistakes.append(f"{flag}: {' '.join(str(err).split())}")
    if mistakes:
        parser.error(mistakes[0])
    code["check_margin"](args.margin / 100)
    _, compared = code["compared_models"](args.pe, args.against)  # refused without a baseline other than --pe
    runs = len(compared) * args.seeds  # compare's plan: each model once, every seed
    if isinstance(args.step, int) and not 0 <= args.step < runs:
        parser.error(f"--run {args.step} is not in the list: valid runs are 0 to {runs - 1} (see --list-runs)")
    refusals = []  # per device, the first mistake its budget finds
    for device in devices:
        try:
            settings = code["study_budget"](args.budget, device, **knobs)
            for flag, spec, overrides in parsed:
                try:
                    code["lm_config"](settings, settings.train_lengths[0], overrides)
                except ValueError as err:
                    raise ValueError(f"{flag} {spec!r}: {err}") from err
        except ValueError as err:
            refusals.append(" ".join(str(err).split()))
    if len(refusals) == len(devices):  # every device this command line may run on refuses it
        parser.error(refusals[0] + ("" if len(set(refusals)) == 1 else " (the CPU's budget; CUDA's refuses it too)"))


def require(doing: str, modules: tuple[str, ...], extra: str) -> None:
    """A one-line error naming the modules `doing` needs that are not installed, and the extra that installs them
    (not the traceback of the first import that fails: one installed without what it needs fails too)."""
    import importlib

    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise ValueError(
            f"{doing} needs {' and '.join(missing)}, not installed here: pip install 'minidape[{extra}]' "
            f"(from a clone of minidape, whose notebooks/ is the teacher's edition: pip install -e "
            f"'.[{extra}]')"
        )


# What grading needs beyond minidape's own dependencies (the `grade` extra): jupytext reads the teacher's notebooks,
# IPython's display is what the notebooks show results with.
GRADE_NEEDS = ("jupytext", "IPython")


def _refuse_grade_files(args: argparse.Namespace) -> None:
    """How grade's modes go together, the files it is given and its extra, before torch loads (the checks load it):
    a path that is not there, not a notebook or a folder holding none (`collect.submissions`, the grader's own
    reading of what was handed in), a `--csv` or `--feedback` that cannot be written, a grades file `--merge` or
    `--gradebook` names that is not there; then the
    extra, whose import takes 1.2 s (jupytext), so that a mistaken path answers before it."""
    if args.merge:  # one gradebook for the course from its batches, nothing graded again
        if args.paths or not args.csv or args.gradebook:
            raise ValueError("--merge FILE... writes one gradebook: give --csv COURSE, and no notebooks or --gradebook")
        missing = [path for path in args.merge if not os.path.isfile(path)]
        if missing:
            raise FileNotFoundError(f"--merge {missing[0]}: no such grades file (write it with grade --csv FILE)")
    elif args.gradebook is not None:  # the teacher's marks folded in, nothing graded again
        if args.paths or args.csv:
            raise ValueError(
                "--gradebook FILE rebuilds the gradebook of an earlier grade --csv FILE: give no "
                "notebooks and no --csv with it"
            )
        if not os.path.isfile(args.gradebook):  # before its lock file is made beside it
            raise FileNotFoundError(
                f"--gradebook {args.gradebook}: no such grades file (write it with grade --csv {args.gradebook})"
            )
    elif not args.paths:
        raise ValueError("grade needs notebooks or folders to grade (or --gradebook FILE)")
    else:
        from .classroom.collect import submissions
        from .classroom.gradebook import check_output_paths

        submissions(args.paths)
        check_output_paths(args.csv, args.feedback)
    require("grading", GRADE_NEEDS, "grade")
