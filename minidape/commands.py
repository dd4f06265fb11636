"""What each command of `python -m minidape` does, given its parsed command line (`args`, built by
`minidape.__main__`): train, eval and che here; the demo, reproduce and compare in `minidape.study`; grade in
`minidape.classroom.grade`; bench in `minidape.lab.bench`. Each command that writes into a folder holds it
(`folder_lock`) while it works, and refuses earlier results there unless `--overwrite` (train: `--resume`)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import os
import shlex
import sys
from pathlib import Path

import matplotlib.pyplot as plt

from .flags import config_flags, flags_named
from .lab import plots
from .lab.che import accuracy_table, train_task
from .lab.checkpoints import CHECKPOINT_NAME, checkpoint_config, load_checkpoint, read_checkpoint
from .lab.data import corpus_to_read, load_corpus
from .lab.evaluate import perplexity_by_length
from .lab.tasks import get_task
from .lab.train import train
from .model import GPTConfig
from .utils import (
    RESULT_FILES,
    atomic_path,
    check_writable_folder,
    folder_lock,
    model_label,
    refuse_to_replace,
    resolve_device,
    write_results,
)

# ----------------------------------------------------------------------------- train


def train_command(args: argparse.Namespace) -> None:
    out = check_writable_folder(args.out, "--out")
    main_process = int(os.environ.get("RANK", "0")) == 0
    with folder_lock(out) if main_process else contextlib.nullcontext(), flags_named():  # history.json under the lock
        _train_into(args, out, main_process)


def _train_into(args: argparse.Namespace, out: Path, main_process: bool) -> None:
    overrides = config_flags(args)
    if args.resume:  # the checkpoint's config, with the flags given; train refuses any change
        checkpoint_path = out / CHECKPOINT_NAME
        cfg = dataclasses.replace(checkpoint_config(read_checkpoint(checkpoint_path), checkpoint_path), **overrides)
    else:
        cfg = GPTConfig(**overrides)
    model, history = train(
        cfg,
        args.corpus,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        min_lr=args.min_lr,
        warmup=args.warmup,
        weight_decay=args.weight_decay,
        grad_clip=args.grad_clip,
        eval_every=args.eval_every,
        checkpoint_every=args.checkpoint_every,
        device=args.device,
        seed=args.seed,
        compile=args.compile,
        out=out,
        resume=args.resume,
        overwrite=args.overwrite,
        allow_leakage=args.allow_leakage,
    )
    if main_process:
        with atomic_path(out / "history.json") as tmp:
            tmp.write_text(json.dumps(history, indent=1) + "\n")
        last = history[-1]
        val = f", val loss {last['val_loss']:.4f}" if "val_loss" in last else ""
        print(f"{model_label(cfg)}: step {last['step']}, loss {last['loss']:.4f}{val} -> {out / CHECKPOINT_NAME}")


# ----------------------------------------------------------------------------- eval


def run_directory(checkpoint_path: str | os.PathLike) -> Path:
    """The run directory of a checkpoint given as a file (its folder) or as the directory itself."""
    path = Path(checkpoint_path).resolve()
    return path if path.is_dir() else path.parent


def run_labels(paths: list[str], models: list) -> list[str]:
    """One distinct label per checkpoint: the model's (`model_label`), and where models of one kind meet, each
    followed by the shortest end of its path that tells it apart (`alibi (a/run)`, `alibi (b/run)`; a file
    named checkpoint.pt stands for its folder). The same checkpoint given twice is a ValueError."""
    files = [Path(path).resolve() / CHECKPOINT_NAME if Path(path).is_dir() else Path(path).resolve() for path in paths]
    seen = {}
    for path, file in zip(paths, files):
        if file in seen:
            raise ValueError(f"eval: {file} given twice (as {seen[file]!r} and {path!r}); give each run once")
        seen[file] = path
    names = [file.parent.parts if file.name == CHECKPOINT_NAME else file.parent.parts + (file.stem,) for file in files]
    kinds = [model_label(model.cfg) for model in models]
    labels = []
    for kind, name in zip(kinds, names):
        alike = [other for other_kind, other in zip(kinds, names) if other_kind == kind]
        if len(alike) == 1:
            labels.append(kind)
            continue
        depth = next(
            depth for depth in range(1, len(name) + 1) if sum(other[-depth:] == name[-depth:] for other in alike) == 1
        )
        labels.append(f"{kind} ({'/'.join(name[-depth:])})")
    return labels


def _eval_corpus(path: str, checkpoint: dict, corpus: str | None) -> str:
    """The corpus to score a checkpoint on: `--corpus` when given, else the one it was trained on, checked to
    be the same file as then."""
    if corpus is not None:
        return corpus
    recorded = checkpoint.get("corpus")
    if recorded is None:
        raise ValueError(f"{path} was trained on data given as a tensor, not a corpus; pass --corpus")
    return corpus_to_read(recorded, None, f"eval of {path}")


def eval_command(args: argparse.Namespace) -> None:
    if args.out:  # a folder of the user's choice: never over results already there, unless --overwrite
        out = refuse_to_replace(args.out, RESULT_FILES, args.overwrite)
    else:  # the first run's own folder: its results are updated
        out = run_directory(args.checkpoints[0])
    with folder_lock(out):
        _evaluate_into(args, out)


def _evaluate_into(args: argparse.Namespace, out: Path) -> None:
    device = resolve_device(args.device)
    runs = [(path, *load_checkpoint(path, device)) for path in args.checkpoints]  # every bad file named first
    corpora = {path: _eval_corpus(path, checkpoint, args.corpus) for path, _, checkpoint in runs}
    texts = {corpus: load_corpus(corpus, "val") for corpus in set(corpora.values())}
    for path, model, _ in runs:  # before any evaluation: a model that cannot read its corpus, both named
        tokens = texts[corpora[path]]
        if len(tokens) and int(tokens.max()) >= model.cfg.vocab_size:
            raise ValueError(
                f"{path} reads tokens below vocab_size={model.cfg.vocab_size}, but corpus {corpora[path]}'s "
                f"validation split holds tokens up to {int(tokens.max())}: evaluate it on a corpus within its "
                f"vocabulary (the one it was trained on: leave out --corpus)"
            )
    for path, model, _ in runs:  # trained with --no-causal --allow-leakage: flagged wherever it is evaluated
        if not model.cfg.causal:
            print(
                f"warning: {path} is an encoder (causal=False): each position sees the token it predicts, so its "
                f"perplexities do not measure language modelling (a leakage experiment)",
                file=sys.stderr,
            )
    results, train_lengths = {}, set()
    labels = run_labels([path for path, _, _ in runs], [model for _, model, _ in runs])
    for (path, model, _), label in zip(runs, labels):
        block_size = model.cfg.block_size
        lengths = args.lengths or [block_size * factor for factor in (1, 2, 4, 8, 16)]
        results[label] = perplexity_by_length(
            model,
            texts[corpora[path]],
            lengths,
            last_k=args.last_k,
            protocol=args.protocol,
            n_windows=args.n_windows,
            n_tokens=args.n_tokens,
            seed=args.seed,
            progress=True,
        )
        train_lengths.add(block_size)
    train_length = train_lengths.pop() if len(train_lengths) == 1 else None
    details = {"protocol": args.protocol, "corpus": ", ".join(sorted(set(corpora.values()))), "seed": args.seed}
    details["last_k" if args.protocol == "last_k" else "n_tokens"] = (
        args.last_k if args.protocol == "last_k" else args.n_tokens or "all"
    )
    table = plots.write_extrapolation(out, results, train_length, "Length extrapolation", details)
    print(table)
    print(f"wrote {out / 'results.md'}, {out / 'results.json'} and {out / 'extrapolation.png'}")


# ----------------------------------------------------------------------------- che


def che_command(args: argparse.Namespace) -> None:
    task = get_task(args.task)  # the flags the task sets were refused before loading (flags.refuse_before_loading)
    with flags_named():
        cfg = GPTConfig(**config_flags(args))
    lengths = range(args.length_step, args.max_test_length + 1, args.length_step)
    if not lengths:
        raise ValueError(f"--length-step {args.length_step} exceeds --max-test-length {args.max_test_length}")
    label = model_label(cfg)
    out = refuse_to_replace(args.out or Path("runs") / "che" / f"{task.name}-{label}", RESULT_FILES, args.overwrite)
    with folder_lock(out), flags_named():
        _che_into(args, out, task, cfg, label, lengths)


def _che_into(args: argparse.Namespace, out: Path, task, cfg: GPTConfig, label: str, lengths: range) -> None:
    _, history, results = train_task(
        task,
        cfg,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        max_train_length=args.max_train_length,
        test_lengths=lengths,
        eval_samples=args.eval_samples,
        device=args.device,
        seed=args.seed,
    )
    table = accuracy_table({label: results}, train_length=args.max_train_length)
    settings = {
        key: results[key]
        for key in (
            "level",
            "steps",
            "batch_size",
            "lr",
            "max_train_length",
            "eval_samples",
            "seed",
            "device",
            "parameters",
            "train_seconds",
            "eval_seconds",
        )
    }
    settings["model"] = f"{cfg.n_layer} layers, n_embd {cfg.n_embd}, {cfg.n_head} heads, {label}"
    settings["chance accuracy"] = f"{100 * task.chance_accuracy:.0f}%"
    fig = plots.plot_accuracy(
        {label: results["accuracy"]},
        train_length=args.max_train_length,
        chance=task.chance_accuracy,
        title=f"{task.name} ({task.level}): {label}",
    )
    try:
        write_results(
            out,
            f"{task.name}: accuracy (%) by input length",
            table,
            settings,
            {**results, "history": history},
            figures={"accuracy.png": plots.figure_writer(fig, "accuracy.png")},
        )
    finally:
        plt.close(fig)
    print(table)
    print(
        f"mean accuracy beyond training: {100 * results['mean_beyond_train']:.1f}% "
        f"(chance {100 * task.chance_accuracy:.0f}%)"
    )
    print(f"wrote {out / 'results.md'}, {out / 'results.json'} and {out / 'accuracy.png'}")


# ----------------------------------------------------------------------------- the commands of other modules


def demo_command(args: argparse.Namespace) -> None:
    from .study.demo import run_demo

    run_demo(args.corpus, args.out, steps=args.steps, seed=args.seed, device=args.device, overwrite=args.overwrite)


def reproduce_command(args: argparse.Namespace) -> None:
    from .study import reproduce

    command = "python -m minidape " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["reproduce"] else None
    result = reproduce(
        budget=args.budget,
        seeds=args.seeds,
        corpora=args.corpus,
        out=args.out,
        device=args.device,
        command=command,
        rerun=args.rerun,
        step=args.step,
        progress=args.step != "list",
    )
    print_run_lines(args, result)


def print_run_lines(args: argparse.Namespace, result: dict) -> None:
    """``--list-runs``: one line per run, a shell command that trains and evaluates that run alone (this command
    line with ``--run N``, run from this folder by this Python), its name after a ``#``."""
    if args.step != "list":
        return
    # argparse took any unambiguous prefix of --list-runs (--list): left in, every line would be refused
    listing = [arg for arg in args.argv if len(arg) > 2 and "--list-runs".startswith(arg)]
    command = shlex.join([sys.executable, "-m", "minidape", *(arg for arg in args.argv if arg not in listing)])
    for number, name in enumerate(result["runs"]):
        print(f"cd {shlex.quote(os.getcwd())} && {command} --run {number}  # {name}")


def compare_command(args: argparse.Namespace) -> None:
    from .study import compare, parse_model
    from .study.runs import slug

    out = args.out or Path("runs") / "compare" / slug(parse_model(args.pe)[0])
    result = compare(
        args.pe,
        against=tuple(args.against),
        seeds=args.seeds,
        corpus=args.corpus,
        out=out,
        budget=args.budget,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        n_layer=args.n_layer,
        n_embd=args.n_embd,
        n_head=args.n_head,
        train_length=args.train_length,
        lengths=args.lengths,
        margin=args.margin / 100,
        device=args.device,
        overwrite=args.overwrite,
        rerun=args.rerun,
        keep_checkpoints=args.keep_checkpoints,
        allow_leakage=args.allow_leakage,
        step=args.step,
        progress=args.step != "list",
    )
    print_run_lines(args, result)


def handout_command(args: argparse.Namespace) -> None:
    require("handing out", ("jupytext", "nbformat"), "grade")
    from .classroom.handout import handout

    out = handout(args.out, args.notebooks)
    print(
        f"wrote the hand-out to {out}: {len(list(out.glob('notebooks/*.ipynb')))} notebooks, "
        f"{next(out.glob('*.whl')).name}, README.md"
    )


# What grading needs beyond minidape's own dependencies (the `grade` extra): jupytext reads the teacher's notebooks,
# IPython's display is what the notebooks show results with.
GRADE_NEEDS = ("jupytext", "IPython")


def require(doing: str, modules: tuple[str, ...], extra: str) -> None:
    """A one-line error naming the modules `doing` needs that are not installed, and the extra that installs them
    (not the traceback of the first import that fails)."""
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


def grade_command(args: argparse.Namespace) -> None:
    require("grading", GRADE_NEEDS, "grade")
    from .classroom import gradebook
    from .classroom.grade import grade

    if args.merge:  # one gradebook for the course from its batches, nothing graded again
        if args.paths or not args.csv or args.gradebook:
            raise ValueError("--merge FILE... writes one gradebook: give --csv COURSE, and no notebooks or --gradebook")
        missing = [path for path in args.merge if not Path(path).is_file()]
        if missing:
            raise FileNotFoundError(f"--merge {missing[0]}: no such grades file (write it with grade --csv FILE)")
        with gradebook.held(args.csv, args.overwrite) as entered:
            gradebook.merge(args.merge, args.csv, entered)
        print(f"wrote {args.csv}, {gradebook.written_path(args.csv)} and its gradebook from {', '.join(args.merge)}")
        return
    if args.gradebook is not None:  # the teacher's marks folded in, nothing graded again
        if args.paths or args.csv:
            raise ValueError(
                "--gradebook FILE rebuilds the gradebook of an earlier grade --csv FILE: give no "
                "notebooks and no --csv with it"
            )
        if not Path(args.gradebook).is_file():  # before its lock file is made beside it
            raise FileNotFoundError(
                f"--gradebook {args.gradebook}: no such grades file (write it with grade --csv {args.gradebook})"
            )
        with gradebook.held(args.gradebook, overwrite=True):
            written = gradebook.gradebook(args.gradebook)
        print(
            f"wrote {', '.join(map(str, written))} from {args.gradebook} and {gradebook.written_path(args.gradebook)}"
        )
        return
    if not args.paths:
        raise ValueError("grade needs notebooks or folders to grade (or --gradebook FILE)")
    grade(
        args.paths,
        csv_path=args.csv,
        timeout=args.timeout,
        jobs=args.jobs,
        feedback=args.feedback,
        overwrite=args.overwrite,
    )


def bench_command(args: argparse.Namespace) -> None:
    """The benchmark (`lab.bench`), its flags read by the command line's parser (`flags`)."""
    from .lab.bench import benchmark

    benchmark(args)


COMMANDS = {
    "demo": demo_command,
    "train": train_command,
    "eval": eval_command,
    "che": che_command,
    "reproduce": reproduce_command,
    "compare": compare_command,
    "grade": grade_command,
    "handout": handout_command,
}
