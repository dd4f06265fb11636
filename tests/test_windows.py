"""Per-layer attention windows (sliding, chunked), temperatures and QK-norm in the per-layer spec: the published
RoPE/NoPE hybrids written as one string, the fast path equal to model.py's form, and no key read outside a window."""

import copy
import math

import pytest
import torch
from test_pinned import learns

import minidape as md
from minidape import model as M

HYBRIDS = {  # the docstring's three hybrids, at block_size 16 with windows of 4
    "RNoPE-SWA": "rope@sliding=4,rope@sliding=4,rope@sliding=4,none",
    "iRoPE": "rope@chunk=4@qk_norm,rope@chunk=4@qk_norm,rope@chunk=4@qk_norm,none@temp=llama4",
    "SWAN": "none@temp=log_length,rope@sliding=4,rope@sliding=4,rope@sliding=4",
}


def tiny(**kw):
    return md.GPTConfig(**{**dict(vocab_size=64, n_layer=4, n_head=2, n_embd=16, block_size=16), **kw})


def test_each_published_hybrid_is_one_string():
    specs = {name: M.layer_specs(tiny(pe=pe)) for name, pe in HYBRIDS.items()}
    rnope = specs["RNoPE-SWA"]
    assert [(s.pe, s.window, s.chunked) for s in rnope] == [("rope", 4, False)] * 3 + [("none", 0, False)]
    irope = specs["iRoPE"]
    assert all(s.chunked and s.qk_norm and s.temperature is None for s in irope[:3])
    assert (irope[3].pe, irope[3].window, irope[3].temperature) == ("none", 0, "llama4")
    model = md.GPT(tiny(pe=HYBRIDS["iRoPE"]))
    assert [block.attn.temperature is not None for block in model.blocks] == [False, False, False, True]
    assert all(block.attn.q_norm is not None for block in model.blocks[:3]) and model.blocks[3].attn.q_norm is None
    assert specs["SWAN"][0].temperature == "log_length" and specs["SWAN"][1].window == 4


@pytest.mark.parametrize(
    "bad,message",
    [
        ("rope@slide=4", "unknown layer option 'slide=4'"),
        ("rope@sliding=0", "unknown layer option 'sliding=0'"),
        ("none@temp=hot", "unknown layer option 'temp=hot'"),
        ("ropes@sliding=4", "unknown pe 'ropes'"),
    ],
)
def test_a_bad_layer_option_is_named_with_the_valid_ones(bad, message):
    with pytest.raises(ValueError, match=message):
        tiny(pe=bad)
    with pytest.raises(ValueError, match="windows are for decoders"):
        tiny(pe="rope@sliding=4", causal=False)


@pytest.mark.parametrize(
    "pe,refiner",
    [
        (HYBRIDS["RNoPE-SWA"], "none"),
        (HYBRIDS["iRoPE"], "dape"),
        (HYBRIDS["SWAN"], "conv"),
        ("alibi@sliding=5", "conv"),
        ("fox@chunk=6", "dape"),
        ("cope@sliding=7", "none"),
        ("xpos@sliding=9", "none"),
    ],
)
def test_the_fast_path_equals_the_papers_form_with_windows(pe, refiner):
    torch.manual_seed(0)
    model = md.GPT(tiny(pe=pe, refiner=refiner, n_layer=4))
    reference = copy.deepcopy(model)
    reference.cfg.fast = False
    idx = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(1))
    logits, loss = model(idx, idx)
    reference_logits, reference_loss = reference(idx, idx)
    torch.testing.assert_close(logits, reference_logits, atol=2e-5, rtol=1e-4)
    loss.backward()
    reference_loss.backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-6 + 1e-4 * q.grad.abs().max().item(), rtol=1e-3)
    assert md.check_causal(model, length=64)


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("window,chunked", [(5, False), (6, True)])
def test_a_windowed_layer_reads_no_key_outside_its_window(window, chunked, fast):
    """One windowed layer: changing every token outside query i's window leaves output i unchanged, and changing
    one inside it changes it (so the test can fail)."""
    option = f"chunk={window}" if chunked else f"sliding={window}"
    torch.manual_seed(0)
    model = md.GPT(tiny(pe=f"rope@{option}", n_layer=1, fast=fast)).eval()
    T = 30
    idx = torch.randint(0, 64, (1, T), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits = model(idx)[0]
        for i in (7, 17, 29):
            first = (i // window) * window if chunked else i - window + 1
            outside = idx.clone()
            outside[0, :first] = (idx[0, :first] + 1) % 64
            torch.testing.assert_close(model(outside)[0][0, i], logits[0, i], atol=1e-6, rtol=0)
            inside = idx.clone()
            inside[0, first] = (idx[0, first] + 1) % 64
            assert (model(inside)[0][0, i] - logits[0, i]).abs().max() > 1e-4


def test_windowed_temperatures_count_the_keys_in_the_window_and_llama4_is_its_formula():
    r"""Llama 4's temperature tuning: $1 + 0.1 \ln(\lfloor n/F\rfloor + 1)$ with $F$ = block_size; a window's
    temperatures count the keys in it."""
    cfg = tiny()
    llama4 = M.LengthTemperature(cfg, "llama4")(0, 70, 70)[0, :, 0]
    n = torch.arange(1, 71)
    torch.testing.assert_close(llama4, 1 + 0.1 * torch.log(torch.floor(n / 16) + 1))
    sliding = M.LengthTemperature(cfg, "log_length", window=20)(0, 70, 70)[0, :, 0]
    torch.testing.assert_close(sliding, (torch.log(n.clamp(max=20).float()) / math.log(16)).clamp(min=1))
    chunked = M.LengthTemperature(cfg, "log_length", window=20, chunked=True)(0, 70, 70)[0, :, 0]
    torch.testing.assert_close(chunked, (torch.log(((n - 1) % 20 + 1).float()) / math.log(16)).clamp(min=1))


def test_hybrids_train_through_compare_labels_and_the_cli_spec():
    from minidape.study.comparison import parse_model

    for label in ("RNoPE-SWA", "iRoPE", "SWAN"):
        name, overrides = parse_model(label)
        windows = [spec.window for spec in M.layer_specs(md.GPTConfig(**overrides))]
        assert overrides["n_layer"] == 4 and sorted(windows) == [0, 32, 32, 32], (label, windows)
    assert parse_model("rope@sliding=8,none+dape")[1] == {"pe": "rope@sliding=8,none", "refiner": "dape"}
    assert learns(md.GPT(tiny(pe=HYBRIDS["RNoPE-SWA"])))


def test_the_cli_takes_a_windowed_spec_and_names_a_bad_option(capsys):
    from minidape import __main__ as cli

    parsed = cli.build_parser().parse_args(["train", "--pe", HYBRIDS["iRoPE"], "--out", "x"])
    assert parsed.pe == HYBRIDS["iRoPE"]
    with pytest.raises(SystemExit) as exit_:  # the '@' options are read once the command line is parsed
        cli.main(["train", "--pe", "rope@window=4,none", "--out", "x"])
    assert exit_.value.code == 2 and "unknown layer option 'window=4'" in capsys.readouterr().err
