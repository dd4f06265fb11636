"""Command line: `python -m minidape {demo,train,eval,che,bench} ...` (`--help` on each for its flags).

    python -m minidape demo                                  # 7 PEs/refiners, trained and compared
    python -m minidape train --pe alibi --steps 2000 --out runs/alibi
    python -m minidape train --steps 4000 --out runs/alibi --resume
    python -m minidape eval runs/alibi/checkpoint.pt runs/rope/checkpoint.pt --lengths 128 512 2048
    python -m minidape che --task reverse_string --pe kerple_log --refiner dape --steps 2000
    python -m minidape train --import my_bias.py --pe my_bias --out runs/mine   # a bias of your own

Every `GPTConfig` field is a `train` flag (`--n-layer`, `--pe`, `--refiner`, ...), read from the dataclass
itself, so a field added to the model is a flag without touching this file. Every command takes
`--import FILE.py` (repeatable): the file runs first, so the PEs and refiners it registers are valid choices.
A mistake in the command line is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import runpy
import sys
import time
import typing
from pathlib import Path

import matplotlib.pyplot as plt
import torch

from . import plots
from .che import accuracy_table, train_task
from .data import check_corpus, load_corpus
from .evaluate import PROTOCOLS, perplexity_by_length
from .model import PE_NAMES, REFINER_NAMES, GPTConfig
from .tasks import TASK_NAMES, get_task
from .train import CHECKPOINT_NAME, checkpoint_config, load_checkpoint, read_checkpoint, train
from .utils import (DEVICE_CHOICES, RESULT_FILES, atomic_path, check_writable_folder, fast_mode, folder_lock,
                    import_file, model_label, refuse_to_replace, resolve_device, write_results)

# The demo's models: (name, GPTConfig overrides). Kerple-log is the bias both refiners build on.
DEMO_MODELS = (
    ("NoPE", {"pe": "none"}),
    ("RoPE", {"pe": "rope"}),
    ("ALiBi", {"pe": "alibi"}),
    ("Kerple-log", {"pe": "kerple_log"}),
    ("FIRE", {"pe": "fire"}),
    ("DAPE-Kerple", {"pe": "kerple_log", "refiner": "dape"}),
    ("conv-Kerple", {"pe": "kerple_log", "refiner": "conv"}),
)
DEMO_TRAIN_LENGTH = 128
DEMO_LAST_K = 256            # DAPE's k; the demo's shortest length (128) caps it


@dataclasses.dataclass(frozen=True)
class DemoBudget:
    """Model size, training and evaluation budget of the demo on one kind of machine."""

    n_layer: int
    n_embd: int
    n_head: int
    steps: int
    batch_size: int
    lr: float
    eval_lengths: tuple[int, ...]
    eval_windows: int


# CPU: about half a minute of training per model on 2 cores, so the 7 models and their evaluation fit in 10 min.
# 32 windows: last_k scores the same 32 x 128 = 4,096 tokens at every length.
CPU_BUDGET = DemoBudget(n_layer=2, n_embd=64, n_head=4, steps=500, batch_size=16, lr=3e-3,
                        eval_lengths=(128, 256, 512, 1024, 2048), eval_windows=32)
CUDA_BUDGET = DemoBudget(n_layer=4, n_embd=256, n_head=8, steps=4000, batch_size=64, lr=1e-3,
                         eval_lengths=(128, 256, 512, 1024, 2048, 4096, 8192), eval_windows=32)
# MINIDAPE_FAST=1 (tests, CI): the same code paths with a token budget.
FAST_BUDGET = dataclasses.replace(CPU_BUDGET, steps=4, batch_size=4, eval_windows=2)



# ----------------------------------------------------------------------------- argument parsing


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: a mistake is named on one line of stderr (exit code 2), not under a usage
    block that for `train` lists every config flag."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


def _imported_files(argv: list[str]) -> list[str]:
    """The `--import FILE.py` values of a command line, read before the full parser is built so that the names
    they register are among the choices of `--pe` and `--refiner`."""
    early = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    early.add_argument("--import", dest="imports", action="append", default=[])
    return early.parse_known_args(argv)[0].imports


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per GPTConfig field, typed from its annotation; unset flags keep the config's default."""
    hints = typing.get_type_hints(GPTConfig)
    choices = {"pe": PE_NAMES, "refiner": REFINER_NAMES}
    group = parser.add_argument_group("model (GPTConfig fields)")
    for field in dataclasses.fields(GPTConfig):
        kind = hints[field.name]
        flags = [f"--{field.name.replace('_', '-')}"] + ([f"--{field.name}"] if "_" in field.name else [])
        options = {"dest": field.name, "default": argparse.SUPPRESS, "help": f"default {field.default!r}"}
        if kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        else:
            options["type"] = kind
            if field.name in choices:
                options["choices"] = list(choices[field.name])
        group.add_argument(*flags, **options)


def _add_device_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", help=f"{', '.join(DEVICE_CHOICES)} or cuda:N (default auto: "
                                                        "CUDA, then MPS, then CPU)")


def add_command(commands, name: str, **options) -> argparse.ArgumentParser:
    """A subcommand with the flag every command takes: `--import FILE.py`, repeatable."""
    command = commands.add_parser(name, **options)
    command.add_argument("--import", dest="imports", action="append", default=[], metavar="FILE.py",
                         help="run this Python file first, so the PEs/refiners it registers can be used "
                              "(repeatable)")
    return command


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m minidape", description=__doc__.split("\n\n")[0],
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    demo = add_command(commands, "demo", help="train 7 PEs/refiners at length 128 and compare their extrapolation",
                       description="Train NoPE, RoPE, ALiBi, Kerple-log, FIRE, DAPE-Kerple and conv-Kerple at "
                                   "length 128, evaluate each up to 16x that length (last-256-tokens protocol), "
                                   "write results.md, results.json and extrapolation.png. Budget: CPU ~10 min; "
                                   "larger on CUDA; tiny with MINIDAPE_FAST=1.")
    demo.add_argument("--corpus", default="austen", help="corpus name or .txt/.gz path (default austen)")
    demo.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    demo.add_argument("--overwrite", action="store_true", help="replace an earlier demo in OUT")
    demo.add_argument("--steps", type=positive_int, help="training steps per model (default: the machine's budget)")
    demo.add_argument("--seed", type=int, default=0)
    _add_device_flag(demo)

    train_cmd = add_command(commands, "train", help="train one model",
                            description="Train one GPT; every GPTConfig field is a flag. Writes OUT/checkpoint.pt "
                                        "and OUT/history.json.")
    _add_config_flags(train_cmd)
    run = train_cmd.add_argument_group("training")
    run.add_argument("--corpus", help="corpus name or .txt/.gz path (default austen; on --resume the "
                                      "checkpoint's corpus)")
    run.add_argument("--steps", type=positive_int, default=1000, help="total optimizer steps (default 1000)")
    run.add_argument("--batch-size", type=positive_int, default=32,
                     help="sequences per step (per process under DDP)")
    run.add_argument("--lr", type=positive_float, default=1e-3, help="peak learning rate (default 1e-3)")
    run.add_argument("--min-lr", type=float, help="final learning rate of the cosine (default lr/10)")
    run.add_argument("--warmup", type=int, help="linear warmup steps (default 5%% of steps)")
    run.add_argument("--weight-decay", type=float, default=0.1)
    run.add_argument("--grad-clip", type=float, default=1.0, help="gradient norm clip, 0 disables (default 1)")
    run.add_argument("--eval-every", type=positive_int, help="steps between validation losses (default steps/10)")
    run.add_argument("--checkpoint-every", type=positive_int,
                     help="steps between checkpoints (default: at the end only)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--compile", action="store_true", help="torch.compile the model")
    run.add_argument("--out", required=True, help="run directory for checkpoint.pt and history.json")
    again = run.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    again.add_argument("--overwrite", action="store_true", help="replace the checkpoint in OUT with a new run")
    run.add_argument("--allow-leakage", action="store_true",
                     help="train a decoder that reads the future (refused otherwise): a deliberate leakage experiment")
    _add_device_flag(run)

    evaluate = add_command(commands, "eval", help="perplexity by length of checkpoints: table + plot",
                           description="Evaluate checkpoints at several lengths; print a markdown table and write "
                                       "results.md, results.json and extrapolation.png.")
    evaluate.add_argument("checkpoints", nargs="+", help="checkpoint files (or run directories)")
    evaluate.add_argument("--lengths", type=positive_int, nargs="+",
                          help="evaluation lengths (default: training length x 1, 2, 4, 8, 16)")
    evaluate.add_argument("--protocol", choices=PROTOCOLS, default="last_k")
    evaluate.add_argument("--last-k", type=positive_int, default=256,
                          help="tokens scored per window with last_k (at most the shortest length; default 256)")
    evaluate.add_argument("--n-windows", type=positive_int, default=32,
                          help="windows per length with last_k, the same scored tokens at every length (default 32)")
    evaluate.add_argument("--n-tokens", type=positive_int,
                          help="predictions scored with nonoverlap (default: all of the validation split)")
    evaluate.add_argument("--corpus", help="corpus whose val split is scored (default: the checkpoint's, "
                                           "refused if its file has changed)")
    evaluate.add_argument("--out", help="directory for the results (default: the first checkpoint's)")
    evaluate.add_argument("--overwrite", action="store_true", help="replace results already in --out")
    evaluate.add_argument("--seed", type=int, default=0)
    _add_device_flag(evaluate)

    che = add_command(commands, "che", help="train and test an encoder on a Chomsky-hierarchy task",
                      description="Train an encoder on one CHE task with input lengths drawn from "
                                  "U(1, max-train-length), test it at longer lengths, print a table and write "
                                  "results.md, results.json and accuracy.png. The task sets vocab_size, "
                                  "causal=False and block_size; the other GPTConfig fields are flags.")
    che.add_argument("--task", required=True, choices=TASK_NAMES, metavar="TASK",
                     help=f"one of: {', '.join(TASK_NAMES)}")
    _add_config_flags(che)
    run = che.add_argument_group("training and test")
    run.add_argument("--steps", type=positive_int, default=1000,
                     help="Adam steps, one input length each (default 1000)")
    run.add_argument("--batch-size", type=positive_int, default=32)
    run.add_argument("--lr", type=positive_float, default=1e-3, help="peak learning rate (default 1e-3)")
    run.add_argument("--max-train-length", type=positive_int, default=40, help="longest training input (default 40)")
    run.add_argument("--max-test-length", type=positive_int, default=500, help="longest test input (default 500)")
    run.add_argument("--length-step", type=positive_int, default=10,
                     help="test the lengths step, 2*step, ... up to --max-test-length (default 10; 1 tests "
                          "every length, as the papers do)")
    run.add_argument("--eval-samples", type=positive_int, default=64, help="test sequences per length (default 64)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--out", help="output directory (default runs/che/TASK-MODEL)")
    run.add_argument("--overwrite", action="store_true", help="replace earlier results in OUT")
    _add_device_flag(run)

    bench = add_command(commands, "bench", add_help=False,
                        help="refiner speed and memory benchmark (benchmarks/bench_refiners.py; its flags: "
                             "bench --help)")
    bench.add_argument("--pe", choices=list(PE_NAMES), help=argparse.SUPPRESS)
    add_grade_command(commands)
    add_study_commands(commands)
    return parser


# ----------------------------------------------------------------------------- outputs


def run_directory(checkpoint_path: str | os.PathLike) -> Path:
    """The run directory of a checkpoint given as a file (its folder) or as the directory itself."""
    path = Path(checkpoint_path).resolve()
    return path if path.is_dir() else path.parent


def write_extrapolation(out: Path, results: dict[str, dict[int, float]], train_length: int | None, title: str,
                        details: dict) -> str:
    """results.md, results.json and extrapolation.png of perplexity curves; returns the markdown table."""
    table = plots.markdown_table(results, train_length=train_length)
    write_results(out, title, f"Perplexity by evaluation length (lower is better).\n\n{table}", details,
                  {"results": results, "train_length": train_length, **details})
    fig = plots.plot_extrapolation(results, train_length=train_length, title=title, path=out / "extrapolation.png")
    plt.close(fig)
    return table


# ----------------------------------------------------------------------------- commands


def run_train(args: argparse.Namespace) -> None:
    out = check_writable_folder(args.out, "--out")
    main_process = int(os.environ.get("RANK", "0")) == 0
    with folder_lock(out) if main_process else contextlib.nullcontext():   # history.json too, under the lock
        _train_into(args, out, main_process)


def _train_into(args: argparse.Namespace, out: Path, main_process: bool) -> None:
    fields = {f.name for f in dataclasses.fields(GPTConfig)}
    overrides = {name: value for name, value in vars(args).items() if name in fields}
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


def _eval_corpus(path: str, checkpoint: dict, corpus: str | None) -> str:
    """The corpus to score a checkpoint on: `--corpus` when given, else the one it was trained on, checked to
    be the same file as then."""
    if corpus is not None:
        return corpus
    recorded = checkpoint.get("corpus")
    if recorded is None:
        raise ValueError(f"{path} was trained on data given as a tensor, not a corpus; pass --corpus")
    return check_corpus(recorded, None, f"eval of {path}")


def run_eval(args: argparse.Namespace) -> None:
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
    table = write_extrapolation(out, results, train_length, "Length extrapolation", details)
    print(table)
    print(f"wrote {out / 'results.md'}, {out / 'results.json'} and {out / 'extrapolation.png'}")


def demo_budget(device: torch.device) -> DemoBudget:
    if fast_mode():
        return FAST_BUDGET
    return CUDA_BUDGET if device.type == "cuda" else CPU_BUDGET


def run_demo(args: argparse.Namespace) -> None:
    device = resolve_device(args.device)
    budget = demo_budget(device)
    steps = args.steps or budget.steps
    out = refuse_to_replace(args.out, RESULT_FILES + tuple(f"{name}/{CHECKPOINT_NAME}" for name, _ in DEMO_MODELS),
                            args.overwrite)
    with folder_lock(out):
        _demo_into(args, out, device, budget, steps)


def _demo_into(args: argparse.Namespace, out: Path, device: torch.device, budget: DemoBudget, steps: int) -> None:
    val_tokens = load_corpus(args.corpus, "val")
    scored = min(DEMO_LAST_K, min(budget.eval_lengths))
    what_is_scored = (f"last_k: the same {budget.eval_windows} x {scored} = {budget.eval_windows * scored} tokens "
                      f"scored at every length, only their context grows")
    print(f"minidape demo on {device}: {len(DEMO_MODELS)} models, {budget.n_layer} layers x {budget.n_embd} "
          f"wide, {steps} steps of {budget.batch_size} x {DEMO_TRAIN_LENGTH} tokens each, evaluated at "
          f"{', '.join(map(str, budget.eval_lengths))} ({what_is_scored})")
    results, seconds, started = {}, {}, time.perf_counter()
    for name, overrides in DEMO_MODELS:
        clock = time.perf_counter()
        cfg = GPTConfig(n_layer=budget.n_layer, n_embd=budget.n_embd, n_head=budget.n_head,
                        block_size=DEMO_TRAIN_LENGTH, **overrides)
        model, _ = train(cfg, args.corpus, steps=steps, batch_size=budget.batch_size, lr=budget.lr, device=device,
                         seed=args.seed, out=out / name, overwrite=args.overwrite, eval_every=steps)
        results[name] = perplexity_by_length(model, val_tokens, budget.eval_lengths, last_k=DEMO_LAST_K,
                                             protocol="last_k", n_windows=budget.eval_windows, seed=args.seed)
        seconds[name] = round(time.perf_counter() - clock, 1)
        print(f"{name}: {seconds[name]:.0f} s, perplexity " +
              ", ".join(f"{length}: {ppl:.2f}" for length, ppl in results[name].items()), flush=True)
    details = {"corpus": args.corpus, "device": str(device), "steps": steps, "batch_size": budget.batch_size,
               "model": f"{budget.n_layer} layers, n_embd {budget.n_embd}, {budget.n_head} heads",
               "protocol": what_is_scored, "windows per length": budget.eval_windows,
               "seed": args.seed, "fast mode": fast_mode(),
               "wall time (s)": round(time.perf_counter() - started, 1), "seconds per model": seconds}
    table = write_extrapolation(out, results, DEMO_TRAIN_LENGTH,
                                f"minidape demo: trained at {DEMO_TRAIN_LENGTH} tokens", details)
    print()
    print(table)
    print(f"wrote {out / 'results.md'}, {out / 'results.json'} and {out / 'extrapolation.png'} "
          f"in {details['wall time (s)']:.0f} s")


def run_che(args: argparse.Namespace) -> None:
    task = get_task(args.task)
    fixed = [name for name in ("vocab_size", "causal", "block_size") if name in vars(args)]
    if fixed:
        raise ValueError(f"the task sets {', '.join(fixed)}; drop "
                         f"{', '.join('--' + name.replace('_', '-') for name in fixed)}")
    fields = {f.name for f in dataclasses.fields(GPTConfig)}
    cfg = GPTConfig(**{name: value for name, value in vars(args).items() if name in fields})
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


def run_bench(args: argparse.Namespace, bench_args: list[str]) -> None:
    """Run the benchmark script with its own flags. It lives in the repository's benchmarks/ folder, not in the
    installed package: from an installed copy this says where to get it."""
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_refiners.py"
    if not script.is_file():
        raise FileNotFoundError("bench runs benchmarks/bench_refiners.py from a clone of the minidape repository "
                                "(it is not part of the installed package); run it there: python -m minidape bench")
    if args.pe is not None:
        bench_args = ["--pe", args.pe, *bench_args]
    sys.argv = [str(script), *bench_args]
    runpy.run_path(str(script), run_name="__main__")


COMMANDS = {"demo": run_demo, "train": run_train, "eval": run_eval, "che": run_che}


# ----------------------------------------------------------------------------- study: reproduce, compare
# (the claim study and the bias comparison live in study.py; this block only parses their flags)


def add_study_commands(commands) -> None:
    from .study import BUDGET_NAMES, BUDGETS, DEFAULT_CORPORA, DEFAULT_SEEDS
    budget_help = argparse.SUPPRESS  # "tiny" (tests only) is accepted but not advertised
    reproduce = add_command(
        commands, "reproduce", help="test the papers' claims C1-C6 with seeds, intervals and Holm-adjusted tests",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train and evaluate the claim study (KERPLE, DAPE, DAPE-V2: claims C1-C6) and write "
                    "REPRODUCTION.md, results.json and figures/ into --out. Resumable: the same command "
                    "skips the runs already done; other settings into the same --out are refused.\n\n"
                    "example:\n  python -m minidape reproduce --budget small --out runs/reproduce-small")
    reproduce.add_argument("--budget", default="default", choices=list(BUDGETS), metavar="{small,default}",
                           help=f"small: fewer steps and a lighter evaluation; default: the committed report's "
                                f"(larger on CUDA by itself). Valid: {', '.join(BUDGET_NAMES)}")
    reproduce.add_argument("--seeds", type=int, default=DEFAULT_SEEDS,
                           help=f"seeds per model (default {DEFAULT_SEEDS}, at least 2)")
    reproduce.add_argument("--corpus", nargs="+", default=list(DEFAULT_CORPORA),
                           help=f"corpus names or .txt/.gz paths (default: {' '.join(DEFAULT_CORPORA)})")
    reproduce.add_argument("--out", default="runs/reproduce", help="output directory (default runs/reproduce)")
    _add_device_flag(reproduce)

    compare = add_command(
        commands, "compare", help="a bias against baselines: mean ± std over seeds, differences with intervals",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train a positional encoding (a registered name, or FILE.py:ClassName, an md.AdditiveBias "
                    "subclass registered on the fly) and its baselines with several seeds at length 128, "
                    "evaluate up to 16x with both protocols, print the table with p-values and write compare.md, "
                    "compare.json and compare.png into --out.\n\n"
                    "example:\n  python -m minidape compare --pe my_bias.py:MyBias --against alibi kerple_log")
    compare.add_argument("--pe", required=True, help="registered PE name or path/to/file.py:ClassName")
    compare.add_argument("--refiner", default="none", help="a registered refiner (default none)")
    compare.add_argument("--against", nargs="+", default=["alibi", "kerple_log"],
                         help="baselines, each pe or pe+refiner (default: alibi kerple_log)")
    compare.add_argument("--seeds", type=int, default=3, help="seeds per model (default 3, at least 2)")
    compare.add_argument("--steps", type=positive_int, help="training steps per run (default: the budget's)")
    compare.add_argument("--corpus", default="austen", help="corpus name or .txt/.gz path (default austen)")
    compare.add_argument("--out", help="output directory (default runs/compare/NAME)")
    compare.add_argument("--overwrite", action="store_true",
                         help="write into an --out holding other results (not an earlier compare's: that resumes)")
    compare.add_argument("--allow-leakage", action="store_true",
                         help="compare decoders that read the future (refused otherwise); the report says so")
    compare.add_argument("--budget", default="default", choices=list(BUDGETS), help=budget_help)
    _add_device_flag(compare)


def run_reproduce(args: argparse.Namespace) -> None:
    from .study import reproduce
    command = "python -m minidape " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["reproduce"] else None
    reproduce(budget=args.budget, seeds=args.seeds, corpora=args.corpus, out=args.out, device=args.device,
              command=command)


def run_compare(args: argparse.Namespace) -> None:
    from .study import compare
    name = args.pe.rpartition(":")[2] if ":" in args.pe else args.pe
    out = args.out or Path("runs") / "compare" / name
    compare(args.pe, refiner=args.refiner, against=tuple(args.against), seeds=args.seeds, steps=args.steps,
            corpus=args.corpus, out=out, budget=args.budget, device=args.device, overwrite=args.overwrite,
            allow_leakage=args.allow_leakage)


COMMANDS.update(reproduce=run_reproduce, compare=run_compare)
# ----------------------------------------------------------------------------- end of study block


# ----------------------------------------------------------------------------- grade (notebooks' exercises)
# One block: the subcommand's flags and what it runs; build_parser calls add_grade_command.


def add_grade_command(commands) -> None:
    grade = add_command(commands, "grade", help="grade students' notebooks against the teacher's edition",
                        description="Run each submission in its own sandbox with the teacher's check cells "
                                    "restored; judge every exercise of its notebook in the grader's process. A "
                                    "folder stands for its *.ipynb files and its student folders (one per "
                                    "student: folder/<id>/*.ipynb).")
    grade.add_argument("paths", nargs="+", metavar="PATH", help="notebooks (.ipynb) or folders of notebooks")
    grade.add_argument("--csv", help="also write FILE: student,notebook,exercise,points,max_points,status,message "
                                     "(one row per exercise, rewritten after every submission), and beside it "
                                     "FILE-written.csv: the written answers with their rubric ids")
    grade.add_argument("--timeout", type=positive_float, default=600,
                       help="seconds allowed for each notebook's cells, and again for its checks (default 600)")
    grade.add_argument("--jobs", type=positive_int, default=None,
                       help="submissions graded at once, each in its own sandbox (default: the CPU cores)")
    grade.add_argument("--feedback", metavar="DIR",
                       help="write DIR/<student>/<notebook>.ipynb: the executed notebook with the grader's "
                            "verdict under each exercise and a note under each written answer")


def run_grade(args: argparse.Namespace) -> None:
    from .grade import grade

    grade(args.paths, csv_path=args.csv, timeout=args.timeout, jobs=args.jobs, feedback=args.feedback)


COMMANDS["grade"] = run_grade
# ----------------------------------------------------------------------------- end of grade


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    prog = "python -m minidape"
    try:
        for path in _imported_files(argv):  # first: the names they register become valid choices below
            import_file(path)
        parser = build_parser()
        args, rest = parser.parse_known_args(argv)
        if args.command == "bench":  # every flag the benchmark does not share belongs to the script
            return run_bench(args, rest)
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        COMMANDS[args.command](args)
    except KeyboardInterrupt as interrupted:  # in training, the message says which checkpoint survives
        print(f"{prog}: {interrupted or 'interrupted'}", file=sys.stderr)
        sys.exit(130)
    except (ValueError, TypeError, OSError, FloatingPointError, MemoryError) as err:  # the user's mistake: one line
        print(f"{prog}: error: {' '.join(str(err).split())}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
