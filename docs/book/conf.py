"""Sphinx configuration of the web book; docs/book/build.py runs Sphinx with it once per edition and sets
BOOK_EDITION, BOOK_REPOSITORY, BOOK_BRANCH and BOOK_DOWNLOADS (see there)."""

import os
import shutil
from pathlib import Path

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

EDITION = os.environ.get("BOOK_EDITION", "teacher")

project = "minidape: positional encodings and length extrapolation"
author = "the minidape maintainers"
html_title = "minidape" + (" (teacher's edition)" if EDITION == "teacher" else "")
extensions = ["myst_nb", "sphinx-mathjax-offline"]  # the latter serves MathJax 3 from _static/mathjax
exclude_patterns = ["_build", "**.ipynb_checkpoints"]

# The notebooks are executed already (`make notebooks`): their outputs are shown as they are.
nb_execution_mode = "off"
# No script for widgets (it would come from a CDN): build.py leaves their text in their place.
nb_ipywidgets_js = {}
# Tables a cell prints as markdown (IPython.display.Markdown) are GitHub-flavoured: with MyST-NB's default,
# CommonMark, their rows showed as raw `|` text.
nb_render_markdown_format = "gfm"
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
nb_code_prompt_show = "Show the worked solution"
nb_code_prompt_hide = "Hide the worked solution"
# `\text{block\_size}`: an escaped underscore inside \text needs MathJax's textmacros package.
mathjax3_config = {
    "loader": {"load": ["[tex]/textmacros"]},
    "tex": {"packages": {"[+]": ["textmacros"]}},
}

html_theme = "sphinx_book_theme"
html_static_path = ["_static"]
html_css_files = ["book.css"]
html_last_updated_fmt = None
# Light, always: the figures are drawn on white. (Left unset, the theme's script logs an error on every page.)
html_context = {"default_mode": "light"}
html_theme_options = {
    # "Open in Colab" on every page: the page's own notebook (its download, _sources/NN.ipynb) in the GitHub
    # repository and branch the site is published from.
    "repository_url": os.environ.get("BOOK_REPOSITORY", "https://github.com/OWNER/minidape"),
    "repository_branch": os.environ.get("BOOK_BRANCH", "gh-pages"),
    "path_to_docs": "_sources",
    "launch_buttons": {"colab_url": "https://colab.research.google.com"},
    "use_download_button": True,
    "use_fullscreen_button": False,
    "use_repository_button": False,
    "show_toc_level": 2,
}


def replace_downloads(app, exception):
    """Each page's `_sources/NN.ipynb` becomes the edition's own notebook, without the book's folding markup."""
    downloads = os.environ.get("BOOK_DOWNLOADS")
    if exception is None and downloads:
        for notebook in Path(downloads).glob("*.ipynb"):
            shutil.copy(notebook, Path(app.outdir) / "_sources" / notebook.name)


class WorkedSolution(SphinxDirective):
    """``worked-solution``: its content (markdown) folded in an HTML <details>, like MyST-NB's hidden code cells.
    Raw HTML around the parsed content, not a node class of its own, which the pickled doctrees could not hold."""

    has_content = True

    def run(self):
        opening = '<details class="worked-solution"><summary>Show the worked solution</summary>'
        return [
            nodes.raw("", opening, format="html"),
            *self.parse_content_to_nodes(),
            nodes.raw("", "</details>", format="html"),
        ]


def setup(app):
    app.add_directive("worked-solution", WorkedSolution)
    app.connect("build-finished", replace_downloads)
