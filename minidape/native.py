"""The cell MLP compiled from ``cell_mlp.c``: the refiners' per-cell MLP without its hidden layer in memory.

``fast_refiners.cell_mlp`` calls ``forward`` / ``backward`` here for float32 tensors on the CPU where a C compiler
is; otherwise (no compiler, another dtype or device, autocast, ``MINIDAPE_NATIVE=0``) it runs its PyTorch form
(``fast_refiners._CellMLP``), the same numbers to float32 rounding (``tests/test_native.py``). The file is compiled
once per machine, for its CPU, and the build kept in ``cache_folder()`` under a key of source, compiler, flags and
CPU (``library``). The work is split into ranges of cells run in parallel threads, as many as torch uses
(``torch.get_num_threads()``); ctypes releases the GIL during each call.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("cell_mlp.c")
LANES = 8  # cells per vector in cell_mlp.c
# Flags tried in order: this CPU's vector instructions first; a compiler that refuses -march=native (or a CPU
# it does not know) gets the portable build.
FLAG_SETS = (["-O3", "-march=native"], ["-O3"])


def enabled() -> bool:
    """``MINIDAPE_NATIVE``: 1 or unset, the compiled kernel where a C compiler builds it; 0, the PyTorch form
    everywhere (the same numbers to float32 rounding, slower). Any other value is a ValueError, named (the command
    line refuses it before torch loads)."""
    value = os.environ.get("MINIDAPE_NATIVE", "1").strip()
    if value not in ("0", "1"):
        raise ValueError(
            f"MINIDAPE_NATIVE={os.environ['MINIDAPE_NATIVE']!r} is not a setting of the compiled cell MLP; valid "
            "values: 1 or unset (compiled where a C compiler is) and 0 (the PyTorch form)"
        )
    return value == "1"


def cache_folder() -> Path:
    """Where compiled kernels are kept: ``$MINIDAPE_CACHE``, else ``$XDG_CACHE_HOME/minidape``, else
    ``~/.cache/minidape``."""
    if os.environ.get("MINIDAPE_CACHE"):
        return Path(os.environ["MINIDAPE_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "minidape"


def _this_cpu() -> str:
    """The processor a ``-march=native`` build is for: its model and instruction sets (Linux), else its name."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return "\n".join(sorted({line for line in lines if line.startswith(("model name", "flags", "Features"))}))
    except OSError:
        return f"{platform.machine()} {platform.processor()}"


def _build_key(compiler: str, flags: list[str]) -> str:
    """The cached file's name: the source, the compiler (its version), the flags and this CPU, hashed, so a cache
    shared by several machines (a home folder on a cluster) never hands one machine another's build."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    identity = "\0".join([SOURCE.read_text(), compiler, version, " ".join(flags), _this_cpu()])
    return hashlib.sha256(identity.encode()).hexdigest()[:24]


@functools.cache
def library() -> ctypes.CDLL | None:
    """``cell_mlp.c`` compiled for this machine and loaded, or None where it cannot be (said once, as a warning).

    The build is kept in ``cache_folder()`` under a key of source, compiler, flags and CPU (``_build_key``): the
    first use on a machine compiles (about 8 s at -O3 on this project's CPU), every later process loads it. A build
    is written to a temporary file beside its final name and renamed into place, so processes compiling at once
    each write their own and none loads a half-written one."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None or sys.platform == "win32":
        return None  # no compiler: the PyTorch form, silently (it is the documented default there)
    errors = []
    for flags in FLAG_SETS:
        try:
            built = cache_folder() / "native" / f"cell_mlp-{_build_key(compiler, flags)}.so"
            if not built.exists():
                try:
                    _compile(compiler, flags, built)
                except OSError:  # the cache cannot be written (a read-only home): a build for this process alone
                    with tempfile.TemporaryDirectory(prefix="minidape-native-") as folder:
                        own = Path(folder) / built.name
                        _compile(compiler, flags, own)
                        return _declare(ctypes.CDLL(str(own)))  # mapped: the file may go with its folder
            return _declare(ctypes.CDLL(str(built)))
        except (OSError, subprocess.SubprocessError, RuntimeError) as error:
            errors.append(str(error))
    warnings.warn(
        "minidape could not compile its cell MLP (the refiners' fast kernel), so DAPE and the conv refiner run "
        "their slower PyTorch form on the CPU: " + " | ".join(errors),
        stacklevel=2,
    )
    return None


def _compile(compiler: str, flags: list[str], built: Path) -> None:
    built.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="building-", dir=built.parent) as folder:
        partial = Path(folder) / built.name
        command = [compiler, *flags, "-shared", "-fPIC", str(SOURCE), "-o", str(partial)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()[-300:]}")
        os.replace(partial, built)  # whole or not at all


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    pointer, long = ctypes.c_void_p, ctypes.c_long
    sizes = [long] * 6 + [ctypes.c_float, long, long]  # B, C_x, C_s, C_out, W, N, slope, group range
    reads = [pointer, long, long, long]  # the mask, keys per row, reach, the conv's kernel
    lib.cell_mlp_forward.argtypes = [*[pointer] * 6, *reads, *sizes]
    lib.cell_mlp_forward.restype = None
    lib.cell_mlp_backward.argtypes = [*[pointer] * 11, *reads, *sizes]
    lib.cell_mlp_backward.restype = ctypes.c_int
    lib.cell_mlp_limits_ok.argtypes = [long] * 4
    lib.cell_mlp_limits_ok.restype = ctypes.c_int
    return lib


def usable(x, shared, w_in, w_out, kernel: int = 0) -> bool:
    """Whether the compiled kernel takes these operands: float32 on the CPU outside autocast, within its channel
    limits (``kernel``: the conv's shifted copies, ``kernel`` MLP channels per stored one)."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or torch.is_autocast_enabled("cpu") or not enabled():
        return False
    lib = library()
    _, c_x, c_shared, c_out, width, _, _ = _sizes(x, shared, w_in, w_out, 0.0, kernel)
    return lib is not None and bool(lib.cell_mlp_limits_ok(c_x, c_shared, c_out, width))


@functools.cache
def _pool(threads: int, process: int) -> ThreadPoolExecutor:
    """One pool per thread count and process: a forked child has none of its parent's threads."""
    return ThreadPoolExecutor(threads, thread_name_prefix="minidape-cell-mlp")


def _ranges(n_cells: int, keys: int = 0) -> list[tuple[int, int]]:
    """Groups of 8 cells split into one range per thread (fewer for small inputs); with ``keys`` (the conv, whose
    outputs move along a row) at row boundaries, which needs rows of whole groups (else one range)."""
    groups = -(-n_cells // LANES)
    parts = max(1, min(torch.get_num_threads(), groups // 64))
    if keys and (keys % LANES or parts == 1):
        return [(0, groups)]
    if keys:
        rows, row_groups = n_cells // keys, keys // LANES
        return [(rows * i // parts * row_groups, rows * (i + 1) // parts * row_groups) for i in range(parts)]
    return [(groups * i // parts, groups * (i + 1) // parts) for i in range(parts)]


def _run(calls: list) -> list:
    if len(calls) == 1:
        return [calls[0]()]
    return list(_pool(len(calls), os.getpid()).map(lambda call: call(), calls))


def _sizes(x, shared, w_in, w_out, slope: float, kernel: int) -> tuple:
    """The kernel's sizes: sequences, then the MLP's channels (``kernel`` copies of each stored one), width, cells."""
    batch, c_x, n = x.shape
    copies = max(kernel, 1)
    c_shared = 0 if shared is None else shared.shape[0] * copies
    return batch, c_x * copies, c_shared, w_out.shape[0], w_in.shape[0], n, slope


def _contiguous(*tensors):
    return [None if t is None else t.contiguous() for t in tensors]


def _pointer(t) -> int | None:
    return None if t is None else t.data_ptr()


def _reads(mask, reach: int, kernel: int, n_cells: int) -> tuple:
    """The kernel's view of the cells: a (rows, keys) bool mask of those attention keeps (cells flattened as x's
    are), how far along the keys an output is read, and the conv's kernel (which needs the mask: its rows and tril);
    without a mask of that shape every cell is computed."""
    if mask is None or mask.dim() != 2 or mask.dtype != torch.bool or mask.numel() != n_cells:
        if kernel:
            raise ValueError(f"the shifted cell MLP needs the (rows, keys) mask of its {n_cells} cells")
        return None, 0, 0, 0
    return mask.contiguous(), mask.shape[1], reach, kernel


def forward(x, shared, w_in, b_in, w_out, slope: float, mask=None, reach: int = 0, kernel: int = 0):
    r"""$W_{out}\,\mathrm{LeakyReLU}(W_{in} [x; s] + b_{in})$ at every cell: x (B, C_x, N), shared s (C_s, N) or None,
    w_in (W, C_x + C_s), b_in (W), w_out (C_out, W) -> (B, C_out, N); float32 CPU tensors. With ``mask`` (rows,
    keys), N = rows * keys: the cells with no kept cell within ``reach`` keys are never read, and get 0. With
    ``kernel`` k: the conv (``cell_mlp.c``), x's and s's k shifted copies in, k outputs shifted and summed:
    -> (B, C_out / k, N)."""
    lib, sizes = library(), _sizes(x, shared, w_in, w_out, slope, kernel)
    x, shared, w_in, b_in, w_out = _contiguous(x, shared, w_in, b_in, w_out)
    mask, keys, reach, kernel = _reads(mask, reach, kernel, x.shape[2])
    shape = (len(x), w_out.shape[0] // max(kernel, 1), x.shape[2])
    y = x.new_zeros(shape) if kernel else x.new_empty(shape)  # the conv's shifted outputs are added up
    pointers = [_pointer(t) for t in (x, shared, w_in, b_in, w_out, y, mask)]
    calls = [
        functools.partial(lib.cell_mlp_forward, *pointers, keys, reach, kernel, *sizes, *r)
        for r in _ranges(x.shape[2], kernel and keys)
    ]
    _run(calls)
    return y


def backward(x, shared, w_in, b_in, w_out, grad_y, slope: float, mask=None, reach: int = 0, kernel: int = 0):
    """The gradients of ``forward`` for x, shared (None without it), w_in, b_in and w_out, given ``grad_y`` (zero at
    the cells ``mask`` and ``reach`` leave unread: they are skipped)."""
    lib, sizes = library(), _sizes(x, shared, w_in, w_out, slope, kernel)
    x, shared, w_in, b_in, w_out, grad_y = _contiguous(x, shared, w_in, b_in, w_out, grad_y)
    mask, keys, reach, kernel = _reads(mask, reach, kernel, x.shape[2])
    ranges = _ranges(x.shape[2], kernel and keys)
    like = torch.zeros_like if kernel else torch.empty_like  # the conv's shifted gradients are added up
    grad_x = like(x)
    grad_shared = None if shared is None else like(shared)
    grad_w_in, grad_b_in = x.new_empty(len(ranges), *w_in.shape), x.new_empty(len(ranges), *b_in.shape)
    grad_w_out = x.new_empty(len(ranges), *w_out.shape)
    inputs = [_pointer(t) for t in (x, shared, w_in, b_in, w_out, grad_y, grad_x, grad_shared)]

    def call(i: int, r: tuple[int, int]):
        return lib.cell_mlp_backward(
            *inputs,
            *(t[i].data_ptr() for t in (grad_w_in, grad_b_in, grad_w_out)),
            _pointer(mask),
            keys,
            reach,
            kernel,
            *sizes,
            *r,
        )

    if any(_run([functools.partial(call, i, r) for i, r in enumerate(ranges)])):
        raise MemoryError("the cell MLP's backward could not allocate its buffer for the weights' gradients")
    return grad_x, grad_shared, grad_w_in.sum(0), grad_b_in.sum(0), grad_w_out.sum(0)
