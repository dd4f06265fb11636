"""Small helpers shared by the modules: devices, precision, number checks, users' paths, folder locks, atomic
writes, the results writer and model labels.

Torch only (no matplotlib, no tqdm), and nothing of the package: the floor every room stands on, beside the core
(the memory estimate lives with what it estimates, in `lab/memory.py`; users' files are read by
`lab/user_code.py`).
"""

from __future__ import annotations

import contextlib
import functools
import glob
import inspect
import json
import math
import numbers
import os
import tempfile
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no flock; folders are then not locked
    fcntl = None

import torch
from torch import nn

DEVICE_CHOICES = ("auto", "cpu", "cuda", "mps")


# ----------------------------------------------------------------------------- devices and precision


def device_kind(device: str) -> str:
    """The kind of a device named as text (``"cuda:1"`` -> ``"cuda"``), or a ValueError naming the valid choices.
    Needs no torch: the command line checks `--device` with it before torch loads (`declared.code_without_torch`)."""
    kind = str(device).split(":")[0]
    if kind not in DEVICE_CHOICES:
        raise ValueError(f"unknown device {device!r}; valid choices: {', '.join(DEVICE_CHOICES)} (cuda:N too)")
    return kind


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """`"auto"` picks CUDA, then Apple's MPS, then the CPU; anything else is checked and returned."""
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    kind = device_kind(device)
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available; use 'auto' or 'cpu'")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {device!r} requested but MPS is not available; use 'auto' or 'cpu'")
    return torch.device(device)


def model_device(model: nn.Module) -> torch.device:
    """The device of a model's parameters: where the tensors given to it must go."""
    parameter = next(model.parameters(), None)
    return torch.device("cpu") if parameter is None else parameter.device


def autocast_for(device: torch.device):
    """bf16 autocast on CUDA; full precision elsewhere (CPU bf16 is slower than fp32 for these sizes)."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


# ----------------------------------------------------------------------------- checks


QUICK_MODE_VARIABLES = ("MINIDAPE_QUICK", "MINIDAPE_FAST")
QUICK_MODE_VALUES = {"1": True, "0": False, "": False}


def quick_mode() -> bool:
    """True when the environment asks for CI's quick run, `MINIDAPE_QUICK=1` (tests and CI: fewer steps and
    shorter lengths, the same code paths); `0`, empty or unset: full runs. Any other value is a ValueError: a
    `false` read as "set" would switch quick mode on unnoticed. `MINIDAPE_FAST=1`, the design contract's name for
    it from before the fast path (`GPTConfig(fast=...)`) took the word, works too."""
    values = {name: os.environ.get(name, "") for name in QUICK_MODE_VARIABLES}
    for name, value in values.items():
        if value.strip() not in QUICK_MODE_VALUES:
            raise ValueError(
                f"{name}={value!r} is not a quick-mode setting; valid values: 1 (quick mode: fewer "
                f"steps, shorter lengths) and 0 or empty (full runs)"
            )
    return any(QUICK_MODE_VALUES[value.strip()] for value in values.values())


def check_number(name: str, value, minimum: float, integer: bool = True, allow_none: bool = True):
    """`value` itself if it is a number >= `minimum` (an integer when `integer`), or None when `allow_none`;
    else a ValueError naming `name`, the rule and the value. Bools are not numbers here."""
    if value is None and allow_none:
        return None
    kind = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kind) or not value >= minimum:
        raise ValueError(f"{name} must be {'an integer' if integer else 'a number'} >= {minimum}, got {value!r}")
    return value


# ----------------------------------------------------------------------------- files


def user_path(path: str | os.PathLike, what: str) -> Path:
    """`path` with `~` expanded; a `~user` that does not exist is a ValueError naming `what` and the path
    (pathlib's own error names neither); anything but a str or a path is a TypeError naming `what`."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what} must be a path (a str or a pathlib.Path), got {path!r} ({type(path).__name__})")
    try:
        return Path(path).expanduser()
    except RuntimeError as err:
        raise ValueError(f"{what} {str(path)!r}: cannot expand {str(path).split(os.sep)[0]!r}: no such user") from err


LOCK_NAME = ".minidape.lock"
_HELD_LOCKS: dict[Path, int] = {}  # lock files this process holds -> how many with-blocks hold each


@contextlib.contextmanager
def file_lock(lock: str | os.PathLike, shared: bool = False):
    """Hold an OS lock (`flock`) on the file `lock` for the with-block; yields None when this process holds it,
    else the PID written by the process that does (a string, "unknown" when it cannot be read), without
    waiting. The OS releases the lock when its holder dies, so a killed run never leaves its folder locked.
    Shared locks (`shared=True`) coexist with each other and exclude an exclusive one. The lock file is
    removed by the last holder; a process that locked a file just removed tries again on the new one. A lock
    this process holds already is held again (`train` inside a command that holds its folder)."""
    lock = Path(lock).resolve()
    if fcntl is None or lock in _HELD_LOCKS:
        _HELD_LOCKS[lock] = _HELD_LOCKS.get(lock, 0) + 1
        try:
            yield None
        finally:
            _HELD_LOCKS[lock] -= 1
            if not _HELD_LOCKS[lock]:
                del _HELD_LOCKS[lock]
        return
    lock.parent.mkdir(parents=True, exist_ok=True)
    while True:
        descriptor = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(descriptor, 32).decode(errors="replace").strip() or "unknown"
            os.close(descriptor)
            yield holder
            return
        try:
            same_file = os.stat(lock).st_ino == os.fstat(descriptor).st_ino
        except FileNotFoundError:
            same_file = False
        if same_file:
            break
        os.close(descriptor)  # removed by its last holder while we waited: lock the new one
    _HELD_LOCKS[lock] = 1
    try:
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, str(os.getpid()).encode(), 0)
        yield None
    finally:
        del _HELD_LOCKS[lock]
        try:  # the last holder (no other shared one) removes the file
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            lock.unlink(missing_ok=True)
        except BlockingIOError:
            pass
        os.close(descriptor)


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike, what: str = "--out", shared: bool = False):
    """Hold `folder` (created if needed) for the with-block, so that no other minidape process writes a run or
    results into it meanwhile; a folder another process holds is a one-line ValueError naming it and that
    process. `shared=True`: processes sharing their work in one folder (`reproduce`) hold it together. A folder
    created here and left empty (the command failed before writing) is removed again."""
    folder = Path(folder)
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with file_lock(folder / LOCK_NAME, shared) as holder:
            if holder is not None:
                raise ValueError(
                    f"{what} {str(folder)!r} is in use by another minidape process (PID {holder}); "
                    f"wait for it to finish or choose another {what}"
                )
            yield folder
    finally:
        if created:
            with contextlib.suppress(OSError):  # not empty (the run wrote files), or taken by another process
                folder.rmdir()


def holds_out_folder(shared: bool = False):
    """Decorator: a call's `out` folder (its argument `out`, when not None) is held with `folder_lock` for the
    whole call, so a second process writing there is refused before any work. Under torchrun only rank 0,
    the one that writes, holds it; a study's `step` (one run of its list, or the report, run by a cluster's
    scheduler on many machines at once) holds nothing: a network filesystem may not honour the lock, and each run
    writes its own file, atomically."""

    def decorate(function):
        signature = inspect.signature(function)

        @functools.wraps(function)
        def holding(*args, **options):
            bound = signature.bind(*args, **options)
            bound.apply_defaults()
            out = bound.arguments["out"]
            if out is None or int(os.environ.get("RANK", "0")) != 0 or bound.arguments.get("step") is not None:
                return function(*args, **options)
            with folder_lock(check_writable_folder(out), "out", shared):
                return function(*args, **options)

        return holding

    return decorate


def _temporary_beside(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMPORARY_SUFFIX)
    os.close(fd)
    return Path(tmp)


def _publish(tmp: Path, path: Path) -> None:
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes the file private; give it the usual mode
    os.replace(tmp, path)


def _write_error(path: Path, err: OSError) -> OSError:
    """An OSError that names the file being written (a failed write's own names none: "[Errno 28] No space
    left on device")."""
    return OSError(f"cannot write {path}: {err.strerror or err}")


TEMPORARY_SUFFIX = ".tmp"


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path beside `path` (`.NAME.*.tmp`); on success move it over `path` in one step
    (`os.replace`). Readers therefore see either the old file or the complete new one, never a half-written
    file; a failure (a full disk) removes the temporary file and is an OSError naming `path`."""
    path = Path(path)
    tmp = None
    try:
        try:
            tmp = _temporary_beside(path)
            yield tmp
            _publish(tmp, path)
        except OSError as err:
            raise _write_error(path, err) from err
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)


def remove_stale_temporaries(folder: str | os.PathLike, names) -> None:
    """Remove the temporary files (`.NAME.*.tmp`) that `atomic_path` left in `folder` for the files `names`
    when its process was killed mid-write. Only for a folder this process holds (`folder_lock`), where no
    other process is writing."""
    for name in names:
        for stale in Path(folder).glob(f".{glob.escape(name)}.*{TEMPORARY_SUFFIX}"):
            stale.unlink(missing_ok=True)


def write_together(writers: dict) -> None:
    """Write files that belong together: `{path: write(temporary_path)}`, each into a temporary file beside its
    path, then all moved into place. A failure in any (a full disk) leaves none of them written, and is an
    OSError naming the file."""
    temporaries = {}
    try:
        for path, write in writers.items():
            path = Path(path)
            try:
                temporaries[path] = _temporary_beside(path)
                write(temporaries[path])
            except OSError as err:
                raise _write_error(path, err) from err
        for path, tmp in temporaries.items():
            _publish(tmp, path)
    finally:
        for tmp in temporaries.values():
            tmp.unlink(missing_ok=True)


def check_writable_folder(folder: str | os.PathLike, what: str = "out") -> Path:
    """Fail now, before any work, if `folder` cannot become a folder we write into.

    Nothing is created: the nearest existing ancestor must be a folder in which a file can be made (tried with
    a temporary file, removed at once), so a path under a file, or in a read-only place, is named here.
    """
    folder = user_path(folder, what)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{what}={str(folder)!r} is a file, not a folder; give a folder for the run")
    existing = folder
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{what}={str(folder)!r} cannot be created: {str(existing)!r} is a file")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        raise ValueError(
            f"{what}={str(folder)!r} is not writable: cannot create files in {str(existing)!r} ({err.strerror or err})"
        ) from err
    return folder


# Every command's results: a folder holding any of them is not written into without --overwrite.
RESULT_FILES = ("results.md", "results.json", "compare.md", "compare.json", "REPRODUCTION.md")


def refuse_to_replace(out: str | os.PathLike, earlier, overwrite: bool, what: str = "--out") -> Path:
    """Before any work: `out` must be a folder we can write, holding none of the files `earlier` (names in it)
    unless `overwrite`; returns `out` as a Path."""
    out = check_writable_folder(out, what)
    found = [name for name in earlier if (out / name).exists()]
    if found and not overwrite:
        raise ValueError(
            f"{what} {str(out)!r} already holds earlier results ({', '.join(found)}); pass "
            f"--overwrite to replace them, or choose another {what}"
        )
    return out


def json_ready(value):
    """`value` with NaN and infinities made `null`, so that the file is strict JSON (readable by any parser)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(key): json_ready(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(item) for item in value]
    return value


def write_results(
    out: str | os.PathLike, title: str, table: str, details: dict, payload: dict, figures: dict | None = None
) -> Path:
    """The one results writer: `out/results.md` (the title, the markdown table, then one line per scalar
    detail), `out/results.json` (`payload`, strict JSON) and the `figures` (`{name: write(path)}`, e.g. a plot),
    written together (`write_together`: all of them, or on a failure none); returns `out`."""
    out = Path(out)
    settings = "\n".join(f"- {key}: {value}" for key, value in details.items() if not isinstance(value, dict))
    write_together(
        {
            out / "results.md": lambda tmp: tmp.write_text(f"# {title}\n\n{table}\n{settings}\n"),
            out / "results.json": lambda tmp: tmp.write_text(json.dumps(json_ready(payload), indent=1) + "\n"),
            **{out / name: write for name, write in (figures or {}).items()},
        }
    )
    return out


# ----------------------------------------------------------------------------- names


def model_label(cfg) -> str:
    """A model's short name: ``pe`` or ``pe+refiner``; ``+rp`` marks randomized positions."""
    label = cfg.pe if cfg.refiner == "none" else f"{cfg.pe}+{cfg.refiner}"
    return label + ("+rp" if getattr(cfg, "random_positions", 0) else "")
