"""Command line: `python -m minidape COMMAND ...` (or the installed `minidape COMMAND ...`; `--help` on each).

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
A mistake in the command line is one line on stderr and exit code 2. This file reads the command line with the
parser of `minidape.flags`, which loads no torch, so `--help` and a mistaken flag answer at once; what each command
does is in `minidape.commands` (which calls the study, the grader and the benchmark), imported once the command line
is read.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from . import declared
from .early_checks import refuse_before_loading
from .flags import build_parser
from .threads import THREADS_VARIABLE


def _imported_files(argv: list[str]) -> list[str]:
    """The `--import FILE.py` values of a command line, read before the full parser is built so that the names
    they register are among the choices of `--pe` and `--refiner`."""
    early = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    early.add_argument("--import", dest="imports", action="append", default=[])
    return early.parse_known_args(argv)[0].imports


def import_user_code(spec: str) -> None:
    """`--import FILE.py` runs the file; `--import FILE.py:ClassName` also registers that class (as
    ``STEM:ClassName``, unless the file registers it itself), the form `--pe` / `--refiner` accept too."""
    from .lab.user_code import import_file, register_class

    if ":" in spec and not spec.endswith(".py"):
        register_class(spec, "--import")
    else:
        import_file(spec)


def program_name() -> str:
    """How the user called us: `minidape` (the installed script) or `python -m minidape`."""
    return "minidape" if Path(sys.argv[0]).name == "minidape" else "python -m minidape"


def activation_size(args: argparse.Namespace) -> int | None:
    """Elements of one activation (batch x T x n_embd) of what `train` and `che` train, for the thread count."""
    defaults = {name: default for name, _, default in declared.config_fields()}
    width = getattr(args, "n_embd", defaults["n_embd"])
    if args.command == "train":  # no --batch-size: the default, or a resumed run's own
        batch_size = args.batch_size or declared.constant("lab/train.py", "DEFAULT_SETTINGS")["batch_size"]
        return batch_size * getattr(args, "block_size", defaults["block_size"]) * width
    if args.command == "che":
        return args.batch_size * args.max_train_length * width
    return None


def set_threads(args: argparse.Namespace) -> None:
    """Set torch's CPU threads for this command (see `minidape.threads`); minidape's own settings (`--threads`,
    MINIDAPE_THREADS) are said on stderr. The grader's `--threads` is its workers' (`grade.worker_env` passes
    MINIDAPE_THREADS on)."""
    from .threads import use_threads

    if args.command == "grade" and args.threads is not None:
        os.environ[THREADS_VARIABLE] = str(args.threads)
    choice = use_threads(args.threads, activation_size(args))
    if args.threads is not None or os.environ.get(THREADS_VARIABLE):
        print(f"minidape: {choice}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    prog = program_name()
    try:
        for path in _imported_files(argv):  # first: the names they register become valid choices below
            import_user_code(path)
        parser = build_parser(prog)
        args = parser.parse_args(argv)
        args.argv = argv  # the command line as given: --list-runs prints it per run
        refuse_before_loading(args, parser)
        from .commands import COMMANDS, bench_command  # the command line is read: now torch and the rest load

        if args.command == "bench":
            return bench_command(args)  # it sets its threads itself: alone, --threads is its thread benchmark
        set_threads(args)
        COMMANDS[args.command](args)
    except KeyboardInterrupt as interrupted:  # in training, the message says which checkpoint survives
        print(f"{prog}: {interrupted or 'interrupted'}", file=sys.stderr)
        sys.exit(getattr(interrupted, "exit_code", 130))  # SIGTERM, SIGHUP: 128 + the signal's number
    except (ValueError, TypeError, OSError, FloatingPointError, MemoryError) as err:  # the user's mistake: one line
        print(f"{prog}: error: {' '.join(str(err).split())}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
