"""What each command of `python -m minidape` does, given its parsed command line (`args`, built by
`minidape.__main__`): train, eval and che here; the demo, reproduce and compare in `minidape.study`; grade in
`minidape.grade`; bench in `minidape.bench`. Each command that writes into a folder holds it (`folder_lock`)
while it works, and refuses earlier results there unless `--overwrite` (train: `--resume`)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
from pathlib import Path

import matplotlib.pyplot as plt

from . import plots
from .che import accuracy_table, train_task
from .data import corpus_to_read, load_corpus
from .evaluate import perplexity_by_length
from .model import GPTConfig
from .tasks import get_task
from .train import CHECKPOINT_NAME, checkpoint_config, load_checkpoint, read_checkpoint, train
from .utils import (RESULT_FILES, atomic_path, check_writable_folder, folder_lock, model_label, refuse_to_replace,
                    resolve_device, write_results)


def config_overrides(args: argparse.Namespace) -> dict:
    """The GPTConfig fields given on the command line (flags left unset keep the config's default)."""
    fields = {field.name for field in dataclasses.fields(GPTConfig)}
    return {name: value for name, value in vars(args).items() if name in fields}


# ----------------------------------------------------------------------------- train


def train_command(args: argparse.Namespace) -> None:
    out = check_writable_folder(args.out, "--out")
    main_process = int(os.environ.get("RANK", "0")) == 0
    with folder_lock(out) if main_process else contextlib.nullcontext():   # history.json too, under the lock
        _train_into(args, out, main_process)


def _train_into(args: argparse.Namespace, out: Path, main_process: bool) -> None:
    overrides = config_overrides(args)
    if args.resume:  # the checkpoint's config, with the flags given; train refuses any change
        checkpoint_path = out / CHECKPOINT_NAME
        cfg = dataclasses.replace(checkpoint_config(read_checkpoint(checkpoint_path), checkpoint_path), **overrides)
    else:
        cfg = GPTConfig(**overrides)
    model, history = train(cfg, args.corpus, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                           min_lr=args.min_lr, warmup=args.warmup, weight_decay=args.weight_decay,
                           grad_clip=args.grad_clip, eval_every=args.eval_every,
                           checkpoint_every=args.checkpoint_every, device=args.device, seed=args.seed,
                           compile=args.compile, out=out, resume=args.resume, overwrite=args.overwrite,
                           allow_leakage=args.allow_leakage)
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
    if args.out:      # a folder of the user's choice: never over results already there, unless --overwrite
        out = refuse_to_replace(args.out, RESULT_FILES, args.overwrite)
    else:             # the first run's own folder: its results are updated
        out = run_directory(args.checkpoints[0])
    with folder_lock(out):
        _evaluate_into(args, out)


def _evaluate_into(args: argparse.Namespace, out: Path) -> None:
    device = resolve_device(args.device)
    runs = [(path, *load_checkpoint(path, device)) for path in args.checkpoints]  # every bad file named first
    corpora = {path: _eval_corpus(path, checkpoint, args.corpus) for path, _, checkpoint in runs}
    results, train_lengths = {}, set()
    for path, model, _ in runs:
        block_size = model.cfg.block_size
        lengths = args.lengths or [block_size * factor for factor in (1, 2, 4, 8, 16)]
        label = model_label(model.cfg)
        if label in results:  # two checkpoints of the same kind: tell them apart by their run directory
            label = f"{label} ({run_directory(path).name})"
        results[label] = perplexity_by_length(model, load_corpus(corpora[path], "val"), lengths,
                                              last_k=args.last_k, protocol=args.protocol,
                                              n_windows=args.n_windows, n_tokens=args.n_tokens, seed=args.seed,
                                              progress=True)
        train_lengths.add(block_size)
    train_length = train_lengths.pop() if len(train_lengths) == 1 else None
    details = {"protocol": args.protocol, "corpus": ", ".join(sorted(set(corpora.values()))), "seed": args.seed}
    details["last_k" if args.protocol == "last_k" else "n_tokens"] = (
        args.last_k if args.protocol == "last_k" else args.n_tokens or "all")
    table = plots.write_extrapolation(out, results, train_length, "Length extrapolation", details)
    print(table)
    print(f"wrote {out / 'results.md'}, {out / 'results.json'} and {out / 'extrapolation.png'}")


# ----------------------------------------------------------------------------- che


def che_command(args: argparse.Namespace) -> None:
    task = get_task(args.task)
    fixed = [name for name in ("vocab_size", "causal", "block_size") if name in vars(args)]
    if fixed:
        raise ValueError(f"the task sets {', '.join(fixed)}; drop "
                         f"{', '.join('--' + name.replace('_', '-') for name in fixed)}")
    cfg = GPTConfig(**config_overrides(args))
    lengths = range(args.length_step, args.max_test_length + 1, args.length_step)
    if not lengths:
        raise ValueError(f"--length-step {args.length_step} exceeds --max-test-length {args.max_test_length}")
    label = model_label(cfg)
    out = refuse_to_replace(args.out or Path("runs") / "che" / f"{task.name}-{label}", RESULT_FILES, args.overwrite)
    with folder_lock(out):
        _che_into(args, out, task, cfg, label, lengths)


def _che_into(args: argparse.Namespace, out: Path, task, cfg: GPTConfig, label: str, lengths: range) -> None:
    _, history, results = train_task(task, cfg, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                                     max_train_length=args.max_train_length, test_lengths=lengths,
                                     eval_samples=args.eval_samples, device=args.device, seed=args.seed)
    table = accuracy_table({label: results}, train_length=args.max_train_length)
    settings = {key: results[key] for key in ("level", "steps", "batch_size", "lr", "max_train_length",
                                              "eval_samples", "seed", "device", "parameters", "train_seconds",
                                              "eval_seconds")}
    settings["model"] = f"{cfg.n_layer} layers, n_embd {cfg.n_embd}, {cfg.n_head} heads, {label}"
    settings["chance accuracy"] = f"{100 * task.chance_accuracy:.0f}%"
    write_results(out, f"{task.name}: accuracy (%) by input length", table, settings,
                  {**results, "history": history})
    fig = plots.plot_accuracy({label: results["accuracy"]}, train_length=args.max_train_length,
                              chance=task.chance_accuracy, title=f"{task.name} ({task.level}): {label}",
                              path=out / "accuracy.png")
    plt.close(fig)
    print(table)
    print(f"mean accuracy beyond training: {100 * results['mean_beyond_train']:.1f}% "
          f"(chance {100 * task.chance_accuracy:.0f}%)")
    print(f"wrote {out / 'results.md'}, {out / 'results.json'} and {out / 'accuracy.png'}")


# ----------------------------------------------------------------------------- the commands of other modules


def demo_command(args: argparse.Namespace) -> None:
    from .study.demo import run_demo
    run_demo(args.corpus, args.out, steps=args.steps, seed=args.seed, device=args.device, overwrite=args.overwrite)


def reproduce_command(args: argparse.Namespace) -> None:
    from .study import reproduce
    command = "python -m minidape " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["reproduce"] else None
    reproduce(budget=args.budget, seeds=args.seeds, corpora=args.corpus, out=args.out, device=args.device,
              command=command)


def compare_command(args: argparse.Namespace) -> None:
    from .study import compare
    name = args.pe.rpartition(":")[2] if ":" in args.pe else args.pe
    out = args.out or Path("runs") / "compare" / name
    compare(args.pe, refiner=args.refiner, against=tuple(args.against), seeds=args.seeds, steps=args.steps,
            corpus=args.corpus, out=out, budget=args.budget, device=args.device, overwrite=args.overwrite,
            allow_leakage=args.allow_leakage)


def grade_command(args: argparse.Namespace) -> None:
    from .grade import grade
    grade(args.paths, csv_path=args.csv, timeout=args.timeout, jobs=args.jobs, feedback=args.feedback)


def bench_command(args: argparse.Namespace, bench_args: list[str]) -> None:
    """The benchmark (`minidape.bench`) with its own flags; `--pe` and `--threads` are checked by the CLI's parser."""
    from .bench import main
    shared = (["--pe", args.pe] if args.pe is not None else []) + (
        [] if args.threads is None else ["--threads"] + ([str(args.threads)] if args.threads else []))
    main(shared + bench_args)


COMMANDS = {"demo": demo_command, "train": train_command, "eval": eval_command, "che": che_command,
            "reproduce": reproduce_command, "compare": compare_command, "grade": grade_command}
