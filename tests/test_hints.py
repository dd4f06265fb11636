"""The checks' feedback teaches without doing the exercise (issue 42, item 5): every hint and message a check can
print is searched, by tokens, for the formulas and code of the worked answers.

What is searched: every string literal of the exercise modules (the messages and hints passed to ``Wrong``, the
hints of the known-mistake tables, the notes of a verdict, the rungs of each exercise's hint ladder), docstrings
excepted (they are not printed), read from the modules' syntax trees, so a message only some wrong answer
triggers is searched too; and each exercise's ladder as registered. What it is searched for: the worked answers,
the cells tagged ``solution`` of notebooks/*.py (code, its comments, and the maths of solution markdown), cut into
normalised token n-grams, so that a formula written in other spacing, with ``·`` for ``*``, ``ln`` for
``math.log`` or ``T²`` for ``T**2`` is still found, and a fragment of a line is found as well as a whole one.
"""

import ast
import functools
import re
from pathlib import Path

from minidape import exercises

REPO = Path(__file__).resolve().parents[1]
MODULES = sorted((REPO / "minidape" / "classroom" / "exercises").glob("*.py"))
SPAN = 6  # tokens: "2·(k // 2)", "ceil(n / 2)" or "c = cumsum(-1)" are six; shorter runs are the notation itself

# ------------------------------------------------------------------------------------------------ tokens

SPELLINGS = {  # one spelling for what prose, LaTeX and Python write differently
    "·": " * ",
    "×": " * ",
    "−": " - ",
    "≤": " <= ",
    "≥": " >= ",
    "²": " ** 2 ",
    "^": " ** ",
    "Σ": " sum ",
    "∑": " sum ",
    "θ": " theta ",
    "τ": " tau ",
    "ℓ": " l ",
    "\\ln": " log ",
    "\\log": " log ",
    "\\exp": " exp ",
    "\\sum": " sum ",
    "\\lceil": " ceil ( ",
    "\\rceil": " ) ",
    "\\frac": " ",
    "\\cdot": " * ",
    "\\le": " <= ",
    "\\ge": " >= ",
    "{": " ( ",
    "}": " ) ",
}
TOKEN = re.compile(r"[A-Za-z_][A-Za-z_0-9]*|\d+(?:\.\d+)?|//|\*\*|<=|>=|==|->|[-+*/=<>()\[\],:%@]")
# Namespaces and multiplication signs that prose leaves out; ln is log.
DROPPED = {"torch", "math", "np", "nn", "functional", "item", "*", "f"}
RENAMED = {"ln": "log", "e": "exp", "gap": "g"}


def tokens(text: str) -> list[str]:
    for written, spelled in SPELLINGS.items():
        text = text.replace(written, spelled)
    text = re.sub(r":(?=\s|$)", " ", text)  # prose's colon ("... f([S, B]): add"), not a slice's ("[:, None]")
    found = [RENAMED.get(t, t) for t in (t.lower() for t in TOKEN.findall(text))]
    return [t for t in found if t not in DROPPED]


def formulaic(gram: tuple[str, ...]) -> bool:
    """An n-gram of code or maths, not of prose: at least three of its tokens are operators, brackets or numbers."""
    return sum(not re.fullmatch(r"[a-z_][a-z_0-9]*", t) for t in gram) >= 3


def grams(text: str, span: int = SPAN) -> set[tuple[str, ...]]:
    found = tokens(text)
    return {g for g in zip(*(found[i:] for i in range(span))) if formulaic(g)}


# ------------------------------------------------------------------------------------------------ the answers


def cells(solutions: bool) -> list[tuple[str, str]]:
    """(notebook, text) of the solution cells (code whole, markdown its maths, $...$, only), or of all the others
    (the student edition: statements, stubs, prose)."""
    import jupytext

    found = []
    for path in sorted((REPO / "notebooks").glob("0*.py")):
        for cell in jupytext.read(path).cells:
            if ("solution" in cell.metadata.get("tags", [])) != solutions:
                continue
            if solutions and cell.cell_type == "markdown":
                found += [(path.name[:2], maths) for maths in re.findall(r"\$\$?(.+?)\$\$?", cell.source, re.S)]
            else:
                found.append((path.name[:2], cell.source))
    return found


@functools.cache  # both tests read the notebooks once
def answer_grams() -> dict[tuple[str, ...], str]:
    """Each n-gram of a worked answer -> the notebook it comes from; not those the student edition shows anyway
    (a stub's signature, the formula an exercise states, the notation of its text)."""
    shown = {gram for _, text in cells(solutions=False) for gram in grams(text)}
    return {gram: notebook for notebook, text in cells(solutions=True) for gram in grams(text) - shown}


# ------------------------------------------------------------------------------------------------ the feedback


def docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def literals(path: Path) -> list[tuple[str, int, str]]:
    """(module, line, text) of every string the module can print: each literal but docstrings, an f-string with
    its replacement fields as "{}" (the fixed text around them is what can hold a formula)."""
    tree = ast.parse(path.read_text())
    skip = docstrings(tree)
    inside_fstrings = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip | inside_fstrings:
            text = node.value
        else:
            continue
        if " " in text:  # prose: names, keys and modes ("kerple_log", "val_loss") print nothing on their own
            found.append((path.name, node.lineno, text))
    return found


def feedback() -> list[tuple[str, str]]:
    """(where, text) of everything the checks can say: the modules' literals and the registered ladders."""
    said = [(f"{module}:{line}", text) for path in MODULES for module, line, text in literals(path)]
    for name, exercise in exercises.EXERCISES.items():
        ladder = exercise.hint if isinstance(exercise.hint, tuple) else (exercise.hint,)
        said += [(f"{name} hint {rung}", text) for rung, text in enumerate(ladder, 1)]
    return said


def leaks(said, answers) -> list[str]:
    found = []
    for where, text in said:
        shared = sorted(grams(text) & answers.keys())
        if shared:
            found.append(f"{where}: {text!r} holds {' '.join(shared[0])!r} (a worked answer of {answers[shared[0]]})")
    return found


def test_no_hint_or_message_holds_a_worked_answers_formula_or_code():
    found = leaks(feedback(), answer_grams())
    assert not found, "\n".join(found)


# The hints issue 42 found stating the answer, as they read before it: the search flags every one.
OFFENDERS = {
    "8.2's closed form": "p = e^(tau g) / (e^(tau g) + n - 1) for one key ahead by the gap g of n - 1 others; solve "
    "for tau: tau = ln((n - 1) p / (1 - p)) / g",
    "5.1's answer": "each 1×k layer reaches k // 2 keys to each side, two layers reach 2·(k // 2); tril removes "
    "keys > i",
    "8.1's solution code": "D[..., i, j] = sum of log_forget[..., l] for l = j+1 .. i: a cumulative sum c = "
    "log_forget.cumsum(-1), then c[..., i] - c[..., j] (c[..., :, None] - c[..., None, :])",
    "6.5's solution line": "best_run = min(last_k, key=lambda name: last_k[name][LENGTHS[-1]]): the run with the "
    "lowest perplexity at the longest length",
    "8.3's solution line": "the forget gate f is the share of the past a token keeps: the kind with the LOWEST mean "
    "gate forgets most; forgets_most = min(mean_gate, key=mean_gate.get)",
    "4.2, nearly": "per cell f maps n_in -> W -> h with biases (n_in = 2h, or h for dape_add); it runs on every one "
    "of the batch·T² cells, masked ones too",
    "6.2, nearly": "with zero content scores the last query's attention is softmax of its bias row: p_d ∝ exp(b(d)) "
    "over the distances d = 0 .. T - 1; add up the p_d with d >= L",
    "7.2, nearly": "what does each task compute? an n-bit number's square root has ceil(n/2) bits; a product of an "
    "a-bit and a b-bit number has at most a + b bits, and the answer ends with END",
}


def test_the_search_flags_the_hints_that_stated_the_answer():
    answers = answer_grams()
    missed = [name for name, text in OFFENDERS.items() if not leaks([(name, text)], answers)]
    assert not missed, missed
