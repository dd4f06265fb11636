"""Corpora in `data/` as byte tokens (vocab 256), the train/val split, and random or fixed windows.

```python
train = md.load_corpus("austen", "train")     # 1-D torch.uint8, the first 90% of the six novels
val = md.load_corpus("notes.txt.gz", "val")   # any .txt/.gz path works too: its last 10%
```
Bytes keep the vocabulary fixed (256) for every corpus and language, so no tokenizer is needed and a model
trained on one corpus can be evaluated on another.
"""

from __future__ import annotations

import functools
import gzip
import os
from pathlib import Path

import torch

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
# name -> files under data/, concatenated in this order (see data/PROVENANCE.md)
CORPORA = {
    "austen": ("austen/emma.txt.gz", "austen/mansfieldpark.txt.gz", "austen/northangerabbey.txt.gz",
               "austen/persuasion.txt.gz", "austen/prideprejudice.txt.gz", "austen/sensesensibility.txt.gz"),
    "latex": ("latex/latex_math.tex.gz",),
    "python": ("code/python_stdlib.txt.gz",),
}
SPLITS = ("train", "val")
VAL_FRACTION = 0.1


def _read_bytes(path: Path) -> bytes:
    if not path.is_file():
        raise FileNotFoundError(f"corpus file {str(path)!r} does not exist; bundled corpora: {', '.join(CORPORA)}")
    try:
        return gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError) as err:
        raise ValueError(f"cannot read corpus file {str(path)!r}: {err}") from err


@functools.lru_cache(maxsize=8)
def _corpus_tokens(name_or_path: str) -> torch.Tensor:
    if name_or_path in CORPORA:
        text = b"".join(_read_bytes(DATA_DIR / file) for file in CORPORA[name_or_path])
    else:
        path = Path(name_or_path).expanduser()
        if path.suffix not in (".txt", ".gz") and not path.is_file():
            raise ValueError(f"unknown corpus {name_or_path!r}: valid corpora are {', '.join(CORPORA)}, "
                             f"or a path to a .txt or .gz file")
        text = _read_bytes(path)
    if len(text) < 2:
        raise ValueError(f"corpus {name_or_path!r} has {len(text)} bytes; at least 2 are needed for a split")
    return torch.frombuffer(bytearray(text), dtype=torch.uint8)


def load_corpus(name_or_path: str | os.PathLike = "austen", split: str = "train") -> torch.Tensor:
    """Byte tokens of a bundled corpus (`austen`, `latex`, `python`) or a `.txt`/`.gz` file, as 1-D uint8.

    The split is deterministic: `train` is the first 90% of the bytes, `val` the last 10%.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: valid splits are {', '.join(SPLITS)}")
    tokens = _corpus_tokens(os.fspath(name_or_path))
    cut = len(tokens) - max(1, int(len(tokens) * VAL_FRACTION))
    return (tokens[:cut] if split == "train" else tokens[cut:]).clone()


def _check_width(tokens: torch.Tensor, width: int) -> None:
    if len(tokens) < width:
        raise ValueError(f"need windows of {width} tokens but the data has only {len(tokens)}")


def get_batch(tokens: torch.Tensor, batch_size: int, block_size: int, generator: torch.Generator | None = None,
              device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """`batch_size` random windows: inputs `x` and next-token targets `y`, both LongTensor `(B, block_size)`."""
    _check_width(tokens, block_size + 1)
    starts = torch.randint(len(tokens) - block_size, (batch_size,), generator=generator)
    windows = torch.stack([tokens[s:s + block_size + 1] for s in starts.tolist()]).long()
    return windows[:, :-1].to(device), windows[:, 1:].to(device)


def fixed_windows(tokens: torch.Tensor, width: int, count: int, seed: int = 0) -> torch.Tensor:
    """`count` windows of `width` tokens at starts drawn from `seed` alone: the same windows for every model."""
    _check_width(tokens, width)
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(len(tokens) - width + 1, (count,), generator=generator)
    return torch.stack([tokens[s:s + width] for s in starts.tolist()])
