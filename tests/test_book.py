"""The web book (`make book`): both editions built by `make book` itself, served on 127.0.0.1 and read by Debian's
Chromium, headless, driven by Playwright's Python package (the system browser: Playwright downloads none), over
every page of each edition. In the student edition no worked-solution line and no check verdict appears anywhere,
the pages, the search index and the notebooks offered for download alike.

`make test-book` runs this file (.ci/run installs Chromium first); `make test` leaves it out: two builds and a
browser over 22 pages take minutes. Without a browser the tests are skipped, saying how to install one.
"""

import base64
import hashlib
import html
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urldefrag, urlparse

import nbformat
import pytest

from minidape.classroom import handout

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "book"))
import build as book  # noqa: E402  (docs/book/build.py: the book's own build script)

REPOSITORY, BRANCH = "https://github.com/example-school/minidape-course", "pages"  # what a teacher sets
WHEEL = "https://example.org/wheels/minidape-0.1.0-py3-none-any.whl"
# The browser: Debian's `chromium` package puts the binary in /usr/lib/chromium (/usr/bin/chromium is a script).
CHROMIUM = next(
    (
        path
        for path in ("/usr/lib/chromium/chromium", shutil.which("chromium") or "")
        if path and os.access(path, os.X_OK)
    ),
    None,
)
# `make book` in a network namespace of its own, which has none, where this user may make one (root, as in CI).
OFFLINE = (
    ["unshare", "--net"]
    if shutil.which("unshare") and subprocess.run(["unshare", "--net", "true"]).returncode == 0
    else []
)
VERDICT = re.compile(r"exercise \d\d·\w+ \((?:implement|derive|experiment)\)|\d+ of \d+ exercises passed")
TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)+\|?\s*$", re.MULTILINE)


@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    """Both editions, as `make book` writes them (with a teacher's repository and wheel set)."""
    out = tmp_path_factory.mktemp("book") / "site"
    made = subprocess.run(
        [*OFFLINE, "make", "--no-print-directory", "book", f"BOOK={out}", f"BOOK_REPOSITORY={REPOSITORY}",
         f"BOOK_BRANCH={BRANCH}", f"MINIDAPE_SOURCE={WHEEL}"],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert made.returncode == 0, (made.stdout + made.stderr)[-3000:]
    return {edition: out / edition for edition in book.EDITIONS}


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip("no Chromium: install Debian's (apt-get install chromium), as .ci/run does")
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright's Python package: make test-book")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield launched
        launched.close()


def serve(folder: Path):
    """A web server on 127.0.0.1 (a free port) for ``folder``; returns (its URL, the server)."""

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    class Server(ThreadingHTTPServer):
        def handle_error(self, request, client_address):
            pass  # a connection the browser closed early (the next page asked for): the browser reports real failures

    server = Server(("127.0.0.1", 0), partial(Quiet, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/", server


# What the browser checks on each page once it has loaded: MathJax done, then every formula, image and table.
PAGE_CHECKS = """async () => {
  if (window.MathJax && MathJax.startup) { await MathJax.startup.promise; }
  const formulas = [...document.querySelectorAll('.math')];
  const mathml = [...document.querySelectorAll('mjx-assistive-mml')].map((m) => m.textContent);  // what was typeset
  const outside = (node) => !node.parentElement.closest('pre, code, .highlight, script, style');
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const text = [];
  while (walker.nextNode()) { if (outside(walker.currentNode)) text.push(walker.currentNode.textContent); }
  return {
    formulas: formulas.length,
    untypeset: formulas.filter((f) => !f.querySelector('mjx-container')).map((f) => f.textContent.slice(0, 80)),
    errors: [...document.querySelectorAll('mjx-merror')].map((e) => e.getAttribute('data-mjx-error') || e.textContent),
    literal: mathml.filter((t) => t.includes(String.fromCharCode(92))),  // a backslash
    images: [...document.images].map((i) => ({src: i.src, ok: i.complete && i.naturalWidth * i.naturalHeight > 0})),
    tables: document.querySelectorAll('article table').length,
    prose: text.join(''),
    links: [...document.querySelectorAll('a[href]')].map((a) => a.href),
    ids: [...document.querySelectorAll('[id]')].map((e) => e.id),
  };
}"""


def expected_tables(notebook) -> int:
    """The markdown tables of a notebook: in its markdown cells and in the markdown its cells print."""
    texts = [cell.source for cell in notebook.cells if cell.cell_type == "markdown"]
    texts += [
        "".join(output.get("data", {}).get("text/markdown", ""))
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
    ]
    return sum(len(TABLE_RULE.findall(re.sub(r"```.*?```", "", text, flags=re.DOTALL))) for text in texts)


def read_edition(browser, site: Path) -> dict:
    """Every page of ``site`` in the browser: what failed on each, and what the page checks saw."""
    url, server = serve(site)
    problems, seen, links = [], {}, set()
    context = browser.new_context()

    def route(request_route):
        if urlparse(request_route.request.url).hostname != "127.0.0.1":
            problems.append(f"a request left 127.0.0.1: {request_route.request.url}")
            return request_route.abort()
        return request_route.continue_()

    context.route("**/*", route)
    try:
        for path in sorted(site.rglob("*.html")):
            name = path.relative_to(site).as_posix()
            page = context.new_page()
            page.on("console", lambda m, n=name: m.type == "error" and problems.append(f"{n}: console: {m.text}"))
            page.on("pageerror", lambda e, n=name: problems.append(f"{n}: page error: {e}"))
            page.on("requestfailed", lambda r, n=name: problems.append(f"{n}: failed: {r.url} {r.failure}"))
            page.on("response", lambda r, n=name: r.status >= 400 and problems.append(f"{n}: {r.status} {r.url}"))
            page.goto(url + name, wait_until="networkidle")
            seen[name] = page.evaluate(PAGE_CHECKS)
            links.update((name, link) for link in seen[name]["links"])
            if name == "search.html":  # Sphinx's search, in the browser, on the site's own index
                page.goto(url + "search.html?q=extrapolation", wait_until="networkidle")
                page.wait_for_selector("#search-results li", timeout=30_000)
                seen[name]["search hits"] = page.locator("#search-results li").count()
            page.close()
        for name, link in sorted(links):  # every internal link: a page of the site, and the place it names
            target, fragment = urldefrag(link)
            if not target.startswith(url):
                continue
            relative = target[len(url) :] or "index.html"
            if not (site / relative).is_file():
                problems.append(f"{name}: a link to {relative}, which is not in the site")
            elif fragment and relative in seen and fragment not in seen[relative]["ids"]:
                problems.append(f"{name}: a link to {relative}#{fragment}, which has no such place")
    finally:
        context.close()
        server.shutdown()
    return {"problems": problems, "pages": seen, "url": url}


@pytest.fixture(scope="module")
def read(sites, browser):
    return {edition: read_edition(browser, site) for edition, site in sites.items()}


@pytest.mark.parametrize("edition", book.EDITIONS)
def test_every_page_loads_everything_from_the_site_itself_without_an_error(read, sites, edition):
    result = read[edition]
    pages = sorted(path.relative_to(sites[edition]).as_posix() for path in sites[edition].rglob("*.html"))
    assert sorted(result["pages"]) == pages and len(pages) >= 11, pages  # index, 8 notebooks, search, index of terms
    assert not result["problems"], "\n".join(result["problems"][:20])


@pytest.mark.parametrize("edition", book.EDITIONS)
def test_every_formula_is_typeset_every_image_loaded_and_every_table_a_table(read, sites, edition):
    pages = read[edition]["pages"]
    formulas = 0
    for name, page in pages.items():
        assert not page["untypeset"], f"{edition}/{name}: formulas MathJax left as TeX: {page['untypeset'][:3]}"
        assert not page["errors"], f"{edition}/{name}: MathJax errors: {page['errors'][:3]}"
        # a TeX command MathJax did not know in text mode shows as itself: `\text{block\_size}` needs textmacros
        assert not page["literal"], f"{edition}/{name}: TeX shown as typed in formulas: {page['literal'][:3]}"
        broken = [image["src"] for image in page["images"] if not image["ok"]]
        assert not broken, f"{edition}/{name}: images that did not load: {broken}"
        assert not TABLE_RULE.search(page["prose"]), f"{edition}/{name}: a markdown table shown as text"
        formulas += page["formulas"]
    for stem in book.teacher_notebooks():
        notebook = nbformat.read(sites[edition] / "_sources" / f"{stem}.ipynb", as_version=4)
        page = pages[f"{stem}.html"]
        assert page["tables"] == expected_tables(notebook), f"{edition}/{stem}: tables rendered"
        figures = sum(
            "image/png" in output.get("data", {}) for cell in notebook.cells for output in cell.get("outputs", [])
        )
        assert len([image for image in page["images"] if "/_images/" in image["src"]]) == figures, stem
    assert formulas > 300, f"{edition}: only {formulas} formulas"  # the series' prose is full of them
    assert pages["search.html"]["search hits"] >= 3


@pytest.mark.parametrize("edition", book.EDITIONS)
def test_each_page_offers_its_editions_notebook_and_opens_it_in_colab(read, sites, edition):
    owner_and_name = REPOSITORY.removeprefix("https://github.com/")
    for stem in book.teacher_notebooks():
        links = read[edition]["pages"][f"{stem}.html"]["links"]
        colab = f"https://colab.research.google.com/github/{owner_and_name}/blob/{BRANCH}/_sources/{stem}.ipynb"
        assert colab in links, f"{edition}/{stem}: no Open in Colab link {colab}"
        assert read[edition]["url"] + f"_sources/{stem}.ipynb" in links, f"{edition}/{stem}: no .ipynb download"
        downloaded = nbformat.read(sites[edition] / "_sources" / f"{stem}.ipynb", as_version=4)
        nbformat.validate(downloaded)
        solutions = [cell for cell in downloaded.cells if "solution" in book.tags(cell)]
        assert bool(solutions) == (edition == "teacher"), f"{edition}/{stem}: solution cells {len(solutions)}"
        first = downloaded.cells[0]
        assert "colab" in book.tags(first) and f'MINIDAPE_SOURCE = "{WHEEL}"' in first.source  # the teacher's wheel
        assert "jupytext" not in downloaded.metadata  # unpaired: saving it writes no .py beside it


def test_the_teachers_solutions_are_folded_until_clicked(sites, browser):
    url, server = serve(sites["teacher"])
    page = browser.new_page()
    try:
        for stem, notebook in book.teacher_notebooks().items():
            page.goto(url + f"{stem}.html", wait_until="networkidle")
            folds = page.locator(".tag_solution > details, details.worked-solution")  # code, markdown solutions
            solutions = [cell for cell in notebook.cells if "solution" in book.tags(cell)]
            assert folds.count() == len(solutions) >= 3, stem
            for index in range(folds.count()):
                fold = folds.nth(index)
                hidden = fold.locator("> :not(summary)").first
                assert not hidden.is_visible(), f"{stem}: worked solution {index + 1} shows unfolded"
                fold.locator("summary").first.click()
                assert hidden.is_visible(), f"{stem}: worked solution {index + 1} does not unfold"
    finally:
        page.close()
        server.shutdown()


def site_text(site: Path) -> dict[str, str]:
    """Every file of a site as the text a reader could find in it: a page without its tags (code is split into
    highlighted spans), a notebook's cells and outputs, the search index and the rest as they are."""
    texts = {}
    for path in sorted(p for p in site.rglob("*") if p.is_file() and p.suffix in (".html", ".ipynb", ".js", ".txt")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if path.suffix == ".html":
            text = html.unescape(re.sub(r"<[^>]+>", "", text))
        elif path.suffix == ".ipynb":
            text = "\n".join(handout._notebook_text(json.loads(text)))
        texts[path.relative_to(site).as_posix()] = text
    return texts


def test_the_student_edition_holds_no_worked_solution_and_no_verdict(sites):
    solutions = handout.copyable_lines(handout.teacher_notebooks())
    assert len(solutions) > 50
    for edition in book.EDITIONS:
        lines_found, verdicts = set(), []
        for name, text in site_text(sites[edition]).items():
            lines_found |= {line.split("  #")[0].strip() for line in text.splitlines()} & solutions
            verdicts += [f"{name}: {match.group()}" for match in VERDICT.finditer(text)]
        if edition == "teacher":  # the search can find them: the teacher's edition holds both
            assert len(lines_found) > len(solutions) // 2 and verdicts
        else:
            assert not lines_found, sorted(lines_found)[:5]
            assert not verdicts, verdicts[:5]


def shown_lines(output) -> list[str]:
    """The lines of text an output shows: its markdown where it has some (a table), else its plain text; not a
    figure's text stand-in, which every figure shares (`<Figure size 700x450 with 1 Axes>`)."""
    data = output.get("data", {})
    if "image/png" in data:
        return []
    shown = "".join(output.get("text", "")) + "".join(data.get("text/markdown", "") or data.get("text/plain", ""))
    return [line.strip() for line in shown.splitlines()]


def revealed(notebook) -> tuple[set[str], set[str]]:
    """What a teacher's notebook's cells tagged `reveals-prediction` or `prediction` show: the SHA-256 of their
    figures, and their lines of text (12 characters or more, not a table's |---| rule: a number with its words, a
    row of a table)."""
    figures, lines = set(), set()
    for cell in notebook.cells:
        if cell.cell_type == "code" and {"reveals-prediction", "prediction"} & set(book.tags(cell)):
            for output in cell.get("outputs", []):
                png = output.get("data", {}).get("image/png")
                if png:
                    figures.add(hashlib.sha256(base64.b64decode(png)).hexdigest())
                lines |= {line for line in shown_lines(output) if len(line) >= 12 and re.search(r"\w", line)}
    return figures, lines


def test_the_student_edition_shows_no_output_a_prediction_asks_for(sites):
    """Not one of those figures anywhere in the student site, and not one of those lines in the notebook's page or
    its download. (A later notebook may show an earlier one's result, as 04 does 03's: the prediction is past.)"""
    images = {hashlib.sha256(path.read_bytes()).hexdigest() for path in sites["student"].rglob("_images/*")}
    texts = {edition: site_text(sites[edition]) for edition in book.EDITIONS}
    for stem, notebook in book.teacher_notebooks().items():
        figures, lines = revealed(notebook)
        assert not figures & images, f"{stem}: {len(figures & images)} figures of experiments a prediction asks about"
        for edition in book.EDITIONS:
            shown = texts[edition][f"{stem}.html"] + texts[edition][f"_sources/{stem}.ipynb"]
            found = [line for line in lines if line in shown]
            if edition == "teacher":  # the teacher's edition shows them all: the search can find them
                assert found == list(lines), stem
            else:
                assert not found, f"{stem}: {found[:3]}"
