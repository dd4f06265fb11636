"""Users' own code: a Python file imported once as a module (its `@md.register_pe` / `register_refiner` take
effect), a `FILE.py:ClassName` registered on the fly (the CLI's `--import`, `--pe`, `compare`'s models), and the
file that defines a registered class (recorded in checkpoints and reports)."""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path

from torch import nn

from ..model import (
    PE_KINDS,
    PE_REGISTRY,
    REFINER_REGISTRY,
    register_pe,
    register_refiner,
)
from ..utils import user_path


def import_file(path: str | os.PathLike):
    """Run a user's Python file once as a module (its `@md.register_pe` / `register_refiner` take effect).

    The module is named after the file's resolved path, so importing the same file again (a second command
    in one process, or `--import` given twice) does not register its names twice; a file edited since it was
    imported (a notebook working on it) runs again, and its registrations take the new classes.
    """
    path = user_path(path, "--import")
    if path.is_dir():
        raise ValueError(f"--import {str(path)!r} is a folder; give a Python file ending in .py")
    if path.suffix != ".py":
        raise ValueError(f"--import needs a Python file ending in .py, got {str(path)!r}")
    if not path.is_file():
        raise FileNotFoundError(f"--import {str(path)!r}: no such file")
    path = path.resolve()
    name = f"minidape_user_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:10]}"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if getattr(sys.modules.get(name), "__minidape_sha256__", None) == digest:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    module.__minidape_sha256__ = digest
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as err:  # the user's code failed, or tried to end the command: say where
        del sys.modules[name]
        line = (
            err.lineno
            if isinstance(err, SyntaxError)
            else next((frame.lineno for frame in reversed(inspect.trace()) if Path(frame.filename) == path), "?")
        )
        what = (
            f"called exit ({err.code!r}): a file to import must define and register, not end the command"
            if isinstance(err, SystemExit)
            else f"{type(err).__name__}: {err}"
        )
        raise ValueError(f"--import {str(path)!r} failed at line {line}: {what}") from err
    return module


def register_class(spec: str, what: str = "--import") -> tuple[str, str, str]:
    """``FILE.py:ClassName``, a positional encoding or refiner class in a user's file: the file imported
    (`import_file`) and the class registered under ``STEM:ClassName``, unless the file registered it itself.
    Returns ``(kind, registered name, sha256 of the file)``, kind "pe" or "refiner" by the class's base."""
    file_name, _, class_name = spec.rpartition(":")
    path = user_path(file_name, what)
    if path.suffix != ".py" or not class_name:
        raise ValueError(f"{what} {spec!r}: expected FILE.py:ClassName")
    if not path.is_file():
        raise FileNotFoundError(f"{what} {spec!r}: no file {str(path)!r}")
    try:
        module = import_file(path)
    except ValueError as err:  # the user's file: any error there is theirs, reported in one line
        raise ValueError(f"{what} {spec!r}: {err}") from err
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type) or not issubclass(cls, nn.Module):
        found = [
            name
            for name, value in vars(module).items()
            if isinstance(value, type) and issubclass(value, nn.Module) and value.__module__ == module.__name__
        ]
        problem = f"defines no {class_name!r}" if cls is None else f"{class_name} is not an nn.Module class"
        raise ValueError(f"{what} {spec!r}: {path} {problem}; its module classes: {', '.join(found) or 'none'}")
    kind = "pe" if issubclass(cls, PE_KINDS) else "refiner"
    registry = PE_REGISTRY if kind == "pe" else REFINER_REGISTRY
    registered = [name for name, value in registry.items() if value is cls]  # by the file, or by an earlier call
    name = registered[0] if registered else f"{path.stem}:{class_name}"
    if not registered:
        (register_pe if kind == "pe" else register_refiner)(name)(cls)
    return kind, name, module.__minidape_sha256__


def source_file(cls: type | None) -> str | None:
    """The file that defines a user's class, or None for minidape's own classes, for classes without a file
    (typed into a notebook cell or a REPL) and for no class (the refiner "none")."""
    try:
        path = Path(inspect.getfile(cls)).resolve()
    except (TypeError, OSError):
        return None
    package = Path(__file__).resolve().parents[1]  # minidape/, above lab/
    return None if package in path.parents or not path.is_file() else str(path)
