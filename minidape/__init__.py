"""minidape: positional encodings, DAPE/CAPE refiners and length extrapolation in a small GPT.

The package is four rooms on floors, each importing only those below it (tests/test_package.py asserts it):
- the core: `model.py` (the GPT in the papers' form), `fast.py` and `fast_encodings.py` (its fast path),
  `kernels.py` (PD/CPD kernels);
  beside it the helpers `utils.py` and `threads.py`, which import nothing of the package;
- `lab/`: the corpora, the training loop, evaluation, plots, the CHE tasks and benchmarks;
- `study/`: the claims study and `compare`;  `classroom/`: the exercises' checks, the grader and the hand-out;
- on top, the CLI: `__main__.py` and `commands.py`.

The model, the corpora and the training loop are imported here; every other module is reached as `md.NAME`
(`md.evaluate`, `md.plots`, `md.tasks`, `md.exercises`, ...) and imported on first use (PEP 562 `__getattr__`),
so that `import minidape.model` stays quick and loads neither matplotlib nor tqdm.
"""

import importlib

from . import threads  # first, before torch loads: OpenMP's idle threads spin briefly, then sleep

# isort: split
from . import fast, fast_encodings  # install the fast path into model.py's classes (model.py imports neither)
from .lab.data import load_corpus
from .lab.train import train  # md.train is the function; `from minidape.lab.train import ...` reaches the module
from .model import (
    GPT,
    PE_NAMES,
    REFINER_NAMES,
    AbsolutePositions,
    AdditiveBias,
    AttentionWeights,
    DataDependentBias,
    GPTConfig,
    RotaryEmbedding,
    check_causal,
    register_pe,
    register_refiner,
)

threads.remember_torch_default()  # torch's own thread count, to tell one the user sets later (choose_for_api)

# Modules reached as md.NAME, loaded on first access, and the room each lives in. `train` is imported above so
# that md.train stays the function (the module is minidape.lab.train).
LAZY_MODULES = {
    "che": ".lab.che",
    "data": ".lab.data",
    "evaluate": ".lab.evaluate",
    "plots": ".lab.plots",
    "tasks": ".lab.tasks",
    "exercises": ".classroom.exercises",
    "grade": ".classroom.grade",
    "notebook": ".classroom.notebook",
    "kernels": ".kernels",
    "study": ".study",
    "utils": ".utils",
}


def __getattr__(name: str):
    if name in LAZY_MODULES:
        return importlib.import_module(LAZY_MODULES[name], __name__)
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
    "AttentionWeights",
    "AbsolutePositions",
    "RotaryEmbedding",
    "register_pe",
    "register_refiner",
    "check_causal",
    "load_corpus",
    "train",
    *LAZY_MODULES,
]
