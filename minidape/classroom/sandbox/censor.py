"""The package copy a worker sees instead of minidape (at the package's own path in its file view where namespaces
exist, first on its path otherwise). It is built from an allow-list too: the core, the lab and the worker's own
modules; of the classroom only the notebooks' set-up helper and the recorder (:mod:`.recorder`) as ``exercises``
(no check, reference or hint); of a judged run's copy only the optional modules its notebook declares
(``exercises.JUDGED_IMPORTS``), every other one absent; and in it the implementations that the exercises judged
there ask for refuse to run. So an answer has nothing of minidape's own implementation to reach: not by a name
kept before a check, a thread, a trace callback, a copy of a function's code or source, nor compilation."""

from __future__ import annotations

import ast
import os
import shutil
import tempfile
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2]


def refusal(name: str) -> str:
    short = name.replace("minidape.", "md.", 1)
    return (
        f"{short} is minidape's own implementation of what an exercise of this notebook asks you to write: it "
        f"is not there while your answers are judged"
    )


class _Censor(ast.NodeTransformer):
    """Replaces the body of every function named, and of every method of every class named, by a refusal."""

    def __init__(self, module: str, names: set[str]):
        self.module, self.names, self.found, self.inside = module, names, set(), None

    def _refuse(self, node, name: str):
        message = ast.Constant(refusal(name))
        node.body = [ast.Raise(ast.Call(ast.Name("RuntimeError", ast.Load()), [message], []), None)]
        return node

    def visit_FunctionDef(self, node):
        qualified = f"{self.module}.{node.name}"
        if self.inside is not None:
            return self._refuse(node, self.inside)
        if qualified in self.names:
            self.found.add(qualified)
            return self._refuse(node, qualified)
        return node  # functions not named keep their bodies (and their inner functions)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        qualified = f"{self.module}.{node.name}"
        if self.inside is None and qualified not in self.names:
            return node
        self.found.add(qualified)
        outer, self.inside = self.inside, self.inside or qualified
        node.body = [self.visit(statement) for statement in node.body]
        if not any(isinstance(s, ast.FunctionDef) and s.name == "__new__" for s in node.body):
            # a class that defines no method of its own (it only inherits) refuses to be made all the same
            arguments = ast.arguments([], [ast.arg("cls")], ast.arg("args"), [], [], ast.arg("kwargs"), [])
            node.body.append(
                self._refuse(ast.FunctionDef(name="__new__", args=arguments, body=[], decorator_list=[]), self.inside)
            )
        self.inside = outer
        return node


# What a copy holds of the classroom: the notebooks' set-up helper and what the worker itself runs.
CLASSROOM = tuple(
    f"classroom/{path}"
    for path in (
        "__init__.py",
        "notebook.py",
        "answering.py",
        "sandbox/worker.py",
        "sandbox/protocol.py",
        "sandbox/limits.py",
        "sandbox/confine.py",
    )
)
NEVER = ("commands.py", "__main__.py")  # the command line: a notebook never runs it
OPTIONAL = ("kernels", "lab.plots", "lab.tasks", "lab.che", "lab.bench", "study")  # a judged run's, if declared


def censored_copy(names: set[str], notebook: str | None = None, folder: str | None = None) -> Path:
    """A copy of the package in a new folder (readable by every user: workers run as others): see the module's
    doc. ``notebook``: a judged run's copy for that notebook (its optional modules as it declares), None for
    the notebook's first run (all of them); ``names`` (``minidape.kernels.pd_shift``, ...) refuse, an error
    naming any name that is not a module-level function or class of the copy. Returns the copy's package folder."""
    from ..exercises import JUDGED_IMPORTS, SHUFFLE_CASES

    top = Path(tempfile.mkdtemp(prefix="minidape-censored-", dir=folder))
    os.chmod(top, 0o755)
    copy = top / "minidape"
    absent = {*NEVER}
    if notebook is not None:
        absent |= {m.replace(".", "/") + s for m in OPTIONAL if m not in JUDGED_IMPORTS[notebook] for s in (".py", "")}

    def ignored(where: str, entries: list[str]) -> set[str]:
        inside = Path(where).relative_to(PACKAGE).as_posix()
        relative = {e: e if inside == "." else f"{inside}/{e}" for e in entries}
        return {
            e
            for e, path in relative.items()
            if e == "__pycache__"
            or e.endswith(".pyc")
            or path in absent
            or (path.startswith("classroom/") and not any(c == path or c.startswith(path + "/") for c in CLASSROOM))
        }

    shutil.copytree(PACKAGE, copy, ignore=ignored)
    (copy / "classroom" / "sandbox" / "__init__.py").write_text('"""The worker\'s side of the sandbox."""\n')
    (copy / "classroom" / "exercises").mkdir()
    recorder = (PACKAGE / "classroom" / "sandbox" / "recorder.py").read_text()
    (copy / "classroom" / "exercises" / "__init__.py").write_text(f"{recorder}\nSHUFFLE_CASES = {SHUFFLE_CASES!r}\n")
    if (PACKAGE.parent / "data").is_dir():  # the corpora, where a checkout keeps them (beside the package)
        (top / "data").symlink_to(PACKAGE.parent / "data")
    by_module: dict[str, set[str]] = {}
    for name in names:
        by_module.setdefault(name.rpartition(".")[0], set()).add(name)
    for module, named in sorted(by_module.items()):
        path = copy.joinpath(*module.split(".")[1:]).with_suffix(".py")
        if not path.exists():
            continue  # a module absent from this copy: nothing of it to refuse
        censor = _Censor(module, named)
        tree = censor.visit(ast.parse(path.read_text(), str(path)))
        if censor.found != named:
            shutil.rmtree(top)
            raise LookupError(
                f"exercises.LIBRARY names {sorted(named - censor.found)}, which {module} does not "
                f"define as a function or class"
            )
        path.write_text(ast.unparse(ast.fix_missing_locations(tree)) + "\n")
    for path in [top, *top.rglob("*")]:
        if not path.is_symlink():
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
    return copy
