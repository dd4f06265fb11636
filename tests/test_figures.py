"""The rules every notebook figure keeps (minidape/lab/figure_rules.py): each rule is seen to catch a figure that
breaks it and to pass one that keeps it. The notebooks themselves are checked figure by figure by their own nbval
run (`make test-notebooks` sets MINIDAPE_CHECK_FIGURES=1, which makes every plt.show() raise on a bad figure)."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.ticker import NullFormatter  # noqa: E402

from minidape.lab import figure_rules, plots  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_a_repeated_legend_label_is_caught():
    fig, ax = plt.subplots()
    ax.plot([1, 2], [1, 2], color="#0072B2", label="T = 256")
    ax.plot([1, 2], [2, 3], color="#D55E00", label="T = 256")
    ax.legend()
    assert any("legend repeats ['T = 256']" in p for p in figure_rules.figure_problems(fig))
    ax.get_lines()[1].set_label("T = 1024")
    ax.legend()
    assert figure_rules.figure_problems(fig) == []


def test_colours_too_alike_are_caught_and_the_colour_blind_pairs_of_the_issue_told_apart():
    fig, ax = plt.subplots()
    ax.plot([1, 2], [1, 2], color="#2ca02c", label="Kerple")  # the old palette's Kerple green ...
    ax.plot([1, 2], [2, 3], color="#3aa83a", label="DAPE-Kerple")  # ... and a green a reader cannot tell from it
    assert any("too alike" in p for p in figure_rules.figure_problems(fig))
    # the palette: every model of one notebook figure in a colour of its own
    for group in (
        ["kerple_log", "dape-kerple", "dape_concat-kerple", "dape_add-kerple"],  # 04
        ["kerple_log", "conv k=1", "conv k=3", "conv k=5"],  # 05
        ["kerple_log", "conv k=3", "leaky_conv k=3"],  # 05
        ["learned", "none", "rope", "alibi", "kerple_log", "fire"],  # 03
        ["ALiBi", "Kerple", "DAPE-Kerple", "DAPE1x3-Kerple"],  # 07
        ["ALiBi", "Kerple-log", "DAPE-Kerple", "FoX", "DAPE-FoX", "CoPE", "RoPE/NoPE hybrid"],  # 08
        ["kerple_log", "my_bias", "dape-my_bias"],  # 06
    ):
        colors = [plots.model_style(name)["color"] for name in group]
        for i, first in enumerate(group):
            for j in range(i + 1, len(group)):
                distance = figure_rules.color_distance(colors[i], colors[j])
                assert distance >= figure_rules.MIN_COLOR_DISTANCE, (first, group[j], distance)


def test_a_log_axis_with_one_labelled_tick_is_caught_and_label_log_axes_repairs_it():
    fig, ax = plt.subplots()
    ax.plot([64, 128, 256], [20.0, 80.0, 500.0], label="rope")
    ax.set_yscale("log")
    ax.set_ylim(15, 600)
    ax.yaxis.set_minor_formatter(NullFormatter())  # what a reader saw: "10²" the only label of the axis
    ax.legend()
    assert any("log y axis" in p for p in figure_rules.figure_problems(fig))
    plots.label_log_axes(fig)
    assert len(plots.labelled_ticks(ax, "y")) >= 2
    assert figure_rules.figure_problems(fig) == []


def test_heads_on_their_own_colour_scales_are_caught_and_plot_bias_shares_one():
    bias = torch.stack([-torch.arange(16.0).expand(16, 16) * 2.0**-h for h in range(4)])  # ALiBi-like heads
    fig, axes = plt.subplots(1, 4)
    for head, ax in enumerate(axes):
        ax.imshow(bias[head].numpy())  # each head scaled to its own range: the four look identical
        ax.set_title(f"head {head}")
    fig.suptitle("ALiBi's heads")
    problems = figure_rules.figure_problems(fig)
    assert any("different colour scales" in p for p in problems), problems
    assert any("say in the figure's title" in p for p in problems), problems
    shared = plots.plot_bias(bias, title="ALiBi")
    assert figure_rules.figure_problems(shared) == []
    assert "one colour scale" in shared.get_suptitle()


def test_install_makes_show_raise_on_a_bad_figure_only_when_asked(monkeypatch):
    monkeypatch.setattr(plt, "show", lambda *args, **kwargs: None)
    figure_rules.install()
    figure_rules.install()  # twice: still one wrapper
    assert plt.show.prepares_figures
    fig, ax = plt.subplots()
    ax.plot([1, 2], [1, 2], color="#0072B2", label="a")
    ax.plot([1, 2], [1, 3], color="#0072B2", label="b")
    ax.legend()
    monkeypatch.delenv(figure_rules.CHECK, raising=False)
    plt.show()  # not checking: shown as it is
    monkeypatch.setenv(figure_rules.CHECK, "1")
    with pytest.raises(figure_rules.FigureProblem, match="'a' and 'b'"):
        plt.show()


def test_one_model_keeps_its_colour_across_panels():
    fig, (left, right) = plt.subplots(1, 2)
    left.plot([1, 2], [1, 2], color="#0072B2", label="ALiBi")
    right.plot([1, 2], [1, 2], color="#D55E00", label="ALiBi")
    assert any("changes colour" in p for p in figure_rules.figure_problems(fig))
    right.get_lines()[0].set_color("#0072B2")
    assert figure_rules.figure_problems(fig) == []


def test_a_full_run_records_its_reference_and_a_quick_run_draws_it_beside_its_own(tmp_path, monkeypatch):
    from minidape import notebook

    stored = tmp_path / "reference_runs.json"
    monkeypatch.setenv("MINIDAPE_QUICK", "0")
    monkeypatch.setenv(notebook.RECORD_FIGURES, str(stored))
    full_run = {"rope": {64: 3.1, 1024: 19.0}, "alibi": {64: 3.0, 1024: 3.2}}
    assert notebook.reference("03/last_k", full_run) is full_run
    assert notebook.stored_references(stored) == {"03/last_k": full_run}  # lengths come back as ints
    monkeypatch.setenv("MINIDAPE_QUICK", "1")
    monkeypatch.setattr(notebook, "stored_references", lambda: {"03/last_k": full_run})
    quick_run = {"rope": {64: 62.0, 256: 62.1}, "alibi": {64: 61.9, 256: 62.0}}
    shown = notebook.reference("03/last_k", quick_run)
    assert shown == full_run
    fig = notebook.beside_reference(plots.plot_extrapolation, quick_run, shown, train_length=64, title="last_k")
    titles = [ax.get_title() for ax in fig.axes]
    assert len(titles) == 2 and "quick mode" in titles[0] and "teacher's reference" in titles[1]
    assert figure_rules.figure_problems(fig) == []
    assert len(notebook.beside_reference(plots.plot_extrapolation, quick_run, None, title="x").axes) == 1


def test_time_models_warms_up_and_gives_every_model_a_median():
    import minidape as md
    from minidape import notebook

    config = md.GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8)
    models = {
        "none": md.GPT(config),
        "alibi": md.GPT(md.GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, pe="alibi")),
    }
    idx = torch.randint(256, (2, 8))
    times = notebook.time_models(models, idx, repeats=3, backward=True)
    assert set(times) == {"none", "alibi"} and all(t > 0 for t in times.values())
    assert all(p.grad is None for model in models.values() for p in model.parameters())  # no gradient left behind
