"""minidape: positional encodings, DAPE/CAPE refiners and length extrapolation in a small GPT."""
from . import kernels
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

__all__ = [
    "GPT", "GPTConfig", "PE_NAMES", "REFINER_NAMES", "AdditiveBias", "AbsolutePositions", "RotaryEmbedding",
    "register_pe", "register_refiner", "kernels",
]
