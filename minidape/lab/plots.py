"""Extrapolation curves, per-position loss curves, bias heatmaps and a markdown table of results.

`results` everywhere is `{model name: {evaluation length: perplexity}}`, as built from
`evaluate.perplexity_by_length`. Plot functions draw on `ax` when given (a new figure otherwise), return the
figure, and write it atomically to `path` when given.
"""

from __future__ import annotations

import math
import os
import zlib
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from matplotlib.ticker import (
    Formatter,
    FuncFormatter,
    LogFormatter,
    LogLocator,
    MaxNLocator,
    NullFormatter,
)

from ..utils import atomic_path, write_results

# One colour and line style per model in every figure (demo, notebooks, study, compare), from colour-blind safe
# palettes (Okabe & Ito's eight colours and Paul Tol's "muted" set): each encoding has its own colour, and each
# refined variant of it (DAPE-Kerple, DAPE1x3-Kerple, DAPE-FoX, ...) a colour of its own too, not a shade of its
# family's, so that every model of a figure stays apart for every reader; the refiner's line style (dashed for
# DAPE) says the same a second way. `figure_rules` checks every notebook figure for colours too alike.
PE_COLORS = {
    "none": "#000000",
    "rope": "#D55E00",
    "yarn": "#CC6677",
    "sinusoidal": "#DDCC77",
    "learned": "#CC79A7",
    "t5": "#56B4E9",
    "alibi": "#0072B2",
    "kerple_log": "#009E73",
    "kerple_power": "#E69F00",
    "fire": "#882255",
    "fox": "#332288",
    "cope": "#999933",
    "rope_pi": "#661100",
    "rope_ntk": "#AA4499",
    "xpos": "#44AA99",
    "hope": "#88CCEE",
    "stick_breaking": "#77AADD",  # Paul Tol's "light" set, for the encodings beyond the two palettes above
    "path": "#BBCC33",
}
# A refined variant's own colour: (pe, refiner) -> colour; a pair not listed keeps its encoding's colour.
VARIANT_COLORS = {
    ("kerple_log", "dape"): "#CC79A7",
    ("kerple_log", "cape"): "#CC79A7",
    # C2 draws these two beside Kerple-power and DAPE-ALiBi: colours of their own (the figure rules' test caught it)
    ("kerple_log", "dape_concat"): "#332288",
    ("kerple_log", "dape_add"): "#661100",
    ("kerple_log", "conv"): "#E69F00",  # not RoPE's vermilion: the demo draws both (the figure rules' test)
    ("kerple_power", "dape"): "#DDCC77",
    ("alibi", "dape"): "#56B4E9",
    ("fire", "dape"): "#CC6677",
    ("fox", "dape"): "#E69F00",
    ("rope", "dape"): "#AA4499",
}
REFINER_LINESTYLES = {
    "none": "-",
    "dape": "--",
    "cape": "--",
    "dape_concat": (0, (6, 2, 1, 2)),
    "dape_add": ":",
    "conv": "-.",
    "conv_no_tril": (0, (1, 1)),
}
# The names the study, the demo and the notebooks give their models: (pe, refiner) or an explicit colour and
# style. Names are matched case-insensitively, with "_" and " " read as "-" (`_name_key`).
MODEL_STYLES = {
    "NoPE": ("none", "none"),
    "RoPE": ("rope", "none"),
    "sinusoidal APE": ("sinusoidal", "none"),
    "learned APE": ("learned", "none"),
    "ALiBi": ("alibi", "none"),
    "Kerple": ("kerple_log", "none"),
    "Kerple-log": ("kerple_log", "none"),
    "Kerple-power": ("kerple_power", "none"),
    "FIRE": ("fire", "none"),
    "DAPE-ALiBi": ("alibi", "dape"),
    "DAPE-Kerple": ("kerple_log", "dape"),
    "DAPE-Kerple-power": ("kerple_power", "dape"),
    "DAPE-FIRE": ("fire", "dape"),
    "DAPE-Kerple Concat": ("kerple_log", "dape_concat"),
    "dape_concat-kerple": ("kerple_log", "dape_concat"),
    "DAPE-Kerple Add_Residual": ("kerple_log", "dape_add"),
    "dape_add-kerple": ("kerple_log", "dape_add"),
    "DAPE1x3-Kerple": ("kerple_log", "conv"),
    "conv k=3": ("kerple_log", "conv"),
    "conv k=1": {"color": "#CC79A7", "linestyle": "-."},  # a 1-tap convolution is DAPE's per-cell MLP
    "DAPE1x5-Kerple": {"color": "#AA4499", "linestyle": "-."},
    "conv k=5": {"color": "#AA4499", "linestyle": "-."},
    "DAPE-Kerple, 1x3's parameters": {"color": "#88CCEE", "linestyle": "--"},
    "DAPE1x3-Kerple without tril": {"color": "#000000", "linestyle": (0, (1, 1))},
    "leaky_conv k=3": {"color": "#000000", "linestyle": (0, (1, 1))},
    "FoX": ("fox", "none"),
    "DAPE-FoX": ("fox", "dape"),
    "CoPE": ("cope", "none"),
    # FoX's variants and the per-layer hybrids: each its own colour, its family's line style kept
    "FoX (ALiBi init)": {"color": "#44AA99", "linestyle": (0, (1, 1))},
    "FoX Pro": {"color": "#882255", "linestyle": (0, (6, 2, 1, 2))},
    "PaTH": ("path", "none"),
    "Stick-breaking": ("stick_breaking", "none"),
    "RNoPE-SWA": {"color": "#CC6677", "linestyle": "--"},
    "iRoPE": {"color": "#661100", "linestyle": ":"},
    "SWAN": {"color": "#DDCC77", "linestyle": "-."},
    "RoPE/NoPE hybrid": {"color": "#D55E00", "linestyle": (0, (4, 1, 1, 1))},
    # notebook 06: a student's bias and the same with DAPE
    "my_bias": {"color": "#AA4499", "linestyle": "-"},
    "dape-my_bias": {"color": "#E69F00", "linestyle": "--"},
}
_OTHER_COLORS = ("#88CCEE", "#DDCC77", "#AA4499", "#44AA99", "#882255", "#999933", "#661100", "#332288")


def _name_key(label: str) -> str:
    return label.lower().replace("_", "-").replace(" ", "-")


_STYLE_KEYS = {_name_key(name): style for name, style in MODEL_STYLES.items()}


def _pe_and_refiner(label: str):
    """(pe, refiner) of a label such as "kerple_log", "kerple_log+dape" (`md.utils.model_label`) or
    "dape-kerple" / "dape-kerple_log" (refiner, a dash, then the encoding), else None."""
    pe, _, rest = label.partition("+")
    refiner = rest.split("+")[0] or "none"
    if pe in PE_COLORS and refiner in REFINER_LINESTYLES:
        return pe, refiner
    refiner, _, pe = label.partition("-")
    pe = {"kerple": "kerple_log"}.get(pe, pe)
    if pe in PE_COLORS and refiner in REFINER_LINESTYLES:
        return pe, refiner
    return None


def model_style(label: str) -> dict:
    """`{"color": ..., "linestyle": ...}` of a model in every figure: by the study's, the demo's and the notebooks'
    names, by `pe` or `pe+refiner` (as `md.utils.model_label` writes it), and for any other name a colour fixed
    by the name itself (dash-dotted), so a model looks the same in every figure that draws it."""
    style = _STYLE_KEYS.get(_name_key(label))
    if isinstance(style, dict):
        return dict(style)
    pe_refiner = style or _pe_and_refiner(label)
    if pe_refiner:
        pe, refiner = pe_refiner
        color = PE_COLORS[pe] if refiner == "none" else VARIANT_COLORS.get((pe, refiner), PE_COLORS[pe])
        return {"color": color, "linestyle": REFINER_LINESTYLES[refiner]}
    return {"color": _OTHER_COLORS[zlib.crc32(label.encode()) % len(_OTHER_COLORS)], "linestyle": (0, (4, 1, 1, 1))}


# Lines without a model of their own (heads, kernels, texts) cycle through Okabe & Ito's colour-blind safe colours.
LINE_CYCLE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#999933")
REFERENCE_LINE = "#888888"  # the training length and other marks that are not data


def use_style() -> None:
    """The look of every notebook figure, set once (`notebook.start()` calls it): the colour-blind safe cycle
    above, light grid lines where a figure draws them, small legends."""
    plt.rcParams.update(
        {
            "axes.prop_cycle": plt.cycler(color=LINE_CYCLE),
            "grid.alpha": 0.3,  # the grid stays off by default: it would cross heat maps
            "legend.fontsize": "small",
            "figure.dpi": 100,
        }
    )


class _PlainLabels(Formatter):
    """The ticks a log formatter labels, labelled as plain numbers ("62.5", not "6.25 × 10¹")."""

    def __init__(self, log_formatter):
        self.log_formatter = log_formatter

    def set_locs(self, locs):
        self.log_formatter.set_locs(locs)

    def __call__(self, value, pos=None):
        return f"{value:g}" if self.log_formatter(value, pos) else ""


def labelled_ticks(ax, which: str) -> list[str]:
    """The non-empty tick labels of `ax`'s x or y axis within its view limits (major and minor ticks)."""
    axis = ax.xaxis if which == "x" else ax.yaxis
    low, high = sorted(ax.get_xlim() if which == "x" else ax.get_ylim())
    labels = []
    for locator, formatter in (
        (axis.get_major_locator(), axis.get_major_formatter()),
        (axis.get_minor_locator(), axis.get_minor_formatter()),
    ):
        values = [v for v in locator() if low * (1 - 1e-9) <= v <= high * (1 + 1e-9)]
        labels += [text for text in formatter.format_ticks(values) if text.strip()]
    return labels


def label_log_axes(fig: Figure) -> Figure:
    """Give every logarithmic axis of `fig` at least two labelled ticks: an axis that shows fewer gets ticks at
    1, 2 and 5 times the powers, or failing that four evenly spaced ones, labelled as plain numbers; a base-10
    axis within one decade keeps its ticks, labelled with plain numbers."""
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    for ax in fig.axes:
        for which, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            if axis.get_scale() != "log":
                continue
            if not isinstance(axis.get_major_formatter(), (LogFormatter, _PlainLabels)):
                axis.set_minor_formatter(NullFormatter())  # the figure labelled its own ticks: no others labelled
            low, high = sorted(ax.get_xlim() if which == "x" else ax.get_ylim())
            if axis.get_transform().base == 10 and 0 < low and high < 10 * low:
                for formatter, use in (
                    (axis.get_major_formatter(), axis.set_major_formatter),
                    (axis.get_minor_formatter(), axis.set_minor_formatter),
                ):
                    if isinstance(formatter, LogFormatter):  # not the labels a figure set itself
                        use(_PlainLabels(formatter))
            if len(labelled_ticks(ax, which)) >= 2:
                continue
            base = axis.get_transform().base
            axis.set_major_locator(LogLocator(base=base, subs=(1.0, 2.0, 5.0) if base == 10 else (1.0, 1.5)))
            axis.set_major_formatter(plain)
            axis.set_minor_formatter(NullFormatter())
            if len(labelled_ticks(ax, which)) < 2:
                axis.set_major_locator(MaxNLocator(nbins=4))
    return fig


def save_figure(fig: Figure, path: str | os.PathLike, dpi: int = 150) -> Path:
    """Save `fig` atomically; the format follows the file suffix (`.png`, `.pdf`, `.svg`, ...)."""
    path = Path(path)
    with atomic_path(path) as tmp:
        figure_writer(fig, path.name, dpi)(tmp)
    return path


def figure_writer(fig: Figure, name: str, dpi: int = 150):
    """A function that writes `fig` to the path it is given, in the format of `name`'s suffix (for
    `utils.write_results`, which writes a plot together with the results it shows)."""
    fmt = Path(name).suffix.lstrip(".").lower()
    if not fmt:
        raise ValueError(f"cannot tell the image format of {name}: give it a suffix such as .png or .pdf")
    return lambda path: fig.savefig(path, format=fmt, dpi=dpi, bbox_inches="tight")


def _axes(ax, figsize):
    if ax is None:
        fig, ax = plt.subplots(figsize=figsize)
        return fig, ax
    return ax.figure, ax


def _finish_curves(fig, ax, train_length, xlabel: str, ylabel: str, title: str, path) -> Figure:
    """Log2 length axis, the training length marked, labels, grid, legend; saved when a path is given."""
    ax.set_xscale("log", base=2)
    if train_length is not None:
        ax.axvline(
            train_length, color=REFERENCE_LINE, linestyle="--", linewidth=1, label=f"training length {train_length}"
        )
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    label_log_axes(fig)
    if path is not None:
        save_figure(fig, path)
    return fig


def plot_extrapolation(
    results: dict[str, dict[int, float]],
    train_length: int | None = None,
    ax=None,
    title: str | None = None,
    path: str | os.PathLike | None = None,
) -> Figure:
    """Perplexity against evaluation length, one line per model, log axes, a dashed line at the training
    length. NaN points (lengths a model cannot run) are left out of its line."""
    fig, ax = _axes(ax, (7, 4.5))
    for name, curve in results.items():
        points = sorted((length, ppl) for length, ppl in curve.items() if not math.isnan(ppl))
        if points:
            ax.plot(*zip(*points), marker="o", markersize=4, label=name, **model_style(name))
    ax.set_yscale("log")
    return _finish_curves(
        fig,
        ax,
        train_length,
        "evaluation length (tokens)",
        "perplexity per byte",
        title or "Length extrapolation",
        path,
    )


def plot_loss_by_position(
    losses: dict[str, torch.Tensor],
    train_length: int | None = None,
    ax=None,
    title: str | None = None,
    path: str | os.PathLike | None = None,
) -> Figure:
    """Loss at each position (from `evaluate.loss_by_position`), one line per model, with the training
    length marked: where a model stops extrapolating its curve turns up."""
    fig, ax = _axes(ax, (7, 4.5))
    for name, curve in losses.items():
        curve = torch.as_tensor(curve).detach().float().cpu().numpy()
        ax.plot(range(1, len(curve) + 1), curve, linewidth=1, label=name, **model_style(name))
    return _finish_curves(
        fig,
        ax,
        train_length,
        "position (tokens of context)",
        "next-token loss (nats)",
        title or "Loss by position",
        path,
    )


def plot_bias(
    bias: torch.Tensor, heads=None, title: str | None = None, path: str | os.PathLike | None = None
) -> Figure:
    """Heatmaps of an attention bias `(n_head, Tq, Tk)` (or one `(Tq, Tk)` matrix), one panel per head.

    Cells above the diagonal are usually masked by causal attention; they are drawn as they are given. Every
    head is drawn on one colour scale (the title says so), so that heads compare at a glance.
    """
    bias = torch.as_tensor(bias).detach().float().cpu()
    if bias.dim() == 2:
        bias = bias[None]
    if bias.dim() != 3:
        raise ValueError(f"bias must have shape (n_head, Tq, Tk) or (Tq, Tk), got {tuple(bias.shape)}")
    heads = list(range(bias.shape[0])) if heads is None else list(heads)
    bad = [h for h in heads if not 0 <= h < bias.shape[0]]
    if bad or not heads:
        raise ValueError(f"heads must be a non-empty selection of 0..{bias.shape[0] - 1}, got {heads}")
    shown = bias[heads]
    finite = shown[torch.isfinite(shown)]
    low, high = (finite.min().item(), finite.max().item()) if finite.numel() else (0.0, 1.0)
    fig, axes = plt.subplots(1, len(heads), figsize=(3 * len(heads) + 0.6, 3.4), squeeze=False, layout="constrained")
    for ax, head in zip(axes[0], heads):  # one colour scale for every head, so that their biases compare
        image = ax.imshow(bias[head].numpy(), cmap="viridis", aspect="auto", vmin=low, vmax=high)
        ax.set_title(f"head {head}")
        ax.set_xlabel("key position j")
    fig.colorbar(image, ax=list(axes[0]), shrink=0.9)
    axes[0][0].set_ylabel("query position i")
    shared = "all heads on one colour scale" if len(heads) > 1 else ""
    fig.suptitle(f"{title} ({shared})" if title and shared else title or shared)
    if path is not None:
        save_figure(fig, path)
    return fig


def markdown_table(results: dict[str, dict[int, float]], train_length: int | None = None, digits: int = 2) -> str:
    """A markdown table: one row per model, one column per evaluation length (ascending), perplexities
    rounded to `digits`; the best model at each length in bold, NaN shown as `n/a`, and the training
    length's column marked `(train)`."""
    lengths = sorted({length for curve in results.values() for length in curve})
    header = ["model"] + [f"{length} (train)" if length == train_length else str(length) for length in lengths]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" + "---:|" * len(lengths)]
    best = {}
    for length in lengths:
        values = [curve[length] for curve in results.values() if not math.isnan(curve.get(length, math.nan))]
        best[length] = min(values, default=None)
    for name, curve in results.items():
        cells = [name]
        for length in lengths:
            value = curve.get(length, math.nan)
            if math.isnan(value):
                cells.append("n/a")
            else:
                text = f"{value:.{digits}f}"
                cells.append(f"**{text}**" if value == best[length] else text)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_accuracy(
    curves: dict[str, dict[int, float]],
    train_length: int | None = 40,
    chance: float | None = None,
    ax=None,
    title: str | None = None,
    path: str | os.PathLike | None = None,
) -> Figure:
    """Accuracy against input length, one line per model (``{label: {n: accuracy}}``), a dashed line at the
    longest training length and a dotted one at chance level; written atomically to ``path`` if given."""
    fig, ax = _axes(ax, (7, 4.5))
    for label, curve in curves.items():
        points = sorted((int(n), 100 * acc) for n, acc in curve.items())
        ax.plot(
            *zip(*points),
            marker="o" if len(points) <= 30 else None,
            markersize=3,
            linewidth=1.2,
            label=label,
            **model_style(label),
        )
    if train_length is not None:
        ax.axvline(
            train_length,
            color=REFERENCE_LINE,
            linestyle="--",
            linewidth=1,
            label=f"longest training input ({train_length})",
        )
    if chance is not None:
        ax.axhline(100 * chance, color="black", linestyle=":", linewidth=1, label=f"chance ({100 * chance:.0f}%)")
    ax.set_xlabel("input length n")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 102)
    ax.set_title(title or "Accuracy by input length")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    if path is not None:
        save_figure(fig, path)
    return fig


def write_extrapolation(
    out: str | os.PathLike, results: dict[str, dict[int, float]], train_length: int | None, title: str, details: dict
) -> str:
    """``out/results.md``, ``results.json`` and ``extrapolation.png`` of perplexity curves (the demo's and
    ``eval``'s); returns the markdown table."""
    out = Path(out)
    table = markdown_table(results, train_length=train_length)
    fig = plot_extrapolation(results, train_length=train_length, title=title)
    try:
        write_results(
            out,
            title,
            f"Perplexity by evaluation length (lower is better).\n\n{table}",
            details,
            {"results": results, "train_length": train_length, **details},
            figures={"extrapolation.png": figure_writer(fig, "extrapolation.png")},
        )
    finally:
        plt.close(fig)
    return table
