"""minidape: positional encodings, DAPE/CAPE refiners and length extrapolation in a small GPT.

The package is four rooms on floors, each importing only those below it (tests/test_package.py asserts it):
- the core: `model.py` (the GPT in the papers' form), `fast.py` and `fast_encodings.py` (its fast path),
  `kernels.py` (PD/CPD kernels);
  beside it the helpers `utils.py` and `threads.py`, which import nothing of the package;
- `lab/`: the corpora, the training loop, evaluation, plots, the CHE tasks and benchmarks;
- `study/`: the claims study and `compare`;  `classroom/`: the exercises' checks, the grader and the hand-out;
- on top, the CLI: `__main__.py` and `commands.py`.

Nothing heavy is imported here: every public name (`md.GPT`, `md.train`, ...) and every module reached as
`md.NAME` (`md.evaluate`, `md.plots`, `md.tasks`, `md.exercises`, ...) loads on first use (PEP 562 `__getattr__`),
so `python -m minidape --help` and a mistaken flag answer without loading torch, and `import minidape.model` loads
neither matplotlib nor tqdm. The model installs its fast path (fast.py, fast_encodings.py) itself when it loads.
"""

import importlib
import sys

from . import threads  # first, before torch loads: OpenMP's idle threads spin briefly, then sleep

# The public names and the module each comes from. `md.train` is the function (the module is minidape.lab.train).
NAMES = {
    **dict.fromkeys(
        (
            "GPT",
            "PE_NAMES",
            "REFINER_NAMES",
            "AbsolutePositions",
            "AdditiveBias",
            "AttentionWeights",
            "DataDependentBias",
            "GPTConfig",
            "RotaryEmbedding",
            "check_causal",
            "register_pe",
            "register_refiner",
        ),
        ".model",
    ),
    "load_corpus": ".lab.data",
    "train": ".lab.train",
}

# Modules reached as md.NAME, and the room each lives in.
LAZY_MODULES = {
    "che": ".lab.che",
    "data": ".lab.data",
    "evaluate": ".lab.evaluate",
    "plots": ".lab.plots",
    "tasks": ".lab.tasks",
    "exercises": ".classroom.exercises",
    "grade": ".classroom.grade",
    "notebook": ".classroom.notebook",
    "fast": ".fast",
    "fast_encodings": ".fast_encodings",
    "kernels": ".kernels",
    "model": ".model",
    "study": ".study",
    "utils": ".utils",
}


def _watch_torch(loaded_here: bool) -> None:
    # torch's count, to tell one the user sets from torch's own and minidape's (threads.count_is_users): watched as
    # soon as torch is loaded, here or by the first name loaded below, never loading torch for it
    if "torch" in sys.modules:
        threads.watch_torch(loaded_here)


_watch_torch(loaded_here=False)  # loaded already: by the user, who may have set its count


def __getattr__(name: str):
    if name in NAMES or name in LAZY_MODULES:
        torch_loaded = "torch" in sys.modules
        module = importlib.import_module(NAMES.get(name) or LAZY_MODULES[name], __name__)
        _watch_torch(loaded_here=not torch_loaded)
        if name in LAZY_MODULES:
            return module
        value = getattr(module, name)
        globals()[name] = value  # found directly from now on
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(NAMES) | set(LAZY_MODULES))


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
