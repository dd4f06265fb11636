"""The package as users get it: light to import, and installable with its corpora (no repository around it)."""

import os
import subprocess
import sys
from pathlib import Path

import minidape as md
from minidape.classroom import handout

REPO = Path(__file__).resolve().parent.parent


def run_python(code: str, cwd: Path, pythonpath: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(pythonpath), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_importing_the_model_loads_neither_matplotlib_nor_tqdm(tmp_path):
    """torch itself may import tqdm; minidape must add neither it nor matplotlib, nor its own heavy modules."""
    code = (
        "import sys, torch\n"
        "before = set(sys.modules)\n"
        "import minidape.model\n"
        "added = set(sys.modules) - before\n"
        "heavy = sorted(m for m in added if m.split('.')[0] in ('matplotlib', 'tqdm') or m in\n"
        "               ('minidape.lab.plots', 'minidape.lab.evaluate', 'minidape.lab.tasks', 'minidape.lab.che'))\n"
        "assert not heavy and 'matplotlib' not in sys.modules, heavy\n"
        "import minidape as md\n"
        "assert callable(md.train) and md.tasks.TASK_NAMES and md.che.train_task and md.plots.plot_accuracy\n"
        "assert md.evaluate.perplexity_by_length and md.kernels.gram and md.load_corpus and md.GPT\n"
        "assert 'matplotlib' in sys.modules  # md.plots loaded it, on first use\n"
    )
    done = run_python(code, tmp_path, REPO)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_built_package_carries_its_corpora(tmp_path):
    """Build the wheel from a copy of the sources, install it into a bare folder, and read a corpus from there,
    far from the repository's data/."""
    wheel = handout.build_wheel(tmp_path / "wheel")  # from a copy of the sources, as the hand-out does
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(tmp_path / "site"), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr[-2000:]
    corpora = tmp_path / "site" / "minidape" / "corpora"
    for files in md.data.CORPORA.values():
        assert all((corpora / file).is_file() for file in files)
    assert (corpora / "PROVENANCE.md").is_file() and (corpora / "code" / "PSF_LICENSE.txt").is_file()
    assert (corpora / "LICENSES.md").is_file()
    # The metadata a package index shows: the licences (minidape's and the corpora's), authors, Python versions
    info = next((tmp_path / "site").glob("minidape-*.dist-info"))
    licences = {path.name for path in (info / "licenses").rglob("*") if path.is_file()}
    assert licences == {"LICENSE", "LICENSES.md", "PSF_LICENSE.txt"}, licences
    metadata = (info / "METADATA").read_text()
    for field in (
        "License-Expression: MIT",
        "Author: the minidape maintainers",
        "Requires-Python: >=3.10",
        "Classifier: Programming Language :: Python :: 3.11",
        "Project-URL: ",
        "Provides-Extra: grade",
    ):
        assert field in metadata, field
    # Every subpackage of the source tree ships (a folder missing from pyproject's list would be left out).
    for package in (REPO / "minidape").rglob("__init__.py"):
        assert (tmp_path / "site" / package.relative_to(REPO)).is_file(), f"{package.parent.name} is not in the wheel"

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = (
        "import minidape as md, minidape.lab.data as data\n"
        "import minidape.study.demo, minidape.lab.bench  # the study subpackage and the benchmark ship too\n"
        "import minidape.lab.train, minidape.classroom.grade, minidape.classroom.sandbox.worker  # the rooms\n"
        "from minidape import exercises; assert len(exercises.EXERCISES) >= 21  # the checks' package\n"
        "print(data.DATA_DIR)\n"
        "print(len(md.load_corpus('austen')) + len(md.load_corpus('austen', 'val')))\n"
    )
    done = run_python(code, elsewhere, tmp_path / "site")
    assert done.returncode == 0, done.stderr[-2000:]
    where, size = done.stdout.split()
    assert Path(where) == corpora
    assert int(size) == len(md.load_corpus("austen")) + len(md.load_corpus("austen", "val"))
    # grading needs the teacher's edition, which a wheel does not carry: one line saying where to grade from
    (elsewhere / "a.ipynb").write_text("{}")
    graded = run_python("from minidape.__main__ import main; main(['grade', 'a.ipynb'])", elsewhere, tmp_path / "site")
    errors = [line for line in graded.stderr.splitlines() if line.startswith("python -m minidape")]
    assert graded.returncode == 2 and len(errors) == 1 and "checkout" in errors[0], graded.stderr[-2000:]


def import_graph(package: Path) -> dict[str, set[str]]:
    """Every `from . import x` / `from .x import y` / `import minidape.x` inside the package folder (at any depth,
    in functions too), as a graph over its modules: module name (``lab.train``) -> the modules it imports."""
    import ast

    modules = {p.relative_to(package).with_suffix("").as_posix().replace("/", "."): p for p in package.rglob("*.py")}
    modules = {name.removesuffix(".__init__").removesuffix("__init__"): path for name, path in modules.items()}
    edges = {}
    for name, path in modules.items():
        parent = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = parent.split(".") if parent else []
                    parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
                    base = ".".join(p for p in (*parts, base) if p)
                elif base.startswith("minidape"):
                    base = base.removeprefix("minidape").lstrip(".")
                else:
                    continue
                for alias in node.names:
                    full = f"{base}.{alias.name}".strip(".")
                    targets.add(full if full in modules else base)
            elif isinstance(node, ast.Import):
                targets |= {
                    a.name.removeprefix("minidape").lstrip(".") for a in node.names if a.name.startswith("minidape")
                }
        edges[name] = {t for t in targets if t in modules and t != name and t != ""}
    return edges


# The floors, bottom up: a module may import its own room and the rooms below it. The core and the helpers share
# the ground floor and know nothing of each other; the CLI (__main__, commands) and the package's __init__ sit on
# top. The study and the classroom are side by side: neither imports the other.
CORE = {"model", "fast", "fast_encodings", "fast_refiners", "native", "kernels"}
HELPERS = {"utils", "threads", "declared"}
TOP = {"", "__main__", "flags", "early_checks", "commands"}


def room(module: str) -> str:
    if module in CORE | HELPERS:
        return module if module in HELPERS else "core"
    return "top" if module in TOP else module.split(".")[0]


ALLOWED = {
    "core": {"core"},
    "utils": set(),
    "threads": set(),
    "declared": set(),
    "lab": {"core", "utils", "threads", "lab"},
    "study": {"core", "utils", "threads", "lab", "study"},
    "classroom": {"core", "utils", "threads", "lab", "classroom"},
    "top": {"core", "utils", "threads", "declared", "lab", "study", "classroom", "top"},
}


def floors_crossed(edges: dict[str, set[str]]) -> list[str]:
    crossed = [
        f"{module} ({room(module)}) imports {target} ({room(target)})"
        for module, targets in edges.items()
        for target in targets
        if room(target) not in ALLOWED.get(room(module), set())
    ]
    crossed += [f"{module} is in no room" for module in edges if room(module) not in ALLOWED]
    return sorted(crossed)


def test_the_package_import_graph_keeps_its_floors_and_has_no_circle():
    """The rooms of the layout as imports: model.py (the one file a reader copies out) imports nothing, the core
    nothing above it, utils and threads nothing of the package, the lab nothing of the study or the classroom, the
    classroom nothing of the study (and the reverse); and no import circle."""
    edges = import_graph(Path(md.__file__).parent)
    assert {"lab.train", "classroom.grade", "classroom.sandbox.worker", "study.comparison"} <= set(edges)
    assert edges["model"] == set(), edges["model"]  # its fast path it loads by name, only inside the package
    assert not floors_crossed(edges), floors_crossed(edges)

    def on_a_cycle(start):
        seen, stack = set(), [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in edges.get(node, ()):
                if nxt == start:
                    return path + [start]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
        return None

    cycles = [c for c in map(on_a_cycle, edges) if c]
    assert not cycles, f"import circles: {cycles}"


def test_crossing_a_floor_is_caught(tmp_path):
    """The floor check reads real imports: a copy of the package where the lab reaches into the study, utils into
    the core and the classroom into the study (one import each, inside a function as the lazy ones are) fails."""
    import shutil

    copy = tmp_path / "minidape"
    shutil.copytree(Path(md.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for module, line in (
        ("lab/data.py", "    from ..study import claims\n"),
        ("utils.py", "    from .model import GPT\n"),
        ("classroom/gradebook.py", "    from ..study.statistics import holm\n"),
    ):
        path = copy / module
        path.write_text(path.read_text() + "\n\ndef crossing():\n" + line)
    crossed = floors_crossed(import_graph(copy))
    assert crossed == [
        "classroom.gradebook (classroom) imports study.statistics (study)",
        "lab.data (lab) imports study.claims (study)",
        "utils (utils) imports model (core)",
    ], crossed


def test_no_module_but_the_core_model_is_longer_than_a_sitting():
    """model.py is the one file read top to bottom; every other module stays small enough to find one's way in
    (at most 700 lines): a module that grows past it splits by job, as train.py did into checkpoints and
    distributed."""
    package = Path(md.__file__).parent
    long = {
        path.relative_to(package).as_posix(): n
        for path in package.rglob("*.py")
        if (n := len(path.read_text().splitlines())) > 700 and path.name != "model.py"
    }
    assert not long, long


def test_the_readme_layout_table_names_every_module():
    """The README's layout table is where a newcomer looks a file up: every module of the package is in it (a
    subpackage by its folder or by each of its files)."""
    readme = (REPO / "README.md").read_text()
    table = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    package = Path(md.__file__).parent
    missing = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package.parent).as_posix()
        folder = path.parent.relative_to(package.parent).as_posix() + "/"
        named = f"`{relative}`" in table or (path.parent != package and f"`{folder}`" in table)
        if path.name != "__init__.py" and not named:
            missing.append(relative)
    assert not missing, f"not in the README's layout table: {missing}"


def test_the_readmes_own_bias_runs_as_shown_and_the_files_it_names_exist():
    """The README's bias of one's own runs as printed (its imports included) and is the file its commands
    import; every file a README command line names (`--import FILE.py`, `--pe FILE.py:Class`) exists."""
    import re

    import torch

    readme = (REPO / "README.md").read_text()
    bias = next(block for block in re.findall(r"```python\n(.*?)```", readme, re.S) if "register_pe(" in block)
    exec(compile(bias, "README.md", "exec"), {})
    model = md.GPT(md.GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, pe="cauchy", refiner="conv"))
    logits, _ = model(torch.randint(256, (1, 16)))
    assert torch.isfinite(logits).all()
    shown = (REPO / "tests" / "files" / "cauchy_bias.py").read_text()
    assert bias.strip() in shown
    named = {
        path
        for pair in re.findall(r"--import (\S+\.py)|--pe (\S+\.py):", readme)
        for path in pair
        if path and not Path(path).stem.isupper()
    }  # FILE.py stands for any file
    assert named and all((REPO / path).is_file() for path in named), named
