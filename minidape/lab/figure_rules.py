"""The rules every notebook figure keeps, so that a reader can trust it at a glance, and the hook that applies them.

`figure_problems(fig)` lists what a figure breaks:

- a legend with the same label twice;
- two entries of one panel, different labels, in colours a reader cannot tell apart (CIELAB distance below
  `MIN_COLOR_DISTANCE`), or one label in different colours in two panels;
- a logarithmic axis with fewer than two labelled ticks in view (a lone "10¹" gives no scale);
- heat maps of heads (panels titled "head ...") on different colour scales, or a figure that does not say in its
  title that they share one.

`install()` (called by `notebook.start()`) makes every `plt.show()` of a notebook first label its log axes
(`plots.label_log_axes`), then, when `MINIDAPE_CHECK_FIGURES=1` (set by `make test-notebooks`), raise
`FigureProblem` on a figure that breaks a rule: the notebooks' own nbval run checks every figure they draw.
`MINIDAPE_CHECK_FIGURES=report` prints the problems instead, so that one run lists every figure's.
"""

from __future__ import annotations

import os
import re
import sys

import matplotlib.pyplot as plt
from matplotlib.collections import Collection
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from .plots import label_log_axes, labelled_ticks

CHECK = "MINIDAPE_CHECK_FIGURES"
MIN_COLOR_DISTANCE = 20.0  # CIE76 ΔE: ~2.3 is "just noticeable"; below ~20 two thin lines are easily confused
HEAD_PANEL = re.compile(r"^head \d+")
SHARED_SCALE = re.compile(r"(one|shared|same) colou?r scale", re.IGNORECASE)


class FigureProblem(AssertionError):
    """A figure breaks one of the rules of `figure_problems`."""


def lab(color) -> tuple[float, float, float]:
    """CIELAB (D65) of a matplotlib colour: distances in it follow what the eye tells apart."""

    def linear(c):
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(c) for c in to_rgb(color))
    x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883

    def f(t):
        return t ** (1 / 3) if t > 216 / 24389 else (24389 / 27 * t + 16) / 116

    fx, fy, fz = f(x), f(y), f(z)
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


def color_distance(a, b) -> float:
    """CIE76 ΔE between two colours."""
    return sum((p - q) ** 2 for p, q in zip(lab(a), lab(b))) ** 0.5


def _entry_color(handle):
    if isinstance(handle, Line2D):
        return handle.get_color()
    if isinstance(handle, Collection) and len(handle.get_facecolor()):
        return handle.get_facecolor()[0]
    if isinstance(handle, Patch):
        return handle.get_facecolor()
    return None


def figure_problems(fig: Figure) -> list[str]:
    """What `fig` breaks of the rules above, one line each (empty when it keeps them all)."""
    problems = []
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)
    for legend in legends:
        texts = [text.get_text() for text in legend.get_texts()]
        repeated = sorted({text for text in texts if texts.count(text) > 1})
        if repeated:
            problems.append(f"legend repeats {repeated}")
    seen = {}  # label -> colour over every panel: a model drawn in several panels keeps one colour
    for ax in fig.axes:
        colors = {}  # label -> colour in this panel, whose legend a reader matches lines against
        for handle, label in zip(*ax.get_legend_handles_labels()):
            color = _entry_color(handle)
            if color is not None:
                colors.setdefault(label, color)
        labels = list(colors)
        for i, first in enumerate(labels):
            for second in labels[i + 1 :]:
                distance = color_distance(colors[first], colors[second])
                if distance < MIN_COLOR_DISTANCE:
                    problems.append(f"{first!r} and {second!r} have colours {distance:.1f} ΔE apart (too alike)")
        for label, color in colors.items():
            if color_distance(seen.setdefault(label, color), color) >= MIN_COLOR_DISTANCE:
                problems.append(f"{label!r} changes colour from one panel to the next")
    for ax in fig.axes:
        if not ax.axison:
            continue
        for which in ("x", "y"):
            scale = ax.get_xscale() if which == "x" else ax.get_yscale()
            if scale in ("log", "symlog") and len(labelled_ticks(ax, which)) < 2:
                title = ax.get_title() or fig.get_suptitle() or "untitled"
                problems.append(f"the log {which} axis of {title!r} has fewer than two labelled ticks")
    head_scales = {
        tuple(image.get_clim()) for ax in fig.axes if HEAD_PANEL.match(ax.get_title()) for image in ax.get_images()
    }
    if len(head_scales) > 1:
        problems.append(f"heat maps of heads on {len(head_scales)} different colour scales: share one")
    if head_scales and len([ax for ax in fig.axes if HEAD_PANEL.match(ax.get_title())]) > 1:
        if not SHARED_SCALE.search(fig.get_suptitle()):
            problems.append("heat maps of several heads: say in the figure's title that they share one colour scale")
    return problems


def check_figure(fig: Figure) -> None:
    """Raise `FigureProblem` naming every rule `fig` breaks."""
    problems = figure_problems(fig)
    if problems:
        title = fig.get_suptitle() or next((ax.get_title() for ax in fig.axes if ax.get_title()), "untitled")
        raise FigureProblem(f"figure {title!r}: " + "; ".join(problems))


def _prepare_open_figures():
    for number in plt.get_fignums():
        fig = plt.figure(number)
        label_log_axes(fig)
        mode = os.environ.get(CHECK, "").strip()
        if mode == "1":
            check_figure(fig)
        elif mode == "report":
            for problem in figure_problems(fig):
                print(
                    f"FIGURE PROBLEM in {fig.get_suptitle() or fig.axes[0].get_title()!r}: {problem}", file=sys.stderr
                )


def install() -> None:
    """Every `plt.show()` first labels the log axes of the open figures and, under `MINIDAPE_CHECK_FIGURES=1`,
    checks them; so does the end of every notebook cell (Jupyter's inline backend shows a cell's open figures
    then), but IPython only prints what that hook raises, without failing the cell: the notebooks therefore
    show every figure with `plt.show()`. Installing twice changes nothing."""
    show = plt.show
    if not getattr(show, "prepares_figures", False):

        def prepared_show(*args, **kwargs):
            _prepare_open_figures()
            return show(*args, **kwargs)

        prepared_show.prepares_figures = True
        plt.show = prepared_show
    try:
        from IPython import get_ipython
    except ImportError:  # plain Python: plt.show() is the only way a figure is shown
        return
    shell = get_ipython()
    if shell is not None:
        callbacks = shell.events.callbacks["post_execute"]
        if _prepare_open_figures not in callbacks:
            callbacks.insert(0, _prepare_open_figures)  # before the inline backend's flush_figures
