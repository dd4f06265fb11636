"""What the command line needs of the package before torch loads, read from the package's source (``ast``) instead of
importing it: GPTConfig's fields and defaults, the registered names of model.py, the CHE tasks' names and a few
constants; and the checks of those files that need no torch, run from their own lines (`code_without_torch`). So
`python -m minidape --help` and a mistake in the flags answer at once (importing torch took 19-23 s
on a cold start, #44), and a field, an encoding or a task added to those files is known here without an edit.
tests/test_cli_answers_at_once.py checks every value read here against the imported one. Imports nothing of the
package."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


@functools.cache
def _module(path: str) -> ast.Module:
    return ast.parse((PACKAGE / path).read_text(encoding="utf-8"))


class Unread(Exception):
    """A value that is not written out in the source (a call of the package's own code): left to the import."""


def _value(node: ast.AST, path: str):
    """A literal; a name bound at the module's top level to one; `f(key=literal, ...)` as the dict of its keywords
    (`dict(...)`, a dataclass's `Budget(...)`); keywords not written out are left out of that dict."""
    if isinstance(node, ast.Name):
        return constant(path, node.id)
    if isinstance(node, ast.Call) and not node.args:
        record = {}
        for keyword in node.keywords:
            try:
                record[keyword.arg] = _value(keyword.value, path)
            except Unread:
                continue
        return record
    if isinstance(node, ast.Dict):
        return {_value(key, path): _value(value, path) for key, value in zip(node.keys, node.values, strict=True)}
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_value(element, path) for element in node.elts)
    try:
        return ast.literal_eval(node)
    except ValueError as err:
        raise Unread(f"{path}: {ast.unparse(node)} is not a literal") from err


def _top_level(path: str, name: str) -> ast.AST:
    for statement in _module(path).body:
        if isinstance(statement, ast.Assign) and any(getattr(t, "id", None) == name for t in statement.targets):
            return statement.value
        if isinstance(statement, ast.AnnAssign) and getattr(statement.target, "id", None) == name:
            return statement.value
    raise Unread(f"{path} binds no {name} at its top level")


def docstring(path: str) -> str:
    """The docstring of the package's file `path`."""
    return ast.get_docstring(_module(path))


def constant(path: str, name: str):
    """The value of `NAME = ...` at the top level of the package's file `path` (e.g. "lab/evaluate.py")."""
    return _value(_top_level(path, name), path)


def config_fields() -> list[tuple[str, type, object]]:
    """GPTConfig's fields in model.py: (name, type, default), in their order."""
    kinds = {"int": int, "float": float, "str": str, "bool": bool}
    config = next(
        node for node in _module("model.py").body if isinstance(node, ast.ClassDef) and node.name == "GPTConfig"
    )
    return [
        (statement.target.id, kinds[ast.unparse(statement.annotation)], _value(statement.value, "model.py"))
        for statement in config.body
        if isinstance(statement, ast.AnnAssign)
    ]


def registered_names(kind: str) -> list[str]:
    """model.py's own names of positional encodings (`kind` "pe") or refiners ("refiner"), in the order model.py
    registers them at its top level: the registry's first entries, `@register_pe("alibi")` on a class,
    `register_pe("rope")(RotaryEmbedding)`, and an entry written directly (`PE_REGISTRY["none"] = ...`)."""
    return list(_registered_names(kind))


@functools.cache
def _registered_names(kind: str) -> tuple[str, ...]:
    registry = "PE_REGISTRY" if kind == "pe" else "REFINER_REGISTRY"
    names = list(constant("model.py", registry))  # `{"none": None}`: the entries the registry starts with
    for statement in _module("model.py").body:
        calls = [*getattr(statement, "decorator_list", ())]
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
            calls.append(statement.value.func)  # register_pe("rope")(RotaryEmbedding): the inner call
        for call in calls:
            if isinstance(call, ast.Call) and getattr(call.func, "id", None) == f"register_{kind}" and call.args:
                names.append(_value(call.args[0], "model.py"))
        for target in getattr(statement, "targets", ()):
            if isinstance(target, ast.Subscript) and getattr(target.value, "id", None) == registry:
                names.append(_value(target.slice, "model.py"))
    return tuple(names)


def task_names() -> tuple[str, ...]:
    """The CHE tasks' names, in lab/tasks.py's order: `_TASKS = {task.name: task for task in (ClassA, ...)}`."""
    tasks = _top_level("lab/tasks.py", "_TASKS")
    classes = {node.name: node for node in _module("lab/tasks.py").body if isinstance(node, ast.ClassDef)}
    names = []
    for element in tasks.generators[0].iter.elts:
        for statement in classes[element.id].body:
            if isinstance(statement, ast.Assign) and isinstance(statement.targets[0], (ast.Name, ast.Tuple)):
                targets = statement.targets[0]
                values = statement.value
                pairs = zip(targets.elts, values.elts) if isinstance(targets, ast.Tuple) else [(targets, values)]
                names += [_value(value, "lab/tasks.py") for target, value in pairs if target.id == "name"]
    return tuple(names)


# The imports the shadow below leaves out: what the checks never call (numpy: 0.1 s of lab/train.py's shadow).
LEFT_OUT_MODULES = ("torch", "einops", "numpy")
# The package's files whose checks the command line runs without torch (`code_without_torch`): the device's name,
# the corpus's and the checkpoint's file, train's settings, the model's configuration (GPTConfig), the study's
# models, budgets and seeds, and compare's model syntax. An import of any other module of the package is left out,
# with its names.
WITHOUT_TORCH = (
    "utils.py",
    "native.py",
    "lab/data.py",
    "lab/checkpoints.py",
    "lab/train.py",
    "model.py",
    "study/claims.py",
    "study/budgets.py",
    "study/runs.py",
    "study/comparison.py",
)


def _imported_file(path: str, statement: ast.ImportFrom) -> str:
    """The package's file a relative import in `path` reads: ``from ..model import X`` in study/budgets.py is
    model.py."""
    folder = Path(path).parent
    for _ in range(statement.level - 1):
        folder = folder.parent
    return (folder / f"{(statement.module or '').replace('.', '/')}.py").as_posix()


@functools.cache
def code_without_torch(path: str) -> dict:
    """The top-level code of the package's file `path` (one of `WITHOUT_TORCH`) run without torch, as a namespace:
    GPTConfig (its checks), the per-layer spec's parser, the registries and what they call, the study's budgets and
    compare's `parse_model`, the checks of a device's name, a corpus's file, a checkpoint's file, train's settings
    and a study's seeds, each from its file's own lines. A relative import binds the names of the imported file's
    shadow when that file is one of `WITHOUT_TORCH`, none otherwise; every class built on torch's modules is kept as
    its name and bases alone (enough for the checks' ``issubclass`` questions), and a statement that needs what was
    left out to run (a ``@torch.no_grad()`` function, the fast path's import, a decorated entry point) is left out
    too. So the command line refuses what GPTConfig, compare or the rest would, with their messages, before torch
    loads: the rules are written once, in their files."""
    import types

    # classes defined here belong to this module (dataclasses look it up; model.py asks if a class is minidape's)
    namespace = {
        "__name__": __name__,
        "__file__": str(PACKAGE / path),  # where the file finds its data (lab/data.py: the corpora)
        "nn": types.SimpleNamespace(Module=type("Module", (), {})),
    }
    bodiless: set[str] = set()  # the classes kept as name and bases
    for statement in _module(path).body:
        if isinstance(statement, ast.ImportFrom) and statement.level:  # the package's own module
            imported = _imported_file(path, statement)
            if imported in WITHOUT_TORCH:
                shadow = code_without_torch(imported)
                bound = [alias for alias in statement.names if alias.name in shadow]
                namespace.update({alias.asname or alias.name: shadow[alias.name] for alias in bound})
            continue
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            modules = [alias.name for alias in statement.names] if isinstance(statement, ast.Import) else []
            if any(name.split(".")[0] in LEFT_OUT_MODULES for name in [*modules, getattr(statement, "module", "")]):
                continue
        elif isinstance(statement, ast.ClassDef):
            if any(not isinstance(base, ast.Name) or base.id in bodiless for base in statement.bases):
                bodiless.add(statement.name)
                statement = ast.fix_missing_locations(ast.ClassDef(**{**vars(statement), "body": [ast.Pass()]}))
        elif not isinstance(statement, (ast.FunctionDef, ast.Assign, ast.AnnAssign, ast.Expr)):
            continue  # `if __package__:` (the fast path)
        code = compile(ast.Module([statement], []), f"minidape/{path}", "exec")
        try:
            exec(code, namespace)  # noqa: S102 - the package's own source
        except (NameError, AttributeError):  # a line that needs torch, or what was left out: not a configuration's
            continue
    return namespace


def check_config(fields: dict) -> None:
    """Raise what ``GPTConfig(**fields)`` raises (TypeError, ValueError), without importing torch when the model is
    not loaded yet (once it is, with a user's names registered, its own GPTConfig)."""
    import sys

    model = sys.modules.get("minidape.model")
    (model.GPTConfig if model is not None else code_without_torch("model.py")["GPTConfig"])(**fields)
