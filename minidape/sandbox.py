"""A sandboxed worker that runs one student's notebook, then answers the grader's questions about it.

The grader (:mod:`minidape.grade`) never judges inside the student's process. It starts one worker per
submission, sends it the notebook's code cells one at a time (the worker executes them with ``exec`` in one
namespace, as a kernel would, and sends back their outputs), and afterwards asks it to *call* the answers that
the notebook's ``exercises.check(...)`` cells recorded. Every question is one request; every answer comes back
as data only: tensors, numbers, strings, ``None`` and lists, tuples and dicts of them, serialised by
``torch.save`` and read by ``torch.load(weights_only=True)``, which cannot build any other object. Anything
else (a function, a class, a module instance) stays in the worker and comes back as a :class:`Remote` handle
that the grader can call in turn. Requests *to* the worker are plain pickles: the worker is not protected from
the grader.

Isolation (:func:`isolation` says which level this machine gets, :data:`LIMITS` are the limits):

* ``root``: the grader runs as root. The worker starts as PID 1 of new PID, mount, network and IPC namespaces
  (util-linux ``unshare``), mounts empty file systems over the submissions, the teacher's edition and the
  world-writable folders (``/tmp``, ``/var/tmp``, ``/dev/shm``), works in a small tmpfs of its own, sets its
  resource limits and then becomes an unprivileged user id of its own (one per concurrent job) before it reads
  any student code. It cannot see or signal the grader, other workers or their files, and it has no network.
  When it ends, the kernel ends every process it started (the end of a PID namespace's first process ends
  them all); the grader then also kills whatever still runs under its user id.
* ``uid``: root, but namespaces are not permitted (e.g. a container without CAP_SYS_ADMIN): a user id of its
  own, a scratch folder of its own (mode 0700), the limits; no hidden folders, no PID or network namespace.
* ``userns``: not root, but unprivileged user namespaces work: the same namespaces and mounts, but the worker
  keeps the grader's user id, so files outside the hidden folders stay readable and writable to it.
* ``none``: resource limits, a process group and a scratch folder only.
"""
from __future__ import annotations

import ast
import base64
import builtins
import ctypes
import io
import json
import marshal
import os
import pickle
import resource
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import types
from dataclasses import dataclass

from .exercises import NotDone, RemoteAnswer, StudentError, WorkerGone, Wrong

# Per worker. Memory is address space (torch alone reserves about 0.7 GB of it); processes count threads too.
LIMITS = {"memory_bytes": 6 << 30, "processes": 256, "open_files": 256, "file_bytes": 64 << 20,
          "scratch_bytes": 256 << 20}
MAX_MESSAGE = 256 << 20         # the most the grader reads from a worker in one answer
MAX_CELL_OUTPUT = 200_000       # characters of printed output kept per cell
UID_BASE = 2_000_000_000        # workers' user ids (levels root and uid): far above any real account
SCRATCH_FOLDERS = ("/tmp", "/var/tmp", "/dev/shm")   # world-writable: each worker gets empty ones of its own
REMOTE, CONFIG = "__minidape_remote__", "__minidape_config__"
HEADER = struct.Struct("<Q")


class TimeLimit(WorkerGone):
    """The worker did not answer before the deadline (it still runs: interrupt it, or close it)."""


class LibraryUsed(Wrong):
    """The answer ran minidape's own implementation of what the exercise asks for."""


# ------------------------------------------------------------------------------------------------ framing


def send(fd: int, payload: bytes, deadline: float | None = None) -> None:
    """One framed message; with a deadline (the grader's side, a non-blocking pipe) never waits past it."""
    view = memoryview(HEADER.pack(len(payload)) + payload)
    while view:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([], [fd], [], wait)[1]:
                raise TimeLimit("did not take the request in time")
        try:
            view = view[os.write(fd, view):]
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
    """Data from the worker: ``weights_only`` builds tensors and plain containers, never objects or code."""
    import torch
    try:
        return torch.load(io.BytesIO(payload), weights_only=True)
    except Exception as error:
        raise WorkerGone(f"sent something that is not data ({type(error).__name__})") from None


# ------------------------------------------------------------------------ the grader's side: requests


class _RequestPickler(pickle.Pickler):
    """Pickles the grader's arguments for the worker: remote handles by reference, and functions defined
    inside other functions (the checkers' lambdas, ``md.kernels``' kernel factories) by their code."""

    def persistent_id(self, obj):
        return obj._ref if isinstance(obj, Remote) else None

    def reducer_override(self, obj):
        if isinstance(obj, types.FunctionType) and ("<" in obj.__qualname__):
            cells = tuple(cell.cell_contents for cell in obj.__closure__ or ())
            return _make_function, (marshal.dumps(obj.__code__), obj.__module__, obj.__defaults__, cells)
        return NotImplemented


def _make_function(code: bytes, module: str, defaults, cells):
    import importlib
    closure = tuple(types.CellType(value) for value in cells) or None
    try:
        namespace = vars(importlib.import_module(module))
    except ImportError:                  # a module the worker cannot import (a test's): builtins only
        namespace = {"__builtins__": builtins}
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
    bases: tuple[str, ...]        # qualified names of the classes in its MRO (its own MRO if it is a class)
    parameter_shapes: tuple        # of an nn.Module instance, in registration order


class Remote(RemoteAnswer):
    """An object that lives in the worker: calling it runs the student's code there and returns data (or
    another handle). The checks use it like the object itself for calls; everything else goes through the
    helpers of :mod:`minidape.exercises` (``_is_module``, ``_build``, ``_load_parameters``, ``_gradients_of_sum`` ...)."""

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
    """The checks' way into one worker: each request carries the names the current exercise forbids
    (``exercises.LIBRARY``) and the time left; answers come back decoded."""

    def __init__(self, worker, deadline: float):
        self.worker, self.deadline, self.forbidden = worker, deadline, ()

    def request(self, op: str, *args):
        extra = () if op in ("describe", "answers") else (list(self.forbidden),)
        value = self.worker.request(op, *args, *extra, timeout=max(0.0, self.deadline - time.monotonic()))
        return decode(value, self)


def decode(value, session):
    """Data from the worker with its handle and config markers turned back into :class:`Remote` and configs."""
    if isinstance(value, tuple) and len(value) == 3 and value[0] == REMOTE:
        return Remote(session, int(value[1]), str(value[2]))
    if isinstance(value, tuple) and len(value) == 2 and value[0] == CONFIG and isinstance(value[1], dict):
        # Its names are checked where they were registered (the worker): here it is the student's data as is.
        from dataclasses import fields
        from .model import GPTConfig
        config = object.__new__(GPTConfig)
        known = {f.name for f in fields(GPTConfig)}
        vars(config).update({str(k): decode(v, session) for k, v in value[1].items() if k in known})
        return config
    if isinstance(value, (list, tuple)):
        return type(value)(decode(v, session) for v in value)
    if isinstance(value, dict):
        return {k: decode(v, session) for k, v in value.items()}
    return value


# ---------------------------------------------------------------------------------- isolation levels


def isolation() -> str:
    """``root``, ``userns`` or ``none``: what :class:`Worker` can do on this machine (see the module doc)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return "uid" if os.geteuid() == 0 else "none"
    probe = [unshare, "--mount", "--pid", "--net", "--ipc", "--fork", "--mount-proc", "true"]
    if os.geteuid() != 0:
        probe[1:1] = ["--user", "--map-root-user"]
    try:
        if subprocess.run(probe, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          timeout=30).returncode == 0:
            return "root" if os.geteuid() == 0 else "userns"
    except (OSError, subprocess.TimeoutExpired):
        pass
    return "uid" if os.geteuid() == 0 else "none"


WARNINGS = {
    "userns": "not running as root: each submission runs in its own PID, mount and network namespaces with "
              "resource limits, but as your own user, so files your user can write outside the hidden folders "
              "(submissions, teacher's edition, /tmp) are writable by the submissions. Grade as root (a "
              "container, CI) for a user id of its own per submission.",
    "uid": "namespaces are not permitted here (a container without CAP_SYS_ADMIN?): each submission runs as a "
           "user id of its own with resource limits, but it can read world-readable files (other submissions, "
           "the teacher's edition if their permissions allow), see other processes and use the network.",
    "none": "no namespaces available (util-linux unshare missing or not permitted): submissions run as your "
            "own user with resource limits only; they can read and write your files, see other processes "
            "and signal the grader. Grade as root on Linux for isolation.",
}


def kill_user(uid: int) -> None:
    """End every process of ``uid`` (root only): a child that becomes ``uid`` and signals all it may."""
    for _ in range(100):
        if not _processes_of(uid):
            return
        pid = os.fork()
        if pid == 0:
            try:
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
                os.kill(-1, signal.SIGKILL)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        time.sleep(0.01)
    raise RuntimeError(f"processes of user id {uid} survive SIGKILL")


def _processes_of(uid: int) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat(follow_symlinks=False).st_uid == uid:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


# --------------------------------------------------------------------------------- the grader's side


class Worker:
    """One sandboxed worker process for one submission (see the module doc); a context manager."""

    def __init__(self, level: str, slot: int, hide: list[str], env: dict[str, str], cpu_seconds: int = 3600):
        self.level, self.uid = level, UID_BASE + (os.getpid() % 1_000_000) * 256 + slot
        requests_r, self._requests = os.pipe()
        self._answers, answers_w = os.pipe()
        command = [sys.executable, "-m", "minidape.sandbox", str(requests_r), str(answers_w)]
        self.scratch = None
        if level in ("uid", "none"):        # no tmpfs of its own: a folder only its user may enter
            self.scratch = tempfile.mkdtemp(prefix="minidape-worker-")
            if level == "uid":
                os.chown(self.scratch, self.uid, self.uid)
        if level in ("root", "userns"):
            command = ["unshare", *(["--user", "--map-root-user"] if level == "userns" else []),
                       "--mount", "--pid", "--net", "--ipc", "--fork", "--kill-child", "--mount-proc", *command]
        self.process = subprocess.Popen(command, pass_fds=(requests_r, answers_w), stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True, env=env)
        os.close(requests_r)
        os.close(answers_w)
        # The set-up travels through the pipe, not the command line that `ps` shows to everyone.
        limits = {**LIMITS, "cpu_seconds": int(cpu_seconds)}
        send(self._requests, json.dumps({"level": level, "uid": self.uid, "hide": hide, "limits": limits,
                                         "scratch": self.scratch}).encode())
        os.set_blocking(self._requests, False)
        self.alive = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def wait_ready(self, timeout: float) -> None:
        try:
            self.unpack(self.read(timeout))
        except (WorkerGone, StudentError) as gone:
            self.close()
            raise WorkerGone(f"did not start ({gone})") from None

    def request(self, op: str, *args, timeout: float):
        """Send one request and wait for its answer: data, handles decoded; raises what the worker reports."""
        deadline = time.monotonic() + timeout
        try:
            self.send_only(op, *args, deadline=deadline)
            answer = self.read(max(0.0, deadline - time.monotonic()))
        except TimeLimit:
            self.close()
            raise
        return self.unpack(answer)

    def unpack(self, answer):
        """An answer's value; what the worker reports as an error is raised here."""
        if not isinstance(answer, dict) or "error" not in answer or "value" not in answer:
            self.close()
            raise WorkerGone("broke the protocol")
        if answer["error"] is not None:
            if not (isinstance(answer["error"], (tuple, list)) and len(answer["error"]) == 2):
                self.close()
                raise WorkerGone("broke the protocol")
            kind, message = (str(part) for part in answer["error"])
            if kind == "NotImplementedError":
                raise NotDone(message)
            raise (LibraryUsed if kind == "LibraryUsed" else StudentError)(message)
        return answer["value"]

    def send_only(self, op: str, *args, deadline: float) -> None:
        """Send a request whose answer :meth:`read` collects (a cell, which may need an interrupt)."""
        if not self.alive:
            raise WorkerGone("ended earlier")
        try:
            payload = request_bytes(op, *args)
        except (pickle.PicklingError, TypeError, AttributeError) as error:
            raise TypeError(f"the grader could not send {op}'s arguments to the worker: {error}") from None
        try:
            send(self._requests, payload, deadline)
        except TimeLimit:
            self.close()
            raise
        except OSError:
            self.close()
            raise WorkerGone("ended") from None

    def interrupt(self) -> None:
        """SIGINT to the worker itself (a KeyboardInterrupt in the cell it runs)."""
        pid = self.process.pid
        if self.level in ("root", "userns"):            # the worker is unshare's child
            try:
                with open(f"/proc/{pid}/task/{pid}/children") as children:
                    pid = int(children.read().split()[0])
            except (OSError, ValueError, IndexError):
                return
        try:
            os.kill(pid, signal.SIGINT)
        except OSError:
            pass

    def read(self, timeout: float):
        """The next answer. On :class:`TimeLimit` the worker keeps running; on any other failure it is closed."""
        try:
            return from_bytes(receive(self._answers, time.monotonic() + timeout))
        except TimeLimit:
            raise
        except WorkerGone:
            self.close()
            raise

    def close(self) -> None:
        """End the worker and everything it started; idempotent."""
        if not self.alive:
            return
        self.alive = False
        for fd in (self._requests, self._answers):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except OSError:
            pass
        self.process.kill()
        self.process.wait()
        if self.level in ("root", "uid"):
            kill_user(self.uid)
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)


# ---------------------------------------------------------------------------------- the worker's side


class _Capture(io.TextIOBase):
    """sys.stdout / sys.stderr of a cell: kept (up to a limit) as stream outputs."""

    def __init__(self, outputs: list, name: str):
        self.outputs, self.name = outputs, name

    def writable(self):
        return True

    def write(self, text) -> int:
        text = str(text)
        kept = sum(len(o.get("text", "")) for o in self.outputs)
        if kept < MAX_CELL_OUTPUT:
            piece = text[:MAX_CELL_OUTPUT - kept]
            if len(piece) < len(text):
                piece += "\n[output truncated by the grader]\n"
            if self.outputs and self.outputs[-1].get("name") == self.name:
                self.outputs[-1]["text"] += piece
            else:
                self.outputs.append({"output_type": "stream", "name": self.name, "text": piece})
        return len(text)


class _Session:
    """The worker's state: the notebook's namespace, the objects handed out by reference, the traps."""

    def __init__(self):
        from . import exercises
        self.exercises = exercises
        exercises.framework.answers = {}     # check() now only records its answers, for the grader
        self.namespace = {"__name__": "__main__", "__builtins__": builtins}
        self.objects: dict[int, object] = {}
        self.outputs: list = []
        builtins.display = self.display
        try:
            import IPython.display
            IPython.display.display = self.display
        except ImportError:
            pass

    # -- cells
    def display(self, *objects, **_):
        for obj in objects:
            data = {"text/plain": repr(obj)[:MAX_CELL_OUTPUT]}
            for method, mime in (("_repr_markdown_", "text/markdown"), ("_repr_png_", "image/png")):
                try:
                    value = getattr(obj, method)() if hasattr(obj, method) else None
                except Exception:
                    value = None
                if isinstance(value, bytes):
                    value = base64.b64encode(value).decode()
                if isinstance(value, str):
                    data[mime] = value
            self.outputs.append({"output_type": "display_data", "data": data, "metadata": {}})

    def run(self, index: int, source: str):
        self.outputs = outputs = []
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Capture(outputs, "stdout"), _Capture(outputs, "stderr")
        error = None
        try:
            tree = ast.parse(source, f"<cell {index}>")
            last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
            exec(compile(tree, f"<cell {index}>", "exec"), self.namespace)
            if last is not None:
                value = eval(compile(ast.Expression(last.value), f"<cell {index}>", "eval"), self.namespace)
                if value is not None:
                    outputs.append({"output_type": "execute_result", "data": {"text/plain": repr(value)[:MAX_CELL_OUTPUT]},
                                    "metadata": {}, "execution_count": index})
        except BaseException as raised:     # SystemExit and KeyboardInterrupt (the grader's time limit) too
            frames = traceback.format_exception(raised)
            error = {"output_type": "error", "ename": type(raised).__name__, "evalue": str(raised)[:2000],
                     "traceback": [line for line in frames if "minidape/sandbox.py" not in line][-20:]}
        finally:
            sys.stdout, sys.stderr = saved
        self._figures(outputs)
        if error:
            outputs.append(error)
        return outputs

    def _figures(self, outputs: list) -> None:
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return
        try:
            for number in plt.get_fignums():
                buffer = io.BytesIO()
                plt.figure(number).savefig(buffer, format="png", bbox_inches="tight")
                outputs.append({"output_type": "display_data", "metadata": {},
                                "data": {"image/png": base64.b64encode(buffer.getvalue()).decode(),
                                         "text/plain": "<Figure>"}})
            plt.close("all")
        except Exception:
            pass

    # -- answers as data
    def encode(self, value, depth: int = 0):
        import torch
        from .model import GPTConfig
        if value is None:
            return None
        for plain in (bool, int, float, str, complex):    # a subclass (numpy's float64, ...) as the plain value
            if isinstance(value, plain):
                return plain(value)
        if isinstance(value, torch.Tensor):
            return value.detach().cpu().as_subclass(torch.Tensor).clone()
        if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
            return value.item()
        if depth < 20 and isinstance(value, GPTConfig):
            from dataclasses import asdict
            return (CONFIG, {k: self.encode(v, depth + 1) for k, v in asdict(value).items()})
        if depth < 20 and isinstance(value, (list, tuple)):
            return (list if isinstance(value, list) else tuple)(self.encode(v, depth + 1) for v in value)
        if depth < 20 and isinstance(value, dict) and all(
                type(k) in (str, int, float, bool) or k is None for k in value):
            return {k: self.encode(v, depth + 1) for k, v in value.items()}
        return self.handle(value)

    def handle(self, value):
        self.objects[id(value)] = value
        return (REMOTE, id(value), type(value).__name__ if not isinstance(value, type) else "class")

    # -- requests that run the student's code, watched for minidape's own implementation
    def watched(self, forbidden: list[str], run):
        codes = _code_objects(forbidden)
        seen = []

        def profile(frame, event, arg):
            if event == "call" and frame.f_code in codes:
                seen.append(codes[frame.f_code])
        import threading
        sys.setprofile(profile)
        threading.setprofile(profile)
        try:
            value = run()
            switched_off = sys.getprofile() is not profile
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
        if seen:
            raise LibraryUsed(f"it runs minidape's own {seen[0]}, which this exercise asks you to write yourself")
        if switched_off:
            raise LibraryUsed("it switched off the grader's watch for minidape's own implementation")
        return value

    def serve(self, op: str, *args):
        if op == "run":
            return self.run(*args)
        if op == "answers":
            return {name: self.encode(answer) for name, answer in self.exercises.framework.answers.items()
                    if isinstance(name, str)}
        if op == "describe":
            return self.describe(self.objects[args[0]])
        *args, forbidden = args
        target = self.objects[args[0]]
        if op == "call":
            return self.encode(self.watched(forbidden, lambda: target(*args[1], **args[2])))
        if op == "getattr":
            return self.encode(self.watched(forbidden, lambda: getattr(target, args[1])))
        if op == "load_parameters":
            return self.watched(forbidden, lambda: _load_parameters(target, args[1]))
        if op == "gradients":
            return self.encode(self.watched(forbidden, lambda: _gradients(target, args[1])))
        raise ValueError(f"unknown request {op!r}")

    def describe(self, obj):
        from torch import nn
        cls = obj if isinstance(obj, type) else type(obj)
        return {"type_name": cls.__name__, "is_class": isinstance(obj, type), "is_module": isinstance(obj, nn.Module),
                "bases": tuple(f"{c.__module__}.{c.__qualname__}" for c in getattr(cls, "__mro__", ())),
                "parameter_shapes": tuple(tuple(p.shape) for p in obj.parameters())
                if isinstance(obj, nn.Module) else ()}


def _load_parameters(module, tensors):
    import torch
    with torch.no_grad():
        for own, given in zip(module.parameters(), tensors):
            own.copy_(given)


def _gradients(module, inputs):
    module.zero_grad(set_to_none=True)
    module(*inputs).sum().backward()
    return [None if p.grad is None else p.grad for p in module.parameters()]


def _code_objects(names: list[str]) -> dict:
    """The code objects of minidape's functions and classes named (``minidape.kernels.pd_shift``, ...)."""
    import importlib
    codes = {}
    for name in names:
        module, _, attribute = name.rpartition(".")
        try:
            obj = getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError):
            continue
        functions = [obj] if not isinstance(obj, type) else [
            getattr(member, "__func__", getattr(member, "fget", member)) for member in vars(obj).values()]
        pending = [getattr(function, "__code__", None) for function in functions]
        while pending:                  # and the functions defined inside them (a kernel factory's kernel)
            code = pending.pop()
            if isinstance(code, types.CodeType):
                codes[code] = name.replace("minidape.", "md.")
                pending.extend(const for const in code.co_consts if isinstance(const, types.CodeType))
    return codes


def _isolate(setup: dict) -> None:
    """Before any student code: hide folders, a scratch tmpfs, limits, then (root) an unprivileged user id."""
    if setup["scratch"]:
        os.chdir(setup["scratch"])
    if setup["level"] in ("root", "userns"):
        libc = ctypes.CDLL(None, use_errno=True)

        def mount(source, target, fstype, flags, data=""):
            if libc.mount(source.encode(), target.encode(), fstype.encode(), flags, data.encode()) != 0:
                raise OSError(ctypes.get_errno(), f"mount {target}")
        read_only, nosuid, nodev, bind, recursive = 1, 2, 4, 4096, 16384
        # Python, minidape and its corpora may lie in a folder that the scratch file systems below cover (a
        # clone or a venv under /tmp): hold them open now and bind them back at their own paths afterwards.
        # Only the innermost of them are bound: a folder above them (a checkout made by `mktemp -d`) may be
        # closed to others, and the fresh tmpfs recreates the folders above at 0755.
        needed = _needed_trees()
        covered = {path for path in needed if any(path == top or path.startswith(top + "/")
                                                  for top in SCRATCH_FOLDERS)}
        held = {path: os.open(path, os.O_PATH) for path in covered
                if not any(other.startswith(path + "/") for other in covered)}
        mount("tmpfs", "/tmp", "tmpfs", nosuid | nodev, "size=1m,mode=0700")      # staging, root's only
        if setup["level"] == "root":
            _expose_python(needed - covered, mount, libc, bind | recursive)
        owner = setup["uid"] if setup["level"] == "root" else 0
        for path in SCRATCH_FOLDERS:
            if os.path.isdir(path):
                mount("tmpfs", path, "tmpfs", nosuid | nodev,
                      f"size={setup['limits']['scratch_bytes']},mode=0700,uid={owner},gid={owner}")
        for path, handle in held.items():      # in the fresh tmpfs: its folders above path are 0755
            os.makedirs(path, mode=0o755, exist_ok=True)
            mount(f"/proc/self/fd/{handle}", path, "", bind | recursive)
            os.close(handle)
        for path in setup["hide"]:          # last: a tree bound back above may hold some of them
            if os.path.isdir(path):
                mount("tmpfs", path, "tmpfs", read_only | nosuid | nodev, "size=4k,mode=0555")
            elif os.path.exists(path):
                mount("/dev/null", path, "", bind)
        os.chdir("/tmp")
    limits = setup["limits"]
    for name, value in ((resource.RLIMIT_CPU, limits["cpu_seconds"]), (resource.RLIMIT_AS, limits["memory_bytes"]),
                        (resource.RLIMIT_NPROC, limits["processes"]),
                        (resource.RLIMIT_NOFILE, limits["open_files"]), (resource.RLIMIT_FSIZE, limits["file_bytes"]),
                        (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(name, (value, value))
    if setup["level"] in ("root", "uid"):
        uid = setup["uid"]
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        ctypes.CDLL(None).prctl(38, 1, 0, 0, 0)          # PR_SET_NO_NEW_PRIVS: no setuid programs either


def _expose_python(trees: set[str], mount, libc, rbind: int) -> None:
    """Make the interpreter, its libraries and minidape reachable for the unprivileged user when they lie
    under a folder others may not enter (e.g. /root/.pyenv): an empty tmpfs over the top-most such folder,
    with only the needed trees bound back in at their own paths (so sys.path stays valid)."""
    blocked: dict[str, list[str]] = {}
    for path in sorted(trees):
        ancestors = [a for a in _ancestors(path) if not os.stat(a).st_mode & 0o001]
        if ancestors:
            blocked.setdefault(ancestors[0], []).append(path)
    for number, (top, paths) in enumerate(blocked.items()):
        staging = f"/tmp/{number}"
        os.mkdir(staging)
        mount(top, staging, "", rbind)
        mount("tmpfs", top, "tmpfs", 0, "size=4k,mode=0755")
        for path in paths:
            inside = os.path.join(top, os.path.relpath(path, top))
            os.makedirs(inside, mode=0o755, exist_ok=True)
            mount(os.path.join(staging, os.path.relpath(path, top)), inside, "", rbind)
        libc.umount2(staging.encode(), 2)                                        # MNT_DETACH


def _needed_trees() -> set[str]:
    """The folders the worker reads its code and data from: the interpreter, sys.path, minidape and its corpora
    (an editable install maps the package to the checkout, outside sys.path)."""
    from . import data
    package = os.path.dirname(os.path.abspath(__file__))
    return {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, os.path.dirname(sys.executable), *sys.path,
                                          package, str(data.DATA_DIR)) if p and os.path.isdir(p)}


def _ancestors(path: str) -> list[str]:
    """The folders above ``path``, from / down (``path`` itself excluded)."""
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[:i]) for i in range(len(parts) + 1)]


def main() -> None:
    requests, answers = int(sys.argv[1]), int(sys.argv[2])
    try:
        session = _start(json.loads(receive(requests)))
    except BaseException as error:      # before any student code: the grader's problem, reported in words
        send(answers, to_bytes({"error": ("start", f"{type(error).__name__}: {error}"[:2000]), "value": None}))
        raise
    send(answers, to_bytes({"error": None, "value": "ready"}))
    _serve(session, requests, answers)


def _start(setup: dict) -> _Session:
    _isolate(setup)
    del setup                           # the hidden paths are none of the student's business
    os.environ["HOME"] = os.getcwd()
    os.environ["MPLCONFIGDIR"] = os.path.join(os.getcwd(), ".matplotlib")
    os.environ["MPLBACKEND"] = "Agg"
    import warnings
    warnings.filterwarnings("ignore", message=".*non-interactive.*")
    import matplotlib.pyplot  # noqa: F401  (the notebooks' imports, loaded before the clock of the first cell)
    import torch  # noqa: F401
    import minidape  # noqa: F401
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return _Session()


def _serve(session: _Session, requests: int, answers: int) -> None:
    while True:
        try:
            message = receive(requests)
        except WorkerGone:
            os._exit(0)
        except KeyboardInterrupt:           # the grader's time limit struck just after a cell ended
            continue
        try:
            op, *args = pickle.loads(message)
            answer = {"error": None, "value": session.serve(op, *args)}
        except BaseException as error:     # the student's code raised (or exited): the grader says which
            kind = ("NotImplementedError" if isinstance(error, NotImplementedError) else
                    "LibraryUsed" if isinstance(error, LibraryUsed) else "error")
            message = str(error) if kind == "LibraryUsed" else f"{type(error).__name__}: {error}"
            answer = {"error": (kind, message[:4000]), "value": None}
        try:
            payload = to_bytes(answer)
        except Exception as error:
            payload = to_bytes({"error": ("TypeError", f"the answer cannot be sent back: {error}"[:4000]),
                                "value": None})
        send(answers, payload)



if __name__ == "__main__":
    main()
