"""The notebooks as two static web books (`make book`): the teacher's edition and the student edition.

    python docs/book/build.py OUT [--edition teacher|student|both] [--repository URL] [--branch NAME]
                                  [--install-from SOURCE]

Each edition is made from the executed notebooks without running them again (the `.py` sources, with the outputs
of the committed `.ipynb` beside them, as `make test-notebooks` combines them) and built by Sphinx, MyST-NB and
sphinx-book-theme into OUT/teacher/ or OUT/student/: a folder of static files that any web server can serve,
with the maths typeset by a MathJax served from the folder itself and Sphinx's search running in the browser.

* teacher: every worked solution folded behind a click (code cells by MyST-NB's ``hide-cell`` tag, markdown
  ones by the ``worked-solution`` directive of conf.py: both an HTML ``<details>``);
* student: the solution cells removed, the outputs of check, summary and prediction cells emptied, and the
  outputs of the cells tagged ``reveals-prediction`` (what a prediction cell asks the student to foresee)
  removed too.

The `.ipynb` each page offers for download (``_sources/NN_topic.ipynb``) is the notebook of the same edition,
without the book's folding markup; "Open in Colab" opens it from the GitHub repository and branch the site is
published from (``--repository``, ``--branch``). The notebooks' first cell installs minidape from
``--install-from`` where it is missing (Colab): the one place a teacher names a wheel's URL or path.
"""

from __future__ import annotations

import argparse
import ast
import copy
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent  # docs/book: conf.py, index.md, _static/
ROOT = HERE.parents[1]
NOTEBOOKS = ROOT / "notebooks"
EDITIONS = ("teacher", "student")
REPOSITORY = "https://github.com/OWNER/minidape"  # `make book BOOK_REPOSITORY=...` sets the real one
# The line of the first cell (the Colab cell) that names what pip installs; --install-from rewrites its value.
WIDGET = "application/vnd.jupyter.widget-view+json"
INSTALL_LINE = re.compile(r'^(MINIDAPE_SOURCE = )"[^"\n]*"', re.MULTILINE)


def tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def calls_check_or_summary(source: str) -> bool:
    """True when a code cell calls ``exercises.check(...)`` or ``exercises.summary(...)`` (found in its syntax
    tree, not in a comment): its output is a verdict on the teacher's worked solutions."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):  # a cell with IPython magics: not a check cell
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            function = node.func
            name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)
            if name in ("check", "summary"):
                return True
    return False


def set_install_source(notebook, source: str | None):
    """The notebook with its Colab cell installing minidape from ``source`` (None: as the cell says)."""
    if source is None:
        return notebook
    if '"' in source or "\n" in source:
        raise ValueError(f"--install-from {source!r}: a package name, URL or path without quotes or newlines")
    for cell in notebook.cells:
        if "colab" in tags(cell):
            cell.source = INSTALL_LINE.sub(lambda match: f'{match.group(1)}"{source}"', cell.source)
    return notebook


def student_notebook(notebook):
    """The student edition of an executed teacher's notebook: no solution cell; check, summary and prediction
    cells without their output; the cells tagged ``reveals-prediction`` without theirs."""
    edition = copy.deepcopy(notebook)
    edition.cells = [cell for cell in edition.cells if "solution" not in tags(cell)]
    for cell in edition.cells:
        if cell.cell_type != "code":
            continue
        if "prediction" in tags(cell) or "reveals-prediction" in tags(cell) or calls_check_or_summary(cell.source):
            cell.outputs = []
    return edition


def downloadable(notebook):
    """The notebook a page offers for download and Colab opens: jupytext's pairing left out (a student saving
    it with jupytext installed would otherwise get a `.py` copy beside it)."""
    notebook = copy.deepcopy(notebook)
    notebook.metadata.pop("jupytext", None)
    return notebook


def page_notebook(notebook, edition: str):
    """The notebook the book renders: no widget (a static page cannot run one), the Colab cell off the page (it is
    in the download), and in the teacher's
    edition each worked solution folded: code cells by MyST-NB's ``hide-cell`` tag, markdown ones by conf.py's
    ``worked-solution`` directive."""
    notebook = copy.deepcopy(notebook)
    notebook.metadata.pop("widgets", None)  # a progress bar's widget state: its scripts would come from a CDN
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            output.get("data", {}).pop(WIDGET, None)  # its text stands in for it
        cell_tags = tags(cell)
        if "colab" in cell_tags:
            cell_tags.append("remove-cell")
        elif edition == "teacher" and "solution" in cell_tags:
            if cell.cell_type == "code":
                cell_tags.append("hide-cell")
            else:
                fence = ":" * max(3, 1 + max((len(m) for m in re.findall(r"^:+", cell.source, re.M)), default=0))
                cell.source = f"{fence}{{worked-solution}}\n{cell.source}\n{fence}"
        cell.setdefault("metadata", {})["tags"] = cell_tags
    return notebook


def teacher_notebooks(folder: Path = NOTEBOOKS) -> dict[str, object]:
    """Each notebook of ``folder`` by stem: its `.py` source with the outputs of the executed `.ipynb` beside it
    (a cell not executed yet has none)."""
    import jupytext
    from jupytext.combine import combine_inputs_with_outputs

    found = {}
    for source in sorted(folder.glob("[0-9][0-9]_*.py")):
        notebook = jupytext.read(source)
        executed = source.with_suffix(".ipynb")
        if executed.is_file():
            notebook = combine_inputs_with_outputs(notebook, jupytext.read(executed))
        found[source.stem] = notebook
    if not found:
        raise FileNotFoundError(f"no notebook NN_topic.py in {folder}")
    return found


def edition_notebooks(edition: str, notebooks: dict, install_from: str | None = None) -> dict[str, object]:
    """The downloadable notebooks of ``edition`` by stem."""
    if edition not in EDITIONS:
        raise ValueError(f"edition {edition!r}: valid editions are {', '.join(EDITIONS)}")
    made = {}
    for stem, notebook in notebooks.items():
        notebook = set_install_source(copy.deepcopy(notebook), install_from)
        made[stem] = downloadable(student_notebook(notebook) if edition == "student" else notebook)
    return made


def build(edition: str, out: Path, repository: str, branch: str, install_from: str | None = None) -> Path:
    """Build ``edition`` into the folder ``out`` (replaced whole once the build has succeeded)."""
    import nbformat
    from sphinx.cmd.build import build_main

    out = Path(out)
    notebooks = edition_notebooks(edition, teacher_notebooks(), install_from)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{edition}.", dir=out.parent) as scratch:
        source, site, downloads = Path(scratch, "source"), Path(scratch, "site"), Path(scratch, "downloads")
        source.mkdir()
        downloads.mkdir()
        shutil.copy(HERE / "index.md", source / "index.md")
        for stem, notebook in notebooks.items():
            nbformat.write(page_notebook(notebook, edition), source / f"{stem}.ipynb")
            nbformat.write(notebook, downloads / f"{stem}.ipynb")
        os.environ.update(
            BOOK_EDITION=edition, BOOK_REPOSITORY=repository, BOOK_BRANCH=branch, BOOK_DOWNLOADS=str(downloads)
        )
        status = build_main(["-b", "html", "-q", "-W", "-n", "-c", str(HERE), str(source), str(site)])
        if status != 0:
            raise RuntimeError(f"sphinx-build failed on the {edition} edition (exit status {status})")
        shutil.rmtree(site / ".doctrees", ignore_errors=True)
        (site / ".buildinfo").unlink(missing_ok=True)
        for template in site.glob("_static/*webpack-macros.html"):  # the themes' Jinja macros, copied as they are
            template.unlink()
        if out.exists():
            shutil.rmtree(out)
        site.rename(out)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the folder the editions go to (OUT/teacher, OUT/student)")
    parser.add_argument("--edition", choices=[*EDITIONS, "both"], default="both")
    parser.add_argument("--repository", default=REPOSITORY, help="the GitHub repository the site is published from")
    parser.add_argument("--branch", default="gh-pages", help="its branch that holds the site")
    parser.add_argument("--install-from", default=None, help="what the Colab cell installs (default: minidape)")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+/?", args.repository):
        parser.error(f"--repository {args.repository!r}: give a GitHub repository, https://github.com/OWNER/NAME")
    for edition in EDITIONS if args.edition == "both" else [args.edition]:
        site = build(edition, args.out / edition, args.repository.rstrip("/"), args.branch, args.install_from)
        pages = len(list(site.glob("*.html")))
        print(f"wrote the {edition} edition: {pages} pages in {site}/ (open {site}/index.html)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
