"""The command line's flags, one builder per command (`COMMAND_PARSERS`), and `build_parser`. Loads no torch:
the names and defaults it offers are read from the package's source (`minidape.declared`) until the model is loaded
(a user's `--import` loads it), so `--help` and a mistaken flag answer at once."""

from __future__ import annotations

import argparse
import sys
import textwrap
import typing

from . import declared
from .threads import THREADS_VARIABLE


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


def known_names(kind: str) -> list[str]:
    """The registered names of `kind` ("pe" or "refiner"): the registry's own once the model is loaded (a user's
    `--import` loads it, and may add names), else model.py's, read from its source."""
    model = sys.modules.get("minidape.model")
    if model is None:
        return declared.registered_names(kind)
    return list(model.PE_NAMES if kind == "pe" else model.REFINER_NAMES)


def registered(kind: str):
    """argparse type of `--pe` / `--refiner`: a registered name, or FILE.py:ClassName registered on the fly."""

    def check(text: str) -> str:
        names = known_names(kind)
        # a name, or a per-layer spec of names with their '@' options (rope@sliding=32,none), which the config
        # checks when the command builds it
        if text in names or (kind == "pe" and all(entry.split("@")[0] in names for entry in text.split(","))):
            return text
        if ":" not in text:
            per_layer = ", several joined by commas (one per layer, e.g. rope,none)" if kind == "pe" else ""
            raise argparse.ArgumentTypeError(
                f"unknown {kind} {text!r}; valid choices: {', '.join(names)}{per_layer}, or FILE.py:ClassName"
            )
        from .lab.user_code import register_class

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


# GPTConfig's fields of a few values, and model.py's tuple of them.
CONFIG_CHOICES = {"temperature": "TEMPERATURES", "fox_gate": "FOX_GATES"}


def _add_config_flags(parser: argparse.ArgumentParser, set_by_task: tuple[str, ...] = ()) -> None:
    """One flag per GPTConfig field, typed from its annotation; unset flags keep the config's default. `--pe` and
    `--refiner` take a registered name or FILE.py:ClassName. The fields in `set_by_task` are hidden from `--help`
    (che refuses them, naming the task that sets them)."""
    choices = {name: declared.constant("model.py", constant) for name, constant in CONFIG_CHOICES.items()}
    group = parser.add_argument_group("model (GPTConfig fields)")
    for name, kind, default in declared.config_fields():
        flags = [f"--{name.replace('_', '-')}"] + ([f"--{name}"] if "_" in name else [])
        options = {"dest": name, "default": argparse.SUPPRESS, "help": f"default {default!r}"}
        if kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        elif name in ("pe", "refiner"):
            options.update(
                type=registered(name),
                metavar=name.upper(),
                help=f"{', '.join(known_names(name))}, or FILE.py:ClassName (default {default!r})",
            )
        else:
            options["type"] = kind
            if name in choices:
                options["choices"] = list(choices[name])
        if name in set_by_task:
            options["help"] = argparse.SUPPRESS
        group.add_argument(*flags, **options)


def _add_device_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device",
        default="auto",
        help=f"{', '.join(declared.constant('utils.py', 'DEVICE_CHOICES'))} or cuda:N (default auto: CUDA, then "
        "MPS, then CPU)",
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
BENCH_THREADS_HELP = (
    "alone: the thread benchmark (default choice vs 1 thread vs all cores, idle and loaded); with N: time the "
    "refiners on N CPU threads"
)


def _add_common_flags(command: argparse.ArgumentParser, name: str) -> None:
    """The flags every command takes: `--import FILE.py` (repeatable) and `--threads N`; bench takes `--threads`
    alone too (it runs the thread benchmark)."""
    command.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="FILE.py[:CLASS]",
        help="run this Python file first, so the PEs/refiners it registers can be used; with "
        ":CLASS also register that class as STEM:CLASS (repeatable)",
    )
    command.add_argument(
        "--threads",
        type=positive_int,
        metavar="N",
        **(dict(help=BENCH_THREADS_HELP, nargs="?", const=0) if name == "bench" else dict(help=THREADS_HELP)),
    )


# ----------------------------------------------------------------------------- one builder per command


def _demo(demo: argparse.ArgumentParser) -> None:
    demo.add_argument("--corpus", default="austen", help="corpus name or .txt/.gz path (default austen)")
    demo.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    demo.add_argument("--overwrite", action="store_true", help="replace an earlier demo in OUT")
    demo.add_argument("--steps", type=positive_int, help="training steps per model (default: the machine's budget)")
    demo.add_argument("--seed", type=int, default=0)
    _add_device_flag(demo)


def _train(train: argparse.ArgumentParser) -> None:
    _add_config_flags(train)
    run = train.add_argument_group("training")
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
        help="train a model that reads the future (a decoder that leaks, or --no-causal on next-byte prediction; "
        "refused otherwise): a deliberate leakage experiment",
    )
    _add_device_flag(run)


def _eval(evaluate: argparse.ArgumentParser) -> None:
    evaluate.add_argument("checkpoints", nargs="+", help="checkpoint files (or run directories)")
    evaluate.add_argument(
        "--lengths", type=positive_int, nargs="+", help="evaluation lengths (default: training length x 1, 2, 4, 8, 16)"
    )
    evaluate.add_argument("--protocol", choices=declared.constant("lab/evaluate.py", "PROTOCOLS"), default="last_k")
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


# The GPTConfig fields a CHE task sets: che hides their flags and refuses them.
CHE_SETS = ("vocab_size", "causal", "block_size")


def _che(che: argparse.ArgumentParser) -> None:
    tasks = declared.task_names()
    che.add_argument("--task", required=True, choices=tasks, metavar="TASK", help=f"one of: {', '.join(tasks)}")
    _add_config_flags(che, set_by_task=CHE_SETS)
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


def _bench(bench: argparse.ArgumentParser) -> None:
    bench.add_argument(
        "--size",
        choices=list(declared.constant("lab/bench.py", "SIZES")),
        nargs="+",
        help="model size(s) (default: tiny; on CUDA tiny and 125m)",
    )
    bench.add_argument("--device", default="auto", help="auto, cpu, cuda or mps (default auto)")
    bench.add_argument("--pe", type=registered("pe"), default="kerple_log", help="the base PE (default kerple_log)")
    bench.add_argument("--repeats", type=positive_int, default=10, help="timed steps per variant (default 10)")
    bench.add_argument("--quick", action="store_true", help="3 repeats, eval memory at 4096 instead of 16384")
    bench.add_argument("--eval-length", type=positive_int, default=16384, help="length of the eval-memory case")
    bench.add_argument("--no-memory", action="store_true", help="skip the peak-memory cases")
    bench.add_argument(
        "--rounds",
        type=positive_int,
        default=1,
        help="time each table in this many fresh processes and report the spread (default 1)",
    )
    bench.add_argument("--cape-table", action="store_true", help="only the comparison with CAPE's Table 1")
    bench.add_argument(
        "--bias-table",
        action="store_true",
        help="only the bias encodings, FlexAttention against SDPA (CUDA; T=--length, B=8)",
    )
    bench.add_argument("--length", type=positive_int, default=512, help="T of the CAPE-table comparison (default 512)")
    bench.add_argument("--batch", type=positive_int, default=32, help="B of the CAPE-table comparison (default 32)")


def _budget_flag(command: argparse.ArgumentParser, help: str) -> None:
    command.add_argument(
        "--budget",
        default="default",
        choices=list(declared.constant("study/budgets.py", "BUDGETS")),
        metavar="{" + ",".join(declared.constant("study/budgets.py", "BUDGET_NAMES")) + "}",
        help=help,
    )


def _rerun_flag(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--rerun",
        action="store_true",
        help="train again the runs in --out whose files record another corpus or configuration (refused "
        "otherwise); the old run's file is replaced, and a checkpoint kept of it removed",
    )


def _reproduce(reproduce: argparse.ArgumentParser) -> None:
    seeds, corpora = (declared.constant("study/budgets.py", name) for name in ("DEFAULT_SEEDS", "DEFAULT_CORPORA"))
    _budget_flag(
        reproduce,
        "small: fewer steps and a lighter evaluation; default: the committed report's (larger on CUDA by itself)",
    )
    reproduce.add_argument("--seeds", type=int, default=seeds, help=f"seeds per model (default {seeds}, at least 2)")
    reproduce.add_argument(
        "--corpus",
        nargs="+",
        default=list(corpora),
        help=f"corpus names or .txt/.gz paths (default: {' '.join(corpora)})",
    )
    reproduce.add_argument("--out", default="runs/reproduce", help="output directory (default runs/reproduce)")
    _rerun_flag(reproduce)
    _add_device_flag(reproduce)
    _add_cluster_flags(reproduce)


def _compare_description() -> str:
    budgets = declared.constant("study/budgets.py", "BUDGETS")
    leaky = declared.constant("study/claims.py", "LEAKY_REFINER")
    labels = [
        label
        for label, model in declared.constant("study/claims.py", "MODELS").items()
        if model.get("refiner") != leaky
    ]
    paragraphs = (
        "Train a model (--pe) and its baselines (--against) with --seeds seeds each, evaluate each at the "
        "training length x 1, 2, 4, 8, 16 (or --lengths) with both protocols, print the tables, the "
        "endpoints and a verdict per baseline, and write compare.md, compare.json, compare.png and one file "
        "per run into --out.",
        f"Models, one syntax for all: PE[+REFINER[:OPTION]...]. PE: {', '.join(known_names('pe'))}, several of them "
        "joined by commas (one per layer, e.g. rope,none,alibi for 3 layers; a shorter list repeats over the "
        "layers, and the report says what each layer got), or FILE.py:ClassName. REFINER: "
        f"{', '.join(name for name in known_names('refiner') if name != 'none')}, or "
        "FILE.py:ClassName. OPTION: K or k=K (odd kernel of the conv refiners, default 3), w=W (hidden width, "
        "default 32), w=matched (DAPE's MLP at the 1x3 conv refiner's parameter count). E.g. kerple_log+dape, "
        "kerple_log+conv:5, kerple_log+dape:w=matched. A model of the study is also named by its label: "
        f"{'; '.join(labels)}.",
        "Endpoints, per seed, the mean over both protocols of a log ratio of perplexity per byte: the model "
        "over each baseline at the training length, beyond it, at the longest length and over all lengths "
        "(t-test); each model's perplexity at 16x (or the longest length) over that at 1x (equivalence test, "
        "TOST, against ±--margin); each with its 95 % CI, t-test, exact sign-flip test and Holm's adjustment "
        "across all of them. The verdict per baseline rests on the beyond-length endpoint, and says so when the "
        "longest length disagrees with it (better near the training length, worse at the longest).",
        "Runs are resumable: each run's file records the corpus's sha256 and size and the full configuration, "
        "and is reused only when both match; one that does not is refused (naming the file and what differs) "
        "unless --rerun.",
        "Budgets (CPU; larger on CUDA): "
        + "; ".join(
            f"{name}: {b['n_layer']} layers x {b['n_embd']}, {b['n_head']} heads, {b['steps']} steps of "
            f"{b['batch_size']}, lr {b['lr']}, training length {b['train_lengths'][0]}"
            for name, b in budgets.items()
            if name in declared.constant("study/budgets.py", "BUDGET_NAMES")
        )
        + ".",
    )
    example = "python -m minidape compare --pe my_bias.py:MyBias --against alibi kerple_log kerple_log+dape"
    return "\n\n".join(textwrap.fill(paragraph, 100) for paragraph in paragraphs) + f"\n\nexample:\n  {example}"


def _compare(compare: argparse.ArgumentParser) -> None:
    baselines = declared.constant("study/comparison.py", "DEFAULT_BASELINES")
    seeds = declared.constant("study/budgets.py", "DEFAULT_SEEDS")
    margin = 100 * declared.constant("study/claims.py", "FLAT_MARGIN")
    cpu = declared.constant("study/budgets.py", "BUDGETS")["default"]
    compare.add_argument(
        "--pe", required=True, metavar="MODEL", help="the model under test: PE[+REFINER[:OPTION]...] (see above)"
    )
    compare.add_argument(
        "--against",
        nargs="+",
        default=list(baselines),
        metavar="MODEL",
        help=f"baselines, same syntax (default: {' '.join(baselines)})",
    )
    compare.add_argument(
        "--seeds",
        type=int,
        default=seeds,
        help=f"seeds per model (default {seeds}; at least 2; under {seeds} a warning says what the seeds cannot "
        "show: at 3 the sign-flip test cannot go below p = 0.25)",
    )
    compare.add_argument("--corpus", default="austen", help="corpus name or .txt/.gz path (default austen)")
    _budget_flag(compare, "model size, training and evaluation, each overridden by the flags below (default: default)")
    knobs = compare.add_argument_group("overrides of the budget (defaults: budget default's on CPU)")
    knobs.add_argument("--steps", type=positive_int, help=f"training steps per run (default {cpu['steps']})")
    knobs.add_argument("--batch-size", type=positive_int, help=f"windows per step (default {cpu['batch_size']})")
    knobs.add_argument("--lr", type=positive_float, help=f"peak learning rate, cosine schedule (default {cpu['lr']})")
    knobs.add_argument("--n-layer", type=positive_int, help=f"layers (default {cpu['n_layer']})")
    knobs.add_argument("--n-embd", type=positive_int, help=f"embedding width (default {cpu['n_embd']})")
    knobs.add_argument("--n-head", type=positive_int, help=f"attention heads (default {cpu['n_head']})")
    knobs.add_argument(
        "--train-length", type=positive_int, help=f"training length T (default {cpu['train_lengths'][0]})"
    )
    knobs.add_argument(
        "--lengths",
        type=positive_int,
        nargs="+",
        help="evaluation lengths: T, longer ones (multiples of T) and any shorter ones dividing T, which the "
        "endpoint over all lengths pools with the others (last_k then scores the shortest length's tokens at every "
        f"length) (default T x {' '.join(map(str, cpu['eval_factors']))})",
    )
    compare.add_argument(
        "--margin",
        type=positive_float,
        default=margin,
        help=f"equivalence margin of the degradation endpoint, in %% (default {margin:g}: within ±{margin:g} %%)",
    )
    compare.add_argument(
        "--out",
        help="output directory (default runs/compare/MODEL: the model's label, e.g. runs/compare/kerple-log-conv-k-5)",
    )
    _rerun_flag(compare)
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


def _grade(grade: argparse.ArgumentParser) -> None:
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


def _handout(handout: argparse.ArgumentParser) -> None:
    handout.add_argument("out", metavar="OUT", help="a new (or empty) folder")
    handout.add_argument("--notebooks", nargs="+", metavar="NN", help="only these notebooks, e.g. 03 04 (default: all)")


# name -> (one line for the command list, its description or None, the builder of its flags)
COMMAND_PARSERS = {
    "demo": (
        "train 7 PEs/refiners at length 128 and compare their extrapolation",
        "Train NoPE, RoPE, ALiBi, Kerple-log, FIRE, DAPE-Kerple and DAPE1x3-Kerple (the study's models of those "
        "names) at length 128, evaluate each up to 16x that length (last-256-tokens protocol), write results.md, "
        "results.json and extrapolation.png. Budget: 2 min 5 s on an idle 2-core CPU (README); larger on CUDA; "
        "tiny with MINIDAPE_QUICK=1.",
        _demo,
    ),
    "train": (
        "train one model",
        "Train one GPT; every GPTConfig field is a flag. Writes OUT/checkpoint.pt and OUT/history.json.",
        _train,
    ),
    "eval": (
        "perplexity by length of checkpoints: table + plot",
        "Evaluate checkpoints at several lengths; print a markdown table and write results.md, results.json and "
        "extrapolation.png.",
        _eval,
    ),
    "che": (
        "train and test an encoder on a Chomsky-hierarchy task",
        "Train an encoder on one CHE task with input lengths drawn from U(1, max-train-length), test it at longer "
        "lengths, print a table and write results.md, results.json and accuracy.png. The task sets vocab_size, "
        "causal=False and block_size; the other GPTConfig fields are flags.",
        _che,
    ),
    "bench": (
        "refiner speed and memory benchmark (minidape.lab.bench)",
        declared.docstring("lab/bench.py").split("\n\n")[0],
        _bench,
    ),
    "reproduce": (
        "test the papers' claims C1-C6 with seeds, intervals and Holm-adjusted tests",
        "Train and evaluate the claim study (KERPLE, DAPE, DAPE-V2: claims C1-C6) and write REPRODUCTION.md, "
        "results.json and figures/ into --out. Resumable: the same command skips the runs already done; other "
        "settings into the same --out are refused.\n\nexample:\n  python -m minidape reproduce --budget small "
        "--out runs/reproduce-small",
        _reproduce,
    ),
    "compare": ("a model against baselines: every endpoint with intervals, tests and Holm", None, _compare),
    "grade": (
        "grade students' notebooks against the teacher's edition",
        "Run each submission in its own sandbox with the teacher's check cells restored; judge every exercise of "
        "its notebook in the grader's process. A folder stands for its *.ipynb files and its student folders (one "
        "per student: folder/<id>/*.ipynb).",
        _grade,
    ),
    "handout": (
        "write what a teacher hands out: the student edition and a wheel",
        "From a checkout: OUT/notebooks/NN_topic.ipynb (the student edition: no solution cells, no outputs), the "
        "package as a wheel, and a README for students. Refused if any line of a worked solution would be in it.",
        _handout,
    ),
}


def build_parser(prog: str = "python -m minidape") -> argparse.ArgumentParser:
    parser = Parser(
        prog=prog,
        description=f"Command line: {prog} {{{','.join(COMMAND_PARSERS)}}} ... (--help on each)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name, (summary, description, add_flags) in COMMAND_PARSERS.items():
        if name == "compare":
            description = _compare_description()
        options = dict(help=summary, description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
        command = commands.add_parser(name, **options)
        _add_common_flags(command, name)
        add_flags(command)
    return parser
