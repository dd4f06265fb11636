"""Every place that must know a built-in encoding knows it, or a test names the place (docs/new_encoding.md is the
recipe); adding an encoding changes no checked notebook output."""

import contextlib
import io
import re
from pathlib import Path

import jupytext
import pytest
import torch
from test_model import BUILTIN_PES

import minidape as md
from minidape import fast_encodings
from minidape import model as M
from minidape.lab import bench, plots

REPO = Path(__file__).parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.py"))


def places_missing(name: str) -> list[str]:
    """The places (files, and what in them) that do not know the built-in encoding ``name``; the places that read the
    registry (``md.PE_NAMES``: GPTConfig, compare's help and labels, the CLI's choices, bench's GPU bias list) need
    nothing."""
    encoding = M.PE_REGISTRY[name]
    missing = []
    if name not in plots.PE_COLORS:
        missing.append("minidape/lab/plots.py: PE_COLORS (its colour in every figure; else a hash-picked one)")
    fast_forms = (*fast_encodings.TRANSLATION_INVARIANT, M.FIREBias)
    if (
        issubclass(encoding, M.AdditiveBias)
        and encoding not in fast_forms
        and encoding not in fast_encodings.NO_FAST_FORM
    ):
        missing.append("minidape/fast_encodings.py: a fast form, or NO_FAST_FORM with the reason (else a slower path)")
    if name not in BUILTIN_PES:
        missing.append("tests/test_model.py: BUILTIN_PES (causality, fast = reference, every refiner)")
    if f'"{name}"' not in (REPO / "tests" / "test_pinned.py").read_text():
        missing.append("tests/test_pinned.py: a test against the paper's equation, written in the test")
    if f"`{name}`" not in (REPO / "README.md").read_text():
        missing.append("README.md: the encoding named where the built-ins are listed")
    return missing


@pytest.mark.parametrize("name", [name for name, cls in M.PE_REGISTRY.items() if M._builtin(cls)])
def test_every_place_knows_every_builtin_encoding(name):
    assert not places_missing(name), f"pe {name!r} is missing from: {places_missing(name)}"


def checked_cells(path: Path) -> list[str]:
    """The sources of a notebook's code cells whose output nbval compares (tagged NBVAL_CHECK_OUTPUT)."""
    return [cell.source for cell in jupytext.read(path).cells if "NBVAL_CHECK_OUTPUT" in cell.source]


def test_no_checked_notebook_cell_prints_from_the_registry():
    """A checked cell that loops over the registry's names would change its output whenever an encoding is added."""
    lists_the_registry = re.compile(
        r"for .* in (md\.)?PE_NAMES|list\((md\.)?PE_NAMES\)|PE_REGISTRY\.(items|keys|values)"
    )
    offenders = [
        f"{path.name}: {line.strip()!r}"
        for path in NOTEBOOKS
        for source in checked_cells(path)
        for line in source.splitlines()
        if lists_the_registry.search(line.partition("#")[0])
    ]
    assert not offenders, offenders


def run_map_cell() -> str:
    """Notebook 01's checked map cell (the table of encodings) run as the notebook runs it; its printed output."""
    source = next(s for s in checked_cells(REPO / "notebooks" / "01_positional_encodings.py") if "kind_of" in s)
    namespace = {
        "md": md,
        "AbsolutePositions": M.AbsolutePositions,
        "AdditiveBias": M.AdditiveBias,
        "RotaryEmbedding": M.RotaryEmbedding,
        "DEVICE": torch.device("cpu"),
        "tiny_config": lambda pe: md.GPTConfig(n_layer=2, n_head=4, n_embd=128, block_size=64, pe=pe),
    }
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(source, "01_positional_encodings.py", "exec"), namespace)
    return printed.getvalue()


class ThrowawayBias(M.AdditiveBias):
    """A parameter-free bias added as a built-in would be (its class in minidape's model module)."""

    def __init__(self, cfg):
        super().__init__()

    def forward(self, q_pos, k_pos):
        return -0.5 * (q_pos[:, None] - k_pos[None, :]).clamp(min=0).float().expand(4, -1, -1)


ThrowawayBias.__module__ = "minidape.model"


def test_a_new_builtin_changes_no_checked_output_and_every_place_knows_it_or_is_named():
    """Followed as a newcomer would: register a built-in; the places that read the registry know it at once, the
    others are each named by ``places_missing`` (so the per-encoding test above fails until they do), and notebook
    01's checked table prints the same."""
    name = "throwaway_test_bias"
    before = run_map_cell()
    M.register_pe(name)(ThrowawayBias)
    try:
        assert M._builtin(M.PE_REGISTRY[name])
        assert run_map_cell() == before
        cfg = md.GPTConfig(vocab_size=32, n_layer=1, n_head=4, n_embd=16, block_size=8, pe=name)
        assert md.check_causal(cfg, length=32)
        assert name in bench.bias_pes()  # the GPU benchmark reads the registry
        from minidape import __main__ as cli

        help_text = cli.build_parser()._subparsers._group_actions[0].choices["compare"].format_help()
        assert name in "".join(help_text.split())  # compare's help lists PE_NAMES
        missing = " ".join(places_missing(name))
        for place in ("plots.py: PE_COLORS", "fast_encodings.py", "BUILTIN_PES", "test_pinned.py", "README.md"):
            assert place in missing, (place, missing)
    finally:
        del M.PE_REGISTRY[name]
