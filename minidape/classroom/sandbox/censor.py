"""The censored package: a copy of minidape in which the implementations that a notebook's exercises ask for
refuse to run. A judged worker sees it instead of minidape (mounted over the package's folder where namespaces
exist, first on its path otherwise), so an answer has nothing of minidape's own implementation to reach: not by a
name kept before a check, a thread, a trace callback, a copy of a function's code or source, nor compilation."""

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


def censored_copy(names: set[str], folder: str | None = None) -> Path:
    """A copy of the package in a new folder (readable by every user: workers run as others), with ``names``
    (``minidape.kernels.pd_shift``, ``minidape.model.KerpleLogBias``, ...) refusing; an error naming any name
    that is not a module-level function or class of the package. Returns the copy's package folder."""
    top = Path(tempfile.mkdtemp(prefix="minidape-censored-", dir=folder))
    os.chmod(top, 0o755)
    copy = top / "minidape"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    if (PACKAGE.parent / "data").is_dir():  # the corpora, where a checkout keeps them (beside the package)
        (top / "data").symlink_to(PACKAGE.parent / "data")
    by_module: dict[str, set[str]] = {}
    for name in names:
        by_module.setdefault(name.rpartition(".")[0], set()).add(name)
    for module, named in sorted(by_module.items()):
        path = copy.joinpath(*module.split(".")[1:]).with_suffix(".py")
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
