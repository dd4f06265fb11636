"""Small helpers shared by the modules: devices, precision, number checks, atomic writes, the results writer,
model labels, and loading a user's registrations from a Python file.

Torch only (no matplotlib, no tqdm), so that `evaluate`, `plots`, `train` and `che` can all use it without
importing one another.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import inspect
import json
import math
import numbers
import os
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

DEVICE_CHOICES = ("auto", "cpu", "cuda", "mps")


# ----------------------------------------------------------------------------- devices and precision


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
    kind = str(device).split(":")[0]
    if kind not in DEVICE_CHOICES:
        raise ValueError(f"unknown device {device!r}; valid choices: {', '.join(DEVICE_CHOICES)} (cuda:N too)")
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


def fast_mode() -> bool:
    """True when the environment asks for a quick run (`MINIDAPE_FAST=1`): tests and CI, same code paths."""
    return os.environ.get("MINIDAPE_FAST", "0") not in ("", "0")


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


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path beside `path`; on success move it over `path` in one step (`os.replace`).

    Readers therefore see either the old file or the complete new one, never a half-written file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)               # mkstemp makes the file private; give it the usual mode
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def check_writable_folder(folder: str | os.PathLike, what: str = "out") -> Path:
    """Fail now, before any work, if `folder` cannot become a folder we write into.

    Nothing is created: the nearest existing ancestor must be a folder in which a file can be made (tried with
    a temporary file, removed at once), so a path under a file, or in a read-only place, is named here.
    """
    folder = Path(folder).expanduser()
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
        raise ValueError(f"{what}={str(folder)!r} is not writable: cannot create files in {str(existing)!r} "
                         f"({err.strerror or err})") from err
    return folder


def json_ready(value):
    """`value` with NaN and infinities made `null`, so that the file is strict JSON (readable by any parser)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(key): json_ready(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(item) for item in value]
    return value


def write_results(out: str | os.PathLike, title: str, table: str, details: dict, payload: dict) -> Path:
    """The one results writer: `out/results.md` (the title, the markdown table, then one line per scalar
    detail) and `out/results.json` (`payload`, strict JSON), each written atomically; returns `out`."""
    out = Path(out)
    settings = "\n".join(f"- {key}: {value}" for key, value in details.items() if not isinstance(value, dict))
    with atomic_path(out / "results.md") as tmp:
        tmp.write_text(f"# {title}\n\n{table}\n{settings}\n")
    with atomic_path(out / "results.json") as tmp:
        tmp.write_text(json.dumps(json_ready(payload), indent=1) + "\n")
    return out


# ----------------------------------------------------------------------------- names and users' code


def model_label(cfg) -> str:
    """A model's short name: ``pe`` or ``pe+refiner``; ``+rp`` marks randomized positions."""
    label = cfg.pe if cfg.refiner == "none" else f"{cfg.pe}+{cfg.refiner}"
    return label + ("+rp" if getattr(cfg, "random_positions", 0) else "")


def import_file(path: str | os.PathLike):
    """Run a user's Python file once as a module (its `@md.register_pe` / `register_refiner` take effect).

    The module is named after the file's resolved path, so importing the same file again (a second command
    in one process, or `--import` given twice) does not register its names twice.
    """
    path = Path(path).expanduser()
    if path.suffix != ".py":
        raise ValueError(f"--import needs a Python file ending in .py, got {str(path)!r}")
    if not path.is_file():
        raise FileNotFoundError(f"--import {str(path)!r}: no such file")
    path = path.resolve()
    name = f"minidape_user_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:10]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # the user's code failed: say where, in one line
        del sys.modules[name]
        line = err.lineno if isinstance(err, SyntaxError) else next(
            (frame.lineno for frame in reversed(inspect.trace()) if Path(frame.filename) == path), "?")
        raise ValueError(f"--import {str(path)!r} failed at line {line}: {type(err).__name__}: {err}") from err
    return module


def source_file(cls: type | None) -> str | None:
    """The file that defines a user's class, or None for minidape's own classes, for classes without a file
    (typed into a notebook cell or a REPL) and for no class (the refiner "none")."""
    try:
        path = Path(inspect.getfile(cls)).resolve()
    except (TypeError, OSError):
        return None
    package = Path(__file__).resolve().parent
    return None if package in path.parents or not path.is_file() else str(path)
