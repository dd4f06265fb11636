"""minidape: positional encodings, DAPE/CAPE refiners and length extrapolation in a small GPT."""
from . import kernels
from . import data, evaluate, plots
from . import tasks
from .data import load_corpus
from .model import (
    GPT,
    PE_NAMES,
    REFINER_NAMES,
    AbsolutePositions,
    AdditiveBias,
    GPTConfig,
    RotaryEmbedding,
    register_pe,
    register_refiner,
)
from .model import check_causal
from .train import train  # md.train is the function; `from minidape.train import ...` reaches the module

__all__ = [
    "GPT", "GPTConfig", "PE_NAMES", "REFINER_NAMES", "AdditiveBias", "AbsolutePositions", "RotaryEmbedding",
    "register_pe", "register_refiner", "kernels",
    "load_corpus", "train", "data", "evaluate", "plots", "tasks",
]
