"""The worker's side: runs one notebook's cells in one namespace, as a kernel would, and serves the grader's
requests about the answers it recorded (see :mod:`minidape.classroom.sandbox`). Started by :func:`confine.boot`, already
isolated: everything it imports comes from what the sandbox lets it see (the censored package in a judged run)."""

from __future__ import annotations

import ast
import base64
import builtins
import io
import os
import pickle
import signal
import sys
import traceback

from .. import answering
from .limits import MAX_CELL_OUTPUT
from .protocol import CONFIG, REMOTE, WorkerGone, receive, send, to_bytes


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
            piece = text[: MAX_CELL_OUTPUT - kept]
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
        from .. import exercises

        self.exercises = exercises
        exercises.framework.answers = {}  # check() now only records its answers, for the grader
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

    def run(self, index: int, source: str, figures: bool = True):
        """Execute one cell; its outputs, with the figures it left open drawn as PNG (``figures``) or closed
        undrawn (a judged run, whose outputs the grader does not keep: drawing is most of a plotting cell's time)."""
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
                    outputs.append(
                        {
                            "output_type": "execute_result",
                            "data": {"text/plain": repr(value)[:MAX_CELL_OUTPUT]},
                            "metadata": {},
                            "execution_count": index,
                        }
                    )
        except BaseException as raised:  # SystemExit and KeyboardInterrupt (the grader's time limit) too
            frames = traceback.format_exception(raised)
            error = {
                "output_type": "error",
                "ename": type(raised).__name__,
                "evalue": str(raised)[:2000],
                "traceback": [line for line in frames if "minidape/classroom/sandbox/" not in line][-20:],
            }
        finally:
            sys.stdout, sys.stderr = saved
        self._figures(outputs, figures)
        if error:
            outputs.append(error)
        return outputs

    def _figures(self, outputs: list, drawn: bool = True) -> None:
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return
        try:
            for number in plt.get_fignums() if drawn else ():
                buffer = io.BytesIO()
                plt.figure(number).savefig(buffer, format="png", bbox_inches="tight")
                outputs.append(
                    {
                        "output_type": "display_data",
                        "metadata": {},
                        "data": {"image/png": base64.b64encode(buffer.getvalue()).decode(), "text/plain": "<Figure>"},
                    }
                )
            plt.close("all")
        except Exception:
            pass

    # -- answers as data
    def encode(self, value, depth: int = 0):
        import torch

        from ...model import GPTConfig

        if value is None:
            return None
        for plain in (bool, int, float, str, complex):  # a subclass (numpy's float64, ...) as the plain value
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
        if (
            depth < 20
            and isinstance(value, dict)
            and all(type(k) in (str, int, float, bool) or k is None for k in value)
        ):
            return {k: self.encode(v, depth + 1) for k, v in value.items()}
        return self.handle(value)

    def handle(self, value):
        self.objects[id(value)] = value
        return (REMOTE, id(value), type(value).__name__ if not isinstance(value, type) else "class")

    def serve(self, op: str, *args):
        if op == "run":
            return self.run(*args)
        if op == "answers":
            return {
                name: self.encode(answer)
                for name, answer in self.exercises.framework.answers.items()
                if isinstance(name, str)
            }
        if op == "variable":  # a variable of the run the grader measures itself (the models it trained)
            return self.encode(self.namespace[str(args[0])])
        if op == "describe":
            return self.describe(self.objects[args[0]])
        target = self.objects[args[0]]
        if op == "call":
            return self.encode(target(*args[1], **args[2]))
        if op == "getattr":
            return self.encode(getattr(target, args[1]))
        if op == "load_parameters":
            return _load_parameters(target, args[1])
        if op == "gradients":
            return self.encode(_gradients(target, args[1]))
        if op == "built":  # the grader trains with a module of this class (exercise 6.5): see answering.built
            return self.encode(answering.built(target, *args[1:]))
        if op == "bias_with":
            return self.encode(answering.bias_with(target, *args[1:]))
        raise ValueError(f"unknown request {op!r}")

    def describe(self, obj):
        from torch import nn

        cls = obj if isinstance(obj, type) else type(obj)
        return {
            "type_name": cls.__name__,
            "is_class": isinstance(obj, type),
            "is_module": isinstance(obj, nn.Module),
            "bases": tuple(f"{c.__module__}.{c.__qualname__}" for c in getattr(cls, "__mro__", ())),
            "parameter_shapes": tuple(tuple(p.shape) for p in obj.parameters()) if isinstance(obj, nn.Module) else (),
        }


def _load_parameters(module, tensors):
    import torch

    with torch.no_grad():
        for own, given in zip(module.parameters(), tensors):
            own.copy_(given)


def _gradients(module, inputs):
    module.zero_grad(set_to_none=True)
    module(*inputs).sum().backward()
    return [None if p.grad is None else p.grad for p in module.parameters()]


def main() -> None:
    """The worker proper, started by :func:`confine.boot` once isolated (a third argument: why it could not be)."""
    requests, answers = int(sys.argv[1]), int(sys.argv[2])
    try:
        if len(sys.argv) > 3:
            raise OSError(sys.argv[3])
        session = _start()
    except BaseException as error:  # before any student code: the grader's problem, reported in words
        send(answers, to_bytes({"error": ("start", f"{type(error).__name__}: {error}"[:2000]), "value": None}))
        raise
    send(answers, to_bytes({"error": None, "value": "ready"}))
    _serve(session, requests, answers)


def _start() -> _Session:
    import warnings

    warnings.filterwarnings("ignore", message=".*non-interactive.*")
    import matplotlib.pyplot  # noqa: F401  (the notebooks' imports, loaded before the clock of the first cell)
    import torch  # noqa: F401

    import minidape  # noqa: F401

    signal.signal(signal.SIGINT, signal.default_int_handler)
    return _Session()


def _serve(session: _Session, requests: int, answers: int) -> None:
    session.ask = lambda name: _ask(session, requests, answers, name)
    session.exercises.framework.ask = session.ask
    while True:
        try:
            message = receive(requests)
        except WorkerGone:
            os._exit(0)
        except KeyboardInterrupt:  # the grader's time limit struck just after a cell ended
            continue
        send(answers, _answer(session, message))


def _ask(session: _Session, requests: int, answers: int, name: str) -> bool:
    """Inside a cell's ``exercises.check``: ask the grader whether the answer to ``name`` passes (a notebook
    that branches on ``exercises.passed`` takes the path the student's own run takes), serving the grader's
    requests about the answers until its verdict comes."""
    send(answers, to_bytes({"ask": str(name)}))
    while True:
        try:
            message = receive(requests)
        except WorkerGone:
            os._exit(0)
        op, *args = pickle.loads(message)
        if op == "verdict":
            return args[0] is True
        send(answers, _answer(session, message))


def _answer(session: _Session, message: bytes) -> bytes:
    """One request's answer, as bytes: the value, or the error it raised in words."""
    try:
        op, *args = pickle.loads(message)
        answer = {"error": None, "value": session.serve(op, *args)}
    except BaseException as error:  # the student's code raised (or exited): the grader says which
        kind = "NotImplementedError" if isinstance(error, NotImplementedError) else "error"
        answer = {"error": (kind, f"{type(error).__name__}: {error}"[:4000]), "value": None}
    try:
        return to_bytes(answer)
    except Exception as error:
        return to_bytes({"error": ("TypeError", f"the answer cannot be sent back: {error}"[:4000]), "value": None})


if __name__ == "__main__":
    main()
