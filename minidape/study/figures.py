"""The study's figures: mean ± std bands over seeds, one figure per claim, C6's accuracy curves."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.ticker import FormatStrFormatter, NullFormatter

from ..lab.evaluate import PROTOCOLS
from ..lab.plots import model_style, save_figure
from .budgets import CHE_MAX_TRAIN_LENGTH
from .claims import CHE_MODELS, CHE_TASKS, Claim
from .runs import corpus_key
from .statistics import mean_std


def plot_bands(
    curves: dict[str, dict[int, list[float]]],
    ax,
    train_length: int | None = None,
    ylabel: str = "perplexity per byte",
    log_y: bool = True,
    styles: dict | None = None,
) -> None:
    """Mean over seeds as a line and mean ± std as a shaded band, one per model in its fixed style
    (`md.plots.model_style`, or `styles[label]`: line options); NaN points left out."""
    for label, curve in curves.items():
        points = [(length, *mean_std(values)) for length, values in sorted(curve.items())]
        points = [point for point in points if not math.isnan(point[1])]
        if not points:
            continue
        lengths, means, stds = zip(*points)
        style = (styles or {}).get(label) or model_style(label)
        ax.plot(lengths, means, marker="o", markersize=3, label=label, **style)
        ax.fill_between(
            lengths,
            [m - s for m, s in zip(means, stds)],
            [m + s for m, s in zip(means, stds)],
            color=style["color"],
            alpha=0.15,
        )
    ax.set_xscale("log", base=2)
    ticks = []
    for length in sorted({length for curve in curves.values() for length in curve}):
        if not ticks or length >= 1.15 * ticks[-1]:  # neighbours like 40 and 41 would print on each other
            ticks.append(length)
    ax.set_xticks(ticks)
    ax.xaxis.set_major_formatter(FormatStrFormatter("%d"))
    if log_y:
        ax.set_yscale("log")
        # Plain numbers: matplotlib's default 10^k labels go through mathtext, most of a figure's drawing time.
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(FormatStrFormatter("%g"))  # perplexities span less than a decade here
    ax.xaxis.set_minor_formatter(NullFormatter())
    if train_length is not None:
        ax.axvline(train_length, color="gray", linestyle="--", linewidth=1)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)


def figure_legend(fig, axes) -> None:
    """One legend for the whole figure, every model drawn in any panel once (its style is the same in all)."""
    handles = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(
        handles.values(), handles.keys(), loc="outside lower center", ncols=min(len(handles), 5), fontsize="small"
    )


def claim_figure(claim: Claim, results: dict, places: list[tuple[str, int]], path: Path) -> None:
    fig, axes = plt.subplots(
        len(places),
        len(PROTOCOLS),
        figsize=(6 * len(PROTOCOLS), 3.6 * len(places) + 0.8),
        squeeze=False,
        layout="constrained",
    )
    for row, (corpus, train_length) in enumerate(places):
        for column, protocol in enumerate(PROTOCOLS):
            ax = axes[row][column]
            curves = {
                label: results["lm"][(corpus, train_length, label)][protocol]
                for label in claim.models
                if (corpus, train_length, label) in results["lm"]
            }
            plot_bands(curves, ax, train_length)
            ax.set_title(f"{corpus_key(corpus)}, trained at {train_length}, {protocol}", fontsize="medium")
            ax.set_xlabel("evaluation length")
    figure_legend(fig, axes.flat)
    fig.suptitle(f"{claim.key}: {claim.title}", fontsize="medium")
    save_figure(fig, path, dpi=100)
    plt.close(fig)


def che_figure(results: dict, path: Path) -> None:
    fig, axes = plt.subplots(
        1, len(CHE_TASKS), figsize=(4.5 * len(CHE_TASKS), 4.2), squeeze=False, layout="constrained"
    )
    for ax, task in zip(axes[0], CHE_TASKS):
        curves = {
            label: {n: [100 * acc for acc in values] for n, values in results["che_curves"][(task, label)].items()}
            for label in CHE_MODELS
        }
        plot_bands(curves, ax, CHE_MAX_TRAIN_LENGTH, ylabel="accuracy (%)", log_y=False)
        ax.set_title(task, fontsize="medium")
        ax.set_xlabel("input length")
    figure_legend(fig, axes.flat)
    fig.suptitle("C6: accuracy by test length (mean ± std over seeds)", fontsize="medium")
    save_figure(fig, path, dpi=100)
    plt.close(fig)


def compare_figure(perplexity: dict, subject: str, train_length: int, seeds: int, path: Path) -> None:
    """`compare`'s figure: one panel per protocol, every model's mean ± std over seeds in a colour of its own,
    the subject drawn strongest (black, thick, on top)."""
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles, used = {subject: {"color": "black", "linestyle": "-", "linewidth": 3.0, "zorder": 3}}, {"black"}
    for label in perplexity:
        if label == subject:
            continue
        style = model_style(label)
        if style["color"] in used:  # e.g. Kerple-log with and without a refiner: one colour each
            style["color"] = next((color for color in palette if color not in used), style["color"])
        used.add(style["color"])
        styles[label] = {**style, "linewidth": 1.2, "zorder": 2}
    fig, axes = plt.subplots(1, len(PROTOCOLS), figsize=(12, 4), squeeze=False)
    for ax, protocol in zip(axes[0], PROTOCOLS):
        plot_bands({label: curves[protocol] for label, curves in perplexity.items()}, ax, train_length, styles=styles)
        ax.set_title(f"{protocol} (mean ± std over {seeds} seeds)", fontsize="medium")
        ax.set_xlabel("evaluation length")
    axes[0][-1].legend(fontsize="small")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
