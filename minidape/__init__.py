"""minidape: positional encodings, DAPE/CAPE refiners and length extrapolation in a small GPT.

The model, the corpora and the training loop are imported here; every other module (`evaluate`, `plots`,
`tasks`, `che`, `kernels`, ...) is imported on first use (PEP 562 `__getattr__`), so that `import minidape.model`
stays quick and loads neither matplotlib nor tqdm.
"""

import importlib

from . import threads  # first, before torch loads: OpenMP's idle threads sleep instead of spinning

# isort: split
from . import fast  # installs the fast path into model.SelfAttention (model.py itself imports nothing from it)
from .data import load_corpus
from .model import (
    GPT,
    PE_NAMES,
    REFINER_NAMES,
    AbsolutePositions,
    AdditiveBias,
    DataDependentBias,
    GPTConfig,
    RotaryEmbedding,
    check_causal,
    register_pe,
    register_refiner,
)
from .train import train  # md.train is the function; `from minidape.train import ...` reaches the module

# Submodules loaded on first access as md.NAME. `train` is imported above so that the name stays the function:
# a submodule imported later would not replace it, as Python sets the package attribute on first import only.
LAZY_MODULES = ("che", "data", "evaluate", "exercises", "grade", "kernels", "plots", "study", "tasks", "utils")


def __getattr__(name: str):
    if name in LAZY_MODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(LAZY_MODULES))


__all__ = [
    "GPT",
    "GPTConfig",
    "PE_NAMES",
    "REFINER_NAMES",
    "AdditiveBias",
    "DataDependentBias",
    "AbsolutePositions",
    "RotaryEmbedding",
    "register_pe",
    "register_refiner",
    "check_causal",
    "load_corpus",
    "train",
    *LAZY_MODULES,
]
