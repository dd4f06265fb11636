"""The grader and its workers talk in framed messages: requests are pickles (the worker is not protected from the
grader); answers are data only, read by ``torch.load(weights_only=True)`` after their size, their zip records and
their tensors' real storage have been checked (see :mod:`minidape.classroom.sandbox`)."""

from __future__ import annotations

import builtins
import io
import marshal
import os
import pickle
import select
import struct
import time
import types
import zipfile
from dataclasses import dataclass

from ..exercises import RemoteAnswer, WorkerGone

MAX_MESSAGE = 64 << 20  # the most the grader reads from a worker in one answer
MAX_ELEMENTS = 1 << 25  # tensor elements in one answer, all tensors together
REMOTE, CONFIG = "__minidape_remote__", "__minidape_config__"
HEADER = struct.Struct("<Q")


class TimeLimit(WorkerGone):
    """The worker did not answer before the deadline (it still runs: interrupt it, or close it)."""


def send(fd: int, payload: bytes, deadline: float | None = None) -> None:
    """One framed message; with a deadline (the grader's side, a non-blocking pipe) never waits past it."""
    view = memoryview(HEADER.pack(len(payload)) + payload)
    while view:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([], [fd], [], wait)[1]:
                raise TimeLimit("did not take the request in time")
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            continue


def receive(fd: int, deadline: float | None = None, limit: int = MAX_MESSAGE) -> bytes:
    """One framed message, or :class:`WorkerGone` on end of file, a deadline passed, or a message too big."""

    def read(n: int) -> bytes:
        chunks, left = [], n
        while left:
            if deadline is not None:
                wait = deadline - time.monotonic()
                if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                    raise TimeLimit("did not answer in time")
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                raise WorkerGone("ended")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    (size,) = HEADER.unpack(read(HEADER.size))
    if size > limit:
        raise WorkerGone(f"sent a message of {size} bytes (the limit is {limit})")
    return read(size)


def to_bytes(value) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def from_bytes(payload: bytes):
    """Data from the worker: ``weights_only`` builds tensors and plain containers, never objects or code. Before
    anything is built the zip's records must be stored as they are (no compression to inflate past the message's
    size); afterwards every tensor must own the storage its elements need (an expanded view of 8 bytes cannot
    pose as 10⁸ elements) and all of them together hold at most :data:`MAX_ELEMENTS`."""
    import torch

    try:
        with zipfile.ZipFile(io.BytesIO(payload)) as archive:
            records = archive.infolist()
        if any(r.compress_type != zipfile.ZIP_STORED for r in records) or sum(r.file_size for r in records) > len(
            payload
        ):
            raise WorkerGone("sent a compressed message")
        value = torch.load(io.BytesIO(payload), weights_only=True)
    except WorkerGone:
        raise
    except Exception as error:
        raise WorkerGone(f"sent something that is not data ({type(error).__name__})") from None
    elements = 0
    for tensor in _tensors(value):
        if (
            tensor.numel() * tensor.element_size()
            > tensor.untyped_storage().nbytes() - tensor.storage_offset() * tensor.element_size()
        ):
            raise WorkerGone(
                f"sent a tensor of {tensor.numel()} elements over a storage of "
                f"{tensor.untyped_storage().nbytes()} bytes (a view that would grow when copied)"
            )
        elements += tensor.numel()
        if elements > MAX_ELEMENTS:
            raise WorkerGone(f"sent more than {MAX_ELEMENTS} tensor elements in one answer")
    return value


def _tensors(value, depth: int = 0):
    """The tensors in a decoded answer (lists, tuples and dicts of them; weights_only builds nothing else)."""
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif depth < 100 and isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item, depth + 1)
    elif depth < 100 and isinstance(value, dict):
        for item in (*value.keys(), *value.values()):
            yield from _tensors(item, depth + 1)


# ------------------------------------------------------------------------ the grader's side: requests


class _RequestPickler(pickle.Pickler):
    """Pickles the grader's arguments for the worker: remote handles by reference, and by their code the functions
    defined inside other functions (the checkers' lambdas, ``md.kernels``' kernel factories) and every function of
    the checks (which a worker has not: its package copy holds none of them), with the modules and plain data
    their code names from their module."""

    def persistent_id(self, obj):
        return obj._ref if isinstance(obj, Remote) else None

    def reducer_override(self, obj):
        if isinstance(obj, types.FunctionType) and ("<" in obj.__qualname__ or obj.__module__.startswith(CHECKS)):
            cells = tuple(cell.cell_contents for cell in obj.__closure__ or ())
            modules, values = {}, {}
            for name in _global_names(obj.__code__):
                value = obj.__globals__.get(name)
                if isinstance(value, types.ModuleType):
                    modules[name] = value.__name__
                elif isinstance(value, (int, float, str, bytes, type(None))):
                    values[name] = value
            code = marshal.dumps(obj.__code__)
            return _make_function, (code, obj.__module__, obj.__defaults__, cells, modules, values)
        return NotImplemented


CHECKS = "minidape.classroom.exercises"  # modules no worker holds


def _global_names(code: types.CodeType) -> set[str]:
    """The global names a function's code (and the code of functions and comprehensions inside it) may read."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _global_names(constant)
    return names


def _make_function(code: bytes, module: str, defaults, cells, modules=None, values=None):
    import importlib

    closure = tuple(types.CellType(value) for value in cells) or None
    try:
        namespace = vars(importlib.import_module(module))
    except ImportError:  # a module the worker does not hold (the checks', a test's): what its code names
        namespace = {"__builtins__": builtins, **(values or {})}
        for name, imported in (modules or {}).items():
            try:
                namespace[name] = importlib.import_module(imported)
            except ImportError:
                pass
    return types.FunctionType(marshal.loads(code), namespace, None, defaults, closure)


def request_bytes(op: str, *args) -> bytes:
    buffer = io.BytesIO()
    _RequestPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump((op, *args))
    return buffer.getvalue()


@dataclass(frozen=True)
class Description:
    """What the worker says about one of its objects (read by the checks' helpers in ``exercises``)."""

    type_name: str
    is_class: bool
    is_module: bool
    bases: tuple[str, ...]  # qualified names of the classes in its MRO (its own MRO if it is a class)
    parameter_shapes: tuple  # of an nn.Module instance, in registration order


class Remote(RemoteAnswer):
    """An object that lives in the worker: calling it runs the student's code there and returns data (or
    another handle). The checks use it like the object itself for calls; everything else goes through the
    helpers of :mod:`..exercises` (``_is_module``, ``_build``, ``_load_parameters``, ``_gradients_of_sum``
    ...)."""

    def __init__(self, session, ref: int, type_name: str):
        self._session, self._ref, self._type_name = session, ref, type_name

    def __call__(self, *args, **kwargs):
        return self._session.request("call", self._ref, args, kwargs)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return self._session.request("getattr", self._ref, name)

    def __repr__(self):
        return f"<your {self._type_name}>"

    def describe(self) -> Description:
        return Description(**self._session.request("describe", self._ref))


class Channel:
    """The checks' way into one worker: each request carries the time left; answers come back decoded."""

    def __init__(self, worker, deadline: float):
        self.worker, self.deadline = worker, deadline

    def request(self, op: str, *args):
        value = self.worker.request(op, *args, timeout=max(0.0, self.deadline - time.monotonic()))
        return decode(value, self)


def decode(value, session):
    """Data from the worker with its handle and config markers turned back into :class:`Remote` and configs."""
    if isinstance(value, tuple) and len(value) == 3 and value[0] == REMOTE:
        return Remote(session, int(value[1]), str(value[2]))
    if isinstance(value, tuple) and len(value) == 2 and value[0] == CONFIG and isinstance(value[1], dict):
        # Its names are checked where they were registered (the worker): here it is the student's data as is.
        from dataclasses import fields

        from ...model import GPTConfig

        config = object.__new__(GPTConfig)
        known = {f.name for f in fields(GPTConfig)}
        vars(config).update({str(k): decode(v, session) for k, v in value[1].items() if k in known})
        return config
    if isinstance(value, (list, tuple)):
        return type(value)(decode(v, session) for v in value)
    if isinstance(value, dict):
        return {k: decode(v, session) for k, v in value.items()}
    return value
