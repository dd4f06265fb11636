"""Command line: `python -m minidape {demo,train,eval,che,bench,reproduce,compare,grade} ...` (`--help` on each).

    python -m minidape demo                                  # 7 PEs/refiners, trained and compared
    python -m minidape train --pe alibi --steps 2000 --out runs/alibi
    python -m minidape train --steps 4000 --out runs/alibi --resume
    python -m minidape eval runs/alibi/checkpoint.pt runs/rope/checkpoint.pt --lengths 128 512 2048
    python -m minidape che --task reverse_string --pe kerple_log --refiner dape --steps 2000
    python -m minidape train --import my_bias.py --pe my_bias --out runs/mine   # a bias of your own
    python -m minidape compare --pe my_bias.py:MyBias --against alibi kerple_log+conv:5

Every `GPTConfig` field is a `train` flag (`--n-layer`, `--pe`, `--refiner`, ...), read from the dataclass
itself, so a field added to the model is a flag without touching this file. Every command takes
`--import FILE.py` (repeatable): the file runs first, so the PEs and refiners it registers are valid choices;
`--import FILE.py:ClassName`, and `--pe` / `--refiner` / compare's models given as `FILE.py:ClassName`, also
register that class (as ``STEM:ClassName``).
A mistake in the command line is one line on stderr and exit code 2. This file only parses the command line;
what each command does is in `minidape.commands` (which calls the study, the grader and the benchmark).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import textwrap
import typing

from .commands import COMMANDS, bench_command
from .lab.evaluate import PROTOCOLS
from .lab.tasks import TASK_NAMES
from .lab.train import DEFAULT_SETTINGS
from .lab.user_code import import_file, register_class
from .model import FOX_GATES, PE_NAMES, REFINER_NAMES, TEMPERATURES, GPTConfig, parse_layer, pe_names
from .study.budgets import BUDGET_NAMES, BUDGETS, DEFAULT_CORPORA, DEFAULT_SEEDS
from .study.claims import FLAT_MARGIN, LEAKY_REFINER, MODELS
from .study.comparison import DEFAULT_BASELINES
from .threads import THREADS_VARIABLE, use_threads
from .utils import DEVICE_CHOICES, quick_mode

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


def import_user_code(spec: str) -> None:
    """`--import FILE.py` runs the file; `--import FILE.py:ClassName` also registers that class (as
    ``STEM:ClassName``, unless the file registers it itself), the form `--pe` / `--refiner` accept too."""
    if ":" in spec and not spec.endswith(".py"):
        register_class(spec, "--import")
    else:
        import_file(spec)


def registered(kind: str):
    """argparse type of `--pe` / `--refiner`: a registered name, or FILE.py:ClassName registered on the fly."""
    names = PE_NAMES if kind == "pe" else REFINER_NAMES

    def check(text: str) -> str:
        if text in names:
            return text
        if kind == "pe" and all(name in names for name in pe_names(text)):  # a per-layer spec (rope@sliding=32,none)
            try:
                for entry in text.split(","):
                    parse_layer(entry, text)  # its '@' options
            except ValueError as err:
                raise argparse.ArgumentTypeError(str(err)) from err
            return text
        if ":" not in text:
            per_layer = ", several joined by commas (cycled over the layers, e.g. rope,none)" if kind == "pe" else ""
            raise argparse.ArgumentTypeError(
                f"unknown {kind} {text!r}; valid choices: {', '.join(names)}{per_layer}, or FILE.py:ClassName"
            )
        try:
            found, name, _ = register_class(text, f"--{kind}")
        except (ValueError, OSError) as err:
            raise argparse.ArgumentTypeError(str(err)) from err
        if found != kind:
            raise argparse.ArgumentTypeError(
                f"{text!r} is a {'positional encoding' if found == 'pe' else 'refiner'}"
                f", not a {'positional encoding' if kind == 'pe' else 'refiner'}"
            )
        return name

    check.__name__ = kind
    return check


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per GPTConfig field, typed from its annotation; unset flags keep the config's default. `--pe` and
    `--refiner` take a registered name or FILE.py:ClassName."""
    hints = typing.get_type_hints(GPTConfig)
    choices = {"temperature": TEMPERATURES, "fox_gate": FOX_GATES}
    group = parser.add_argument_group("model (GPTConfig fields)")
    for field in dataclasses.fields(GPTConfig):
        kind = hints[field.name]
        flags = [f"--{field.name.replace('_', '-')}"] + ([f"--{field.name}"] if "_" in field.name else [])
        options = {"dest": field.name, "default": argparse.SUPPRESS, "help": f"default {field.default!r}"}
        if kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        elif field.name in ("pe", "refiner"):
            names = PE_NAMES if field.name == "pe" else REFINER_NAMES
            options.update(
                type=registered(field.name),
                metavar=field.name.upper(),
                help=f"{', '.join(names)}, or FILE.py:ClassName (default {field.default!r})",
            )
        else:
            options["type"] = kind
            if field.name in choices:
                options["choices"] = list(choices[field.name])
        group.add_argument(*flags, **options)


def _add_device_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device",
        default="auto",
        help=f"{', '.join(DEVICE_CHOICES)} or cuda:N (default auto: CUDA, then MPS, then CPU)",
    )


def _add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    """The study split into runs for a cluster's scheduler (README: "The study on a cluster")."""
    step = parser.add_argument_group("on a cluster").add_mutually_exclusive_group()
    step.add_argument(
        "--list-runs",
        dest="step",
        action="store_const",
        const="list",
        help="print one line per run, a shell command that trains and evaluates that run alone into --out",
    )
    step.add_argument("--run", dest="step", type=int, metavar="N", help="train and evaluate run N of the list alone")
    step.add_argument(
        "--report", dest="step", action="store_const", const="report", help="write the report from the runs done"
    )


THREADS_HELP = (
    f"torch CPU threads (default: {THREADS_VARIABLE}, else OMP_NUM_THREADS, else chosen from the cores "
    "this process may use and the size of the work)"
)


def add_command(commands, name: str, **options) -> argparse.ArgumentParser:
    """A subcommand with the flags every command takes: `--import FILE.py` (repeatable) and `--threads N`."""
    command = commands.add_parser(name, **options)
    command.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="FILE.py[:CLASS]",
        help="run this Python file first, so the PEs/refiners it registers can be used; with "
        ":CLASS also register that class as STEM:CLASS (repeatable)",
    )
    # bench: `--threads` alone runs the thread benchmark, `--threads N` times on N threads (the benchmark sets them)
    command.add_argument(
        "--threads",
        type=positive_int,
        metavar="N",
        help=THREADS_HELP,
        **(dict(nargs="?", const=0) if name == "bench" else {}),
    )
    return command


def activation_size(args: argparse.Namespace) -> int | None:
    """Elements of one activation (batch x T x n_embd) of what `train` and `che` train, for the thread count."""
    defaults = GPTConfig()
    width = getattr(args, "n_embd", defaults.n_embd)
    if args.command == "train":  # no --batch-size: the default, or a resumed run's own
        batch_size = args.batch_size or DEFAULT_SETTINGS["batch_size"]
        return batch_size * getattr(args, "block_size", defaults.block_size) * width
    if args.command == "che":
        return args.batch_size * args.max_train_length * width
    return None


def set_threads(args: argparse.Namespace) -> None:
    """Set torch's CPU threads for this command (see `minidape.threads`); minidape's own settings (`--threads`,
    MINIDAPE_THREADS) are said on stderr. The grader's `--threads` is its workers' (`grade.worker_env` passes
    MINIDAPE_THREADS on)."""
    if args.command == "grade" and args.threads is not None:
        os.environ[THREADS_VARIABLE] = str(args.threads)
    choice = use_threads(args.threads, activation_size(args))
    if args.threads is not None or os.environ.get(THREADS_VARIABLE):
        print(f"minidape: {choice}", file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="python -m minidape",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)

    demo = add_command(
        commands,
        "demo",
        help="train 7 PEs/refiners at length 128 and compare their extrapolation",
        description="Train NoPE, RoPE, ALiBi, Kerple-log, FIRE, DAPE-Kerple and DAPE1x3-Kerple "
        "(the study's models of those names) at length 128, evaluate each up to 16x "
        "that length (last-256-tokens protocol), write results.md, results.json and "
        "extrapolation.png. Budget: CPU ~10 min; larger on CUDA; tiny with "
        "MINIDAPE_QUICK=1.",
    )
    demo.add_argument("--corpus", default="austen", help="corpus name or .txt/.gz path (default austen)")
    demo.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    demo.add_argument("--overwrite", action="store_true", help="replace an earlier demo in OUT")
    demo.add_argument("--steps", type=positive_int, help="training steps per model (default: the machine's budget)")
    demo.add_argument("--seed", type=int, default=0)
    _add_device_flag(demo)

    train_cmd = add_command(
        commands,
        "train",
        help="train one model",
        description="Train one GPT; every GPTConfig field is a flag. Writes OUT/checkpoint.pt and OUT/history.json.",
    )
    _add_config_flags(train_cmd)
    run = train_cmd.add_argument_group("training")
    run.add_argument(
        "--corpus", help="corpus name or .txt/.gz path (default austen; on --resume the checkpoint's corpus)"
    )
    run.description = "On --resume the run's own --steps ... --seed are kept: give none (more --steps extend it)."
    run.add_argument("--steps", type=positive_int, help="total optimizer steps (default 1000)")
    run.add_argument("--batch-size", type=positive_int, help="sequences per step, per process under DDP (default 32)")
    run.add_argument("--lr", type=positive_float, help="peak learning rate (default 1e-3)")
    run.add_argument("--min-lr", type=float, help="final learning rate of the cosine (default lr/10)")
    run.add_argument("--warmup", type=int, help="linear warmup steps (default 5%% of steps)")
    run.add_argument("--weight-decay", type=float, help="on weight matrices (default 0.1)")
    run.add_argument("--grad-clip", type=float, help="gradient norm clip, 0 disables (default 1)")
    run.add_argument("--eval-every", type=positive_int, help="steps between validation losses (default steps/10)")
    run.add_argument(
        "--checkpoint-every", type=positive_int, help="steps between checkpoints (default: at the end only)"
    )
    run.add_argument("--seed", type=int, help="default 0")
    run.add_argument("--compile", action="store_true", help="torch.compile the model")
    run.add_argument("--out", required=True, help="run directory for checkpoint.pt and history.json")
    again = run.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    again.add_argument("--overwrite", action="store_true", help="replace the checkpoint in OUT with a new run")
    run.add_argument(
        "--allow-leakage",
        action="store_true",
        help="train a decoder that reads the future (refused otherwise): a deliberate leakage experiment",
    )
    _add_device_flag(run)

    evaluate = add_command(
        commands,
        "eval",
        help="perplexity by length of checkpoints: table + plot",
        description="Evaluate checkpoints at several lengths; print a markdown table and write "
        "results.md, results.json and extrapolation.png.",
    )
    evaluate.add_argument("checkpoints", nargs="+", help="checkpoint files (or run directories)")
    evaluate.add_argument(
        "--lengths", type=positive_int, nargs="+", help="evaluation lengths (default: training length x 1, 2, 4, 8, 16)"
    )
    evaluate.add_argument("--protocol", choices=PROTOCOLS, default="last_k")
    evaluate.add_argument(
        "--last-k",
        type=positive_int,
        default=256,
        help="tokens scored per window with last_k (at most the shortest length; default 256)",
    )
    evaluate.add_argument(
        "--n-windows",
        type=positive_int,
        default=32,
        help="windows per length with last_k, the same scored tokens at every length (default 32)",
    )
    evaluate.add_argument(
        "--n-tokens",
        type=positive_int,
        help="predictions scored with nonoverlap (default: all of the validation split)",
    )
    evaluate.add_argument(
        "--corpus", help="corpus whose val split is scored (default: the checkpoint's, refused if its file has changed)"
    )
    evaluate.add_argument("--out", help="directory for the results (default: the first checkpoint's)")
    evaluate.add_argument("--overwrite", action="store_true", help="replace results already in --out")
    evaluate.add_argument("--seed", type=int, default=0)
    _add_device_flag(evaluate)

    che = add_command(
        commands,
        "che",
        help="train and test an encoder on a Chomsky-hierarchy task",
        description="Train an encoder on one CHE task with input lengths drawn from "
        "U(1, max-train-length), test it at longer lengths, print a table and write "
        "results.md, results.json and accuracy.png. The task sets vocab_size, "
        "causal=False and block_size; the other GPTConfig fields are flags.",
    )
    che.add_argument(
        "--task", required=True, choices=TASK_NAMES, metavar="TASK", help=f"one of: {', '.join(TASK_NAMES)}"
    )
    _add_config_flags(che)
    run = che.add_argument_group("training and test")
    run.add_argument(
        "--steps", type=positive_int, default=1000, help="Adam steps, one input length each (default 1000)"
    )
    run.add_argument("--batch-size", type=positive_int, default=32)
    run.add_argument("--lr", type=positive_float, default=1e-3, help="peak learning rate (default 1e-3)")
    run.add_argument("--max-train-length", type=positive_int, default=40, help="longest training input (default 40)")
    run.add_argument("--max-test-length", type=positive_int, default=500, help="longest test input (default 500)")
    run.add_argument(
        "--length-step",
        type=positive_int,
        default=10,
        help="test the lengths step, 2*step, ... up to --max-test-length (default 10; 1 tests "
        "every length, as the papers do)",
    )
    run.add_argument("--eval-samples", type=positive_int, default=64, help="test sequences per length (default 64)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--out", help="output directory (default runs/che/TASK-MODEL)")
    run.add_argument("--overwrite", action="store_true", help="replace earlier results in OUT")
    _add_device_flag(run)

    bench = add_command(
        commands,
        "bench",
        add_help=False,
        help="refiner speed and memory benchmark (minidape.lab.bench; its flags: bench --help)",
    )
    bench.add_argument("--pe", choices=list(PE_NAMES), help=argparse.SUPPRESS)

    reproduce = add_command(
        commands,
        "reproduce",
        help="test the papers' claims C1-C6 with seeds, intervals and Holm-adjusted tests",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train and evaluate the claim study (KERPLE, DAPE, DAPE-V2: claims C1-C6) and write "
        "REPRODUCTION.md, results.json and figures/ into --out. Resumable: the same command "
        "skips the runs already done; other settings into the same --out are refused.\n\n"
        "example:\n  python -m minidape reproduce --budget small --out runs/reproduce-small",
    )
    reproduce.add_argument(
        "--budget",
        default="default",
        choices=list(BUDGETS),
        metavar="{small,default}",
        help=f"small: fewer steps and a lighter evaluation; default: the committed report's "
        f"(larger on CUDA by itself). Valid: {', '.join(BUDGET_NAMES)}",
    )
    reproduce.add_argument(
        "--seeds", type=int, default=DEFAULT_SEEDS, help=f"seeds per model (default {DEFAULT_SEEDS}, at least 2)"
    )
    reproduce.add_argument(
        "--corpus",
        nargs="+",
        default=list(DEFAULT_CORPORA),
        help=f"corpus names or .txt/.gz paths (default: {' '.join(DEFAULT_CORPORA)})",
    )
    reproduce.add_argument("--out", default="runs/reproduce", help="output directory (default runs/reproduce)")
    reproduce.add_argument(
        "--rerun",
        action="store_true",
        help="train again the runs in --out whose files record another corpus or configuration (refused otherwise)",
    )
    _add_device_flag(reproduce)
    _add_cluster_flags(reproduce)

    compare = add_command(
        commands,
        "compare",
        help="a model against baselines: every endpoint with intervals, tests and Holm",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="\n\n".join(
            textwrap.fill(paragraph, 100)
            for paragraph in (
                "Train a model (--pe) and its baselines (--against) with --seeds seeds each, evaluate each at the "
                "training length x 1, 2, 4, 8, 16 (or --lengths) with both protocols, print the tables, the "
                "endpoints and a verdict per baseline, and write compare.md, compare.json, compare.png and one file "
                "per run into --out.",
                f"Models, one syntax for all: PE[+REFINER[:OPTION]...]. PE: {', '.join(PE_NAMES)}, several of them "
                "joined by commas (cycled over the layers, e.g. rope,none), or FILE.py:ClassName. REFINER: "
                f"{', '.join(name for name in REFINER_NAMES if name != 'none')}, or "
                "FILE.py:ClassName. OPTION: K or k=K (odd kernel of the conv refiners, default 3), w=W (hidden width, "
                "default 32), w=matched (DAPE's MLP at the 1x3 conv refiner's parameter count). E.g. kerple_log+dape, "
                "kerple_log+conv:5, kerple_log+dape:w=matched. A model of the study is also named by its label: "
                f"{'; '.join(label for label, model in MODELS.items() if model.get('refiner') != LEAKY_REFINER)}.",
                "Endpoints, per seed, the mean over both protocols of a log ratio of perplexity per byte: the model "
                "over each baseline at the training length, beyond it and over all lengths (t-test); each model's "
                "perplexity at 16x (or the longest length) over that at 1x (equivalence test, TOST, against "
                "±--margin); each with its 95 % CI, t-test, exact sign-flip test and Holm's adjustment across all of "
                "them. The verdict per baseline rests on the beyond-length endpoint.",
                "Runs are resumable: each run's file records the corpus's sha256 and size and the full configuration, "
                "and is reused only when both match; one that does not is refused (naming the file and what differs) "
                "unless --rerun.",
                "Budgets (CPU; larger on CUDA): "
                + "; ".join(
                    f"{name}: {b.n_layer} layers x {b.n_embd}, {b.n_head} heads, {b.steps} steps of {b.batch_size}, "
                    f"lr {b.lr}, training length {b.train_lengths[0]}"
                    for name, b in BUDGETS.items()
                    if name in BUDGET_NAMES
                )
                + ".",
            )
        )
        + "\n\nexample:\n  python -m minidape compare --pe my_bias.py:MyBias --against alibi kerple_log "
        "kerple_log+dape",
    )
    compare.add_argument(
        "--pe", required=True, metavar="MODEL", help="the model under test: PE[+REFINER[:OPTION]...] (see above)"
    )
    compare.add_argument(
        "--against",
        nargs="+",
        default=list(DEFAULT_BASELINES),
        metavar="MODEL",
        help=f"baselines, same syntax (default: {' '.join(DEFAULT_BASELINES)})",
    )
    compare.add_argument(
        "--seeds",
        type=int,
        default=DEFAULT_SEEDS,
        help=f"seeds per model (default {DEFAULT_SEEDS}; at least 2; under {DEFAULT_SEEDS} a "
        f"warning says what the seeds cannot show: at 3 the sign-flip test cannot go below "
        f"p = 0.25)",
    )
    compare.add_argument("--corpus", default="austen", help="corpus name or .txt/.gz path (default austen)")
    compare.add_argument(
        "--budget",
        default="default",
        choices=list(BUDGETS),
        metavar="{small,default}",
        help="model size, training and evaluation, each overridden by the flags below (default: default)",
    )
    knobs = compare.add_argument_group("overrides of the budget (defaults: budget default's on CPU)")
    cpu = BUDGETS["default"]
    knobs.add_argument("--steps", type=positive_int, help=f"training steps per run (default {cpu.steps})")
    knobs.add_argument("--batch-size", type=positive_int, help=f"windows per step (default {cpu.batch_size})")
    knobs.add_argument("--lr", type=positive_float, help=f"peak learning rate, cosine schedule (default {cpu.lr})")
    knobs.add_argument("--n-layer", type=positive_int, help=f"layers (default {cpu.n_layer})")
    knobs.add_argument("--n-embd", type=positive_int, help=f"embedding width (default {cpu.n_embd})")
    knobs.add_argument("--n-head", type=positive_int, help=f"attention heads (default {cpu.n_head})")
    knobs.add_argument("--train-length", type=positive_int, help=f"training length T (default {cpu.train_lengths[0]})")
    knobs.add_argument(
        "--lengths",
        type=positive_int,
        nargs="+",
        help="evaluation lengths: T, longer ones (multiples of T) and any shorter ones dividing T, which the "
        "endpoint over all lengths pools with the others (last_k then scores the shortest length's tokens at every "
        f"length) (default T x {' '.join(map(str, cpu.eval_factors))})",
    )
    compare.add_argument(
        "--margin",
        type=positive_float,
        default=100 * FLAT_MARGIN,
        help=f"equivalence margin of the degradation endpoint, in %% (default "
        f"{100 * FLAT_MARGIN:g}: within ±{100 * FLAT_MARGIN:g} %%)",
    )
    compare.add_argument(
        "--out",
        help="output directory (default runs/compare/MODEL: the model's label, e.g. runs/compare/kerple-log-conv-k-5)",
    )
    compare.add_argument(
        "--rerun",
        action="store_true",
        help="train again the runs in --out whose files record another corpus or configuration (refused otherwise)",
    )
    compare.add_argument(
        "--keep-checkpoints",
        action="store_true",
        help="keep each trained run's model as --out/runs/MODEL/seedN/checkpoint.pt",
    )
    compare.add_argument(
        "--overwrite",
        action="store_true",
        help="write into an --out holding other results (not an earlier compare's: that resumes)",
    )
    compare.add_argument(
        "--allow-leakage",
        action="store_true",
        help="compare decoders that read the future (refused otherwise); the report says so",
    )
    _add_device_flag(compare)
    _add_cluster_flags(compare)

    grade = add_command(
        commands,
        "grade",
        help="grade students' notebooks against the teacher's edition",
        description="Run each submission in its own sandbox with the teacher's check cells "
        "restored; judge every exercise of its notebook in the grader's process. A "
        "folder stands for its *.ipynb files and its student folders (one per "
        "student: folder/<id>/*.ipynb).",
    )
    grade.add_argument("paths", nargs="*", metavar="PATH", help="notebooks (.ipynb) or folders of notebooks")
    grade.add_argument(
        "--csv",
        help="also write FILE: student,notebook,exercise,points,max_points,passed,message,"
        "mistake (one row per exercise, rewritten after every submission), and beside "
        "it the gradebook: FILE-written.csv (the written answers, a points column for "
        "you), FILE-totals.csv, FILE-summary.csv and FILE-gradescope/ (results.json)",
    )
    grade.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier batch's --csv FILE (marks entered for unchanged written answers "
        "are kept); without it grade refuses",
    )
    grade.add_argument(
        "--gradebook",
        metavar="FILE",
        help="grade nothing: rebuild FILE's totals, summary and export from FILE and "
        "FILE-written.csv, with the points you entered for written answers",
    )
    grade.add_argument(
        "--merge",
        nargs="+",
        metavar="FILE",
        help="grade nothing: merge the batches FILE... (each an earlier --csv FILE, e.g. notebooks graded in "
        "quick mode and 06 in full mode) into one gradebook, --csv COURSE",
    )
    grade.add_argument(
        "--timeout",
        type=positive_float,
        default=600,
        help="seconds allowed for each notebook's cells, and again for its checks (default 600)",
    )
    grade.add_argument(
        "--jobs",
        type=positive_int,
        default=None,
        help="submissions graded at once, each in its own sandbox (default: the CPU cores)",
    )
    grade.add_argument(
        "--feedback",
        metavar="DIR",
        help="write DIR/<student>/<notebook>.ipynb: the executed notebook with the grader's "
        "verdict under each exercise and a note under each written answer",
    )
    handout = add_command(
        commands,
        "handout",
        help="write what a teacher hands out: the student edition and a wheel",
        description="From a checkout: OUT/notebooks/NN_topic.ipynb (the student edition: no "
        "solution cells, no outputs), the package as a wheel, and a README for "
        "students. Refused if any line of a worked solution would be in it.",
    )
    handout.add_argument("out", metavar="OUT", help="a new (or empty) folder")
    handout.add_argument("--notebooks", nargs="+", metavar="NN", help="only these notebooks, e.g. 03 04 (default: all)")
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    prog = "python -m minidape"
    try:
        for path in _imported_files(argv):  # first: the names they register become valid choices below
            import_user_code(path)
        parser = build_parser()
        args, rest = parser.parse_known_args(argv)
        args.argv = argv  # the command line as given: --list-runs prints it per run
        if args.command == "bench":  # every flag the benchmark does not share belongs to the script
            return bench_command(args, rest)
        set_threads(args)
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        quick_mode()  # a bad value of its variable is refused here, before any work (the demo says when it is on)
        COMMANDS[args.command](args)
    except KeyboardInterrupt as interrupted:  # in training, the message says which checkpoint survives
        print(f"{prog}: {interrupted or 'interrupted'}", file=sys.stderr)
        sys.exit(getattr(interrupted, "exit_code", 130))  # SIGTERM, SIGHUP: 128 + the signal's number
    except (ValueError, TypeError, OSError, FloatingPointError, MemoryError) as err:  # the user's mistake: one line
        print(f"{prog}: error: {' '.join(str(err).split())}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
