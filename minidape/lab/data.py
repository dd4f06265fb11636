"""Corpora in `data/` as byte tokens (vocab 256), the train/val split, and random or fixed windows.

```python
train = md.load_corpus("austen", "train")     # 1-D torch.uint8, the first 90% of the six novels
val = md.load_corpus("notes.txt.gz", "val")   # any .txt/.gz path works too: its last 10%
```
Bytes keep the vocabulary fixed (256) for every corpus and language, so no tokenizer is needed and a model
trained on one corpus can be evaluated on another.

The corpora live in the repository's top-level `data/` and ship inside the installed package as the package
data `minidape/corpora` (see pyproject.toml). Checkpoints name their corpus by `corpus_identity`: a bundled
name, or a file's resolved path with its size and SHA-256, so that `eval` and `resume` can tell when a file
is not the one trained on.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import os
import stat
import zlib
from importlib import resources
from pathlib import Path

import torch

from ..utils import user_path


def _bundled_data():
    """The corpora: package data `minidape/corpora` when installed, the repository's `data/` in a checkout."""
    installed = resources.files("minidape") / "corpora"
    return installed if installed.is_dir() else Path(__file__).resolve().parents[2] / "data"


DATA_DIR = _bundled_data()
# name -> files under data/, concatenated in this order (see data/PROVENANCE.md)
CORPORA = {
    "austen": (
        "austen/emma.txt.gz",
        "austen/mansfieldpark.txt.gz",
        "austen/northangerabbey.txt.gz",
        "austen/persuasion.txt.gz",
        "austen/prideprejudice.txt.gz",
        "austen/sensesensibility.txt.gz",
    ),
    "latex": ("latex/latex_math.tex.gz",),
    "python": ("code/python_stdlib.txt.gz",),
}
SPLITS = ("train", "val")
VAL_FRACTION = 0.1


# What a path that is there but is no regular file is, for the error (reading a FIFO would wait for a writer).
NOT_FILES = {
    stat.S_ISFIFO: "a named pipe (FIFO)",
    stat.S_ISCHR: "a character device",
    stat.S_ISBLK: "a block device",
    stat.S_ISSOCK: "a socket",
}


def _check_regular(path: Path) -> None:
    """A corpus is a regular file: anything else that is there is a ValueError saying what it is."""
    with contextlib.suppress(OSError):
        mode = path.stat().st_mode
        what = next((what for test, what in NOT_FILES.items() if test(mode)), None)
        if what is not None:
            raise ValueError(f"corpus {str(path)!r} is {what}, not a regular file; give a .txt or .gz file")


def _read_bytes(path: Path) -> bytes:
    _check_regular(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file {str(path)!r} does not exist")
    try:
        return gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, zlib.error) as err:  # gzip.BadGzipFile is an OSError; a damaged stream a zlib.error
        reason = "the compressed data is corrupt or truncated" if path.suffix == ".gz" else "it cannot be read"
        raise ValueError(f"cannot read corpus file {str(path)!r}: {reason} ({err})") from err


@functools.lru_cache(maxsize=8)
def _read_corpus(name_or_path: str, file_state: tuple[int, int] | None) -> torch.Tensor:
    """All bytes of a corpus; `file_state` (mtime, size) makes the cache re-read a file that changed."""
    if name_or_path in CORPORA:
        text = b"".join(_read_bytes(DATA_DIR / file) for file in CORPORA[name_or_path])
    else:
        text = _read_bytes(user_path(name_or_path, "corpus"))
    if len(text) < 2:
        raise ValueError(f"corpus {name_or_path!r} has {len(text)} bytes; at least 2 are needed for a split")
    return torch.frombuffer(bytearray(text), dtype=torch.uint8)


def _corpus_tokens(name_or_path: str) -> torch.Tensor:
    path = corpus_file(name_or_path)
    if path is None:
        return _read_corpus(name_or_path, None)
    stat = path.stat()
    return _read_corpus(name_or_path, (stat.st_mtime_ns, stat.st_size))


def corpus_file(name_or_path: str | os.PathLike) -> Path | None:
    """The file a corpus given by its path reads (None for a bundled corpus's name), or the error that says what
    is wrong with it: a folder, not a regular file, an unknown name, a file that is not there. Needs no torch: the
    command line checks `--corpus` with it before torch loads (`declared.code_without_torch`)."""
    if name_or_path in CORPORA:
        return None
    path = user_path(name_or_path, "corpus")
    if path.is_dir():
        raise ValueError(
            f"corpus {name_or_path!r} is a folder, not a file; valid corpora are {', '.join(CORPORA)}, "
            f"or a path to a .txt or .gz file"
        )
    _check_regular(path)
    if not path.is_file():
        if path.suffix not in (".txt", ".gz"):
            raise ValueError(
                f"unknown corpus {name_or_path!r}: valid corpora are {', '.join(CORPORA)}, "
                f"or a path to a .txt or .gz file"
            )
        raise FileNotFoundError(
            f"corpus file {name_or_path!r} does not exist; valid corpora are "
            f"{', '.join(CORPORA)}, or a path to an existing .txt or .gz file"
        )
    return path


def load_corpus(name_or_path: str | os.PathLike = "austen", split: str = "train") -> torch.Tensor:
    """Byte tokens of a bundled corpus (`austen`, `latex`, `python`) or a `.txt`/`.gz` file, as 1-D uint8.

    The split is deterministic: `train` is the first 90% of the bytes, `val` the last 10%.
    """
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(
            f"name_or_path must be a corpus name ({', '.join(CORPORA)}) or a file path, "
            f"got {type(name_or_path).__name__}"
        )
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: valid splits are {', '.join(SPLITS)}")
    tokens = _corpus_tokens(os.fspath(name_or_path))
    cut = len(tokens) - max(1, int(len(tokens) * VAL_FRACTION))
    return (tokens[:cut] if split == "train" else tokens[cut:]).clone()


def check_tokens(tokens, what: str, expected: str) -> torch.Tensor:
    """`tokens` itself if it is a 1-D integer tensor, else a TypeError: "{what} must be {expected}, got ..."."""
    if not torch.is_tensor(tokens) or tokens.dim() != 1 or tokens.is_floating_point():
        raise TypeError(
            f"{what} must be {expected}, got "
            f"{type(tokens).__name__}{tuple(tokens.shape) if torch.is_tensor(tokens) else ''}"
        )
    return tokens


def _check_width(tokens: torch.Tensor, width: int) -> None:
    if len(tokens) < width:
        raise ValueError(f"need windows of {width} tokens but the data has only {len(tokens)}")


def get_batch(
    tokens: torch.Tensor,
    batch_size: int,
    block_size: int,
    generator: torch.Generator | None = None,
    device: str | torch.device = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """`batch_size` random windows: inputs `x` and next-token targets `y`, both LongTensor `(B, block_size)`."""
    _check_width(tokens, block_size + 1)
    starts = torch.randint(len(tokens) - block_size, (batch_size, 1), generator=generator)
    windows = tokens[starts + torch.arange(block_size + 1)].long()
    return windows[:, :-1].to(device), windows[:, 1:].to(device)


def fixed_windows(tokens: torch.Tensor, width: int, count: int, seed: int = 0) -> torch.Tensor:
    """`count` windows of `width` tokens at starts drawn from `seed` alone: the same windows for every model."""
    _check_width(tokens, width)
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(len(tokens) - width + 1, (count, 1), generator=generator)
    return tokens[starts + torch.arange(width)]


# ----------------------------------------------------------------------------- which corpus a run used


def corpus_identity(name_or_path: str | os.PathLike) -> dict:
    """What identifies a corpus's content: `{"name": ...}` for a bundled corpus, else the file's resolved
    path, size in bytes and SHA-256 (so the same name in another folder, or an edited file, is told apart)."""
    name_or_path = os.fspath(name_or_path)
    if name_or_path in CORPORA:
        return {"name": name_or_path}
    _corpus_tokens(name_or_path)  # the usual errors for an unknown name, a missing or unreadable file
    path = user_path(name_or_path, "corpus").resolve()
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return {"path": str(path), "size": path.stat().st_size, "sha256": digest.hexdigest()}


def describe_corpus(identity: dict) -> str:
    """One line for messages: the bundled name, or the path with its size and the start of its hash."""
    if "name" in identity:
        return f"the bundled corpus {identity['name']!r}"
    return f"{identity['path']} ({identity['size']} bytes, sha256 {identity['sha256'][:12]}...)"


def corpus_to_read(recorded: dict | str, name_or_path: str | os.PathLike | None, what: str) -> str:
    """The corpus to read for a run that recorded `recorded` (a `corpus_identity`): `name_or_path` when given
    and identical, or the recorded one when None. A different corpus, or a recorded file that is gone or has
    changed since, is a ValueError that names both, starting with `what` (e.g. "resume of runs/a")."""
    if isinstance(recorded, str):  # checkpoints written before corpora were identified by content
        recorded = corpus_identity(recorded)
    expected = describe_corpus(recorded)
    if name_or_path is None:
        if "name" in recorded:
            return recorded["name"]
        if not Path(recorded["path"]).is_file():
            raise ValueError(
                f"{what}: the corpus it was trained on, {expected}, no longer exists; pass the corpus explicitly"
            )
        name_or_path = recorded["path"]
    given = corpus_identity(name_or_path)
    if given != recorded:
        raise ValueError(f"{what}: the corpus is {describe_corpus(given)}, but the run was trained on {expected}")
    return os.fspath(name_or_path)
