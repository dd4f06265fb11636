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

from ..utils import atomic_path, write_results

# One colour and line style per model in every figure (demo, notebooks, study, compare). A PE has one colour,
# a refiner one line style, so "DAPE-X" is drawn in X's colour, dashed; the study's models that share a PE and a
# refiner (kernel sizes, widths) get their own colours below.
PE_COLORS = {
    "none": "#7f7f7f",
    "rope": "#d62728",
    "yarn": "#ff9896",
    "sinusoidal": "#8c564b",
    "learned": "#e377c2",
    "t5": "#17becf",
    "alibi": "#1f77b4",
    "kerple_log": "#2ca02c",
    "kerple_power": "#bcbd22",
    "fire": "#ff7f0e",
    "fox": "#9467bd",
    "cope": "#8c6d31",
    "rope_pi": "#f7b6d2",
    "rope_ntk": "#c49c94",
    "xpos": "#dbdb8d",
    "hope": "#9edae5",
    "stick_breaking": "#393b79",
    "path": "#637939",
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
# The names the study (and its demo and notebook 07) give their models: (pe, refiner) or an explicit colour and style.
MODEL_STYLES = {
    "NoPE": ("none", "none"),
    "RoPE": ("rope", "none"),
    "sinusoidal APE": ("sinusoidal", "none"),
    "learned APE": ("learned", "none"),
    "ALiBi": ("alibi", "none"),
    "Kerple-log": ("kerple_log", "none"),
    "Kerple-power": ("kerple_power", "none"),
    "FIRE": ("fire", "none"),
    "DAPE-ALiBi": ("alibi", "dape"),
    "DAPE-Kerple": ("kerple_log", "dape"),
    "DAPE-Kerple-power": ("kerple_power", "dape"),
    "DAPE-FIRE": ("fire", "dape"),
    "DAPE-Kerple Concat": ("kerple_log", "dape_concat"),
    "DAPE-Kerple Add_Residual": ("kerple_log", "dape_add"),
    "DAPE1x3-Kerple": ("kerple_log", "conv"),
    "DAPE1x5-Kerple": {"color": "#9467bd", "linestyle": "-."},
    "DAPE-Kerple, 1x3's parameters": {"color": "#004d00", "linestyle": "--"},
    "DAPE1x3-Kerple without tril": {"color": "black", "linestyle": (0, (1, 1))},
    "FoX": ("fox", "none"),
    "DAPE-FoX": ("fox", "dape"),
    "CoPE": ("cope", "none"),
    "FoX (ALiBi init)": {"color": "#9467bd", "linestyle": (0, (1, 1))},
    "FoX Pro": {"color": "#9467bd", "linestyle": (0, (6, 2, 1, 2))},
    "PaTH": ("path", "none"),
    "Stick-breaking": ("stick_breaking", "none"),
    "RNoPE-SWA": {"color": "#ff9896", "linestyle": "--"},
    "iRoPE": {"color": "#ff9896", "linestyle": ":"},
    "SWAN": {"color": "#ff9896", "linestyle": "-."},
    "RoPE/NoPE hybrid": {"color": "#ff9896", "linestyle": (0, (4, 1, 1, 1))},
}
_OTHER_COLORS = ("#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5")


def model_style(label: str) -> dict:
    """`{"color": ..., "linestyle": ...}` of a model in every figure: by the study's and demo's names, by
    `pe` or `pe+refiner` (as `md.utils.model_label` writes it), and for any other name a colour fixed by the
    name itself (dash-dotted), so a model looks the same in every figure that draws it."""
    style = MODEL_STYLES.get(label)
    if isinstance(style, dict):
        return dict(style)
    pe, refiner = style if style else (label.partition("+")[0], label.partition("+")[2].split("+")[0] or "none")
    if pe in PE_COLORS and refiner in REFINER_LINESTYLES:
        return {"color": PE_COLORS[pe], "linestyle": REFINER_LINESTYLES[refiner]}
    return {"color": _OTHER_COLORS[zlib.crc32(label.encode()) % len(_OTHER_COLORS)], "linestyle": (0, (4, 1, 1, 1))}


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
        ax.axvline(train_length, color="gray", linestyle="--", linewidth=1, label=f"training length {train_length}")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
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

    Cells above the diagonal are usually masked by causal attention; they are drawn as they are given.
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
    fig, axes = plt.subplots(1, len(heads), figsize=(3 * len(heads), 3.2), squeeze=False)
    for ax, head in zip(axes[0], heads):
        image = ax.imshow(bias[head].numpy(), cmap="viridis", aspect="auto")
        ax.set_title(f"head {head}")
        ax.set_xlabel("key position j")
        fig.colorbar(image, ax=ax, fraction=0.046)
    axes[0][0].set_ylabel("query position i")
    if title:
        fig.suptitle(title)
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
            train_length, color="gray", linestyle="--", linewidth=1, label=f"longest training input ({train_length})"
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
