"""Checkpoints: plain state (tensors, numbers, strings) that loads with `weights_only=True`, written atomically,
read with errors that name the file and what is wrong with it, and turned back into a model.

A checkpoint holds the state dict, the config as a dict (`asdict(GPTConfig)`), the optimizer's state, the step,
the seed, the history and the file of each user-registered class, so that loading it can say which `--import`
it needs. Nothing in it names a Python module: a checkpoint written before the package's modules moved loads
after the move.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch
from torch import nn

from ..model import GPT, PE_REGISTRY, REFINER_REGISTRY, GPTConfig, pe_names
from ..utils import atomic_path, resolve_device, user_path
from .user_code import source_file

CHECKPOINT_NAME = "checkpoint.pt"
RUN_FILES = (CHECKPOINT_NAME, "history.json")  # a run folder's files (history.json: the CLI's)
CHECKPOINT_KEYS = ("model", "config", "optimizer", "step", "seed", "history")
CHECKPOINT_TYPES = {
    "model": (dict,),
    "config": (dict,),
    "optimizer": (dict, type(None)),
    "step": (int,),
    "seed": (int,),
    "history": (list,),
}


def save_checkpoint(
    path: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    step: int = 0,
    seed: int = 0,
    history: list[dict] | None = None,
    **extra,
) -> Path:
    """Write a checkpoint of plain state (tensors, numbers, strings) that loads with `weights_only=True`.

    Keys: `model` (state dict), `config` (`asdict(model.cfg)`), `optimizer`, `step` (updates done), `seed`,
    `history`, `sources` (the file of each user-registered PE or refiner class, so that loading it can say
    which `--import` it needs), plus any JSON-like `extra` (e.g. `corpus`).
    """
    cfg = model.cfg
    pe_sources = [source_file(PE_REGISTRY[name]) for name in pe_names(cfg.pe)]  # a per-layer spec names several
    sources = {
        "pe": next((path for path in pe_sources if path), None),
        "refiner": source_file(REFINER_REGISTRY[cfg.refiner]),
    }
    checkpoint = {
        "model": model.state_dict(),
        "config": dataclasses.asdict(cfg),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "step": step,
        "seed": seed,
        "history": list(history or []),
        "sources": {kind: path for kind, path in sources.items() if path is not None},
        **extra,
    }
    with atomic_path(path) as tmp:
        try:
            torch.save(checkpoint, tmp)
        except RuntimeError as err:  # torch's zip writer reports a failed write so, without the OS's reason
            raise OSError(f"the write failed, as on a full disk ({str(err).splitlines()[0]})") from err
    return Path(path)


def checkpoint_file(path: str | os.PathLike) -> Path:
    """The checkpoint file a path names (a directory means its `checkpoint.pt`), or FileNotFoundError. Needs no
    torch: the command line checks `eval`'s checkpoints and `train --resume`'s with it before torch loads."""
    path = user_path(path, "checkpoint path")
    if path.is_dir():
        path = path / CHECKPOINT_NAME
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    return path


def read_checkpoint(path: str | os.PathLike, device: str | torch.device = "cpu") -> dict:
    """Load a checkpoint dict (a directory means its `checkpoint.pt`), with clear errors for bad files."""
    path = checkpoint_file(path)
    try:
        checkpoint = torch.load(path, map_location=device, weights_only=True)
    except Exception as err:  # torch raises several types (EOFError, RuntimeError, UnpicklingError, ...)
        raise ValueError(
            f"cannot read checkpoint {path}: the file is truncated or corrupt ({type(err).__name__}: {err})"
        ) from err
    missing = [key for key in CHECKPOINT_KEYS if not isinstance(checkpoint, dict) or key not in checkpoint]
    if missing:
        raise ValueError(f"{path} is not a minidape checkpoint: missing {', '.join(missing)}")
    for key, kinds in CHECKPOINT_TYPES.items():
        if not isinstance(checkpoint[key], kinds):
            raise ValueError(
                f"{path} is not a minidape checkpoint: its {key} is a {type(checkpoint[key]).__name__}, "
                f"where a {' or '.join(kind.__name__ for kind in kinds)} belongs"
            )
    return checkpoint


def checkpoint_config(checkpoint: dict, where: str | os.PathLike = "the checkpoint") -> GPTConfig:
    """The `GPTConfig` of a checkpoint. A field this version does not know, or a PE or refiner that is not
    registered in this process (a user's, whose file was not imported), is a ValueError saying what to do."""
    config = checkpoint["config"]
    known = {f.name for f in dataclasses.fields(GPTConfig)}
    unknown = sorted(set(config) - known)
    if unknown:
        raise ValueError(
            f"{where}: its config has fields unknown to GPTConfig: {', '.join(unknown)}; "
            f"known fields: {', '.join(sorted(known))}"
        )
    for kind, registry in (("pe", PE_REGISTRY), ("refiner", REFINER_REGISTRY)):
        names = pe_names(str(config.get(kind))) if kind == "pe" else [config.get(kind)]  # pe: per-layer spec
        missing = [name for name in names if name is not None and name not in registry]
        if missing:
            source = checkpoint.get("sources", {}).get(kind)
            if source and ":" in config[kind]:  # registered from FILE.py:ClassName (`--pe FILE.py:ClassName`)
                source = f"{source}:{config[kind].rpartition(':')[2]}"
            where_from = (
                f"it was registered by {source}: import it first (CLI: --import {source})"
                if source
                else "import the file that registers it first (CLI: --import FILE.py)"
            )
            raise ValueError(f"{where} uses {kind} {missing[0]!r}, which is not registered here; {where_from}")
    # Fields added since the checkpoint was written, whose defaults changed what the model holds: the values that
    # model was built with (issue 48). fox_gate_init only sets the start, which loaded weights replace.
    config = {**config}
    if "cope_positions" not in config and "block_size" in config:
        config["cope_positions"] = config["block_size"]  # CoPE had block_size position slots
    try:
        return GPTConfig(**config)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: its config is not valid: {err}") from err


def load_weights(model: nn.Module, weights: dict, where: str | os.PathLike) -> None:
    """Load a checkpoint's `weights` into `model`, built from its config; weights that do not fit that config
    (a missing or stray tensor, another shape) are a ValueError naming `where` and the first mismatch."""
    expected = model.state_dict()
    mismatches = [
        f"{key} is missing"
        if key not in weights
        else f"{key} has shape {tuple(weights[key].shape)} where its config needs {tuple(tensor.shape)}"
        for key, tensor in expected.items()
        if key not in weights or getattr(weights[key], "shape", None) != tensor.shape
    ]
    mismatches += [f"it holds {key}, which its config has no place for" for key in weights if key not in expected]
    if mismatches:
        raise ValueError(
            f"{where}: its weights do not fit its config ({len(mismatches)} mismatch(es)); first: {mismatches[0]}"
        )
    # a NaN or inf weight makes every output NaN: evaluated, "n/a" with no reason; CoPE's positions an index
    # out of bounds
    broken = [key for key, tensor in weights.items() if tensor.is_floating_point() and not tensor.isfinite().all()]
    if broken:
        raise ValueError(
            f"{where}: {len(broken)} of its weight tensors hold NaN or inf (first: {broken[0]}); the run it "
            f"saves diverged or the file was altered: train again (or resume from an earlier checkpoint)"
        )
    model.load_state_dict(weights)


def load_checkpoint(path: str | os.PathLike, device: str | torch.device = "cpu") -> tuple[GPT, dict]:
    """Rebuild the model of a checkpoint on `device`, in eval mode; returns `(model, checkpoint)`.

    The checkpoint dict carries `step`, `history`, `config` and whatever else training stored
    (e.g. `corpus`, a `data.corpus_identity`).
    """
    device = resolve_device(device)
    checkpoint = read_checkpoint(path, device)
    model = GPT(checkpoint_config(checkpoint, path)).to(device)
    load_weights(model, checkpoint["model"], path)
    return model.eval(), checkpoint
