"""The refiner benchmark compares like with like: its paper-form reference computes what `dape` computes."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import torch

import minidape as md

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_refiners.py"


def load_bench():
    if "paper_dape" in md.REFINER_NAMES:       # registered by an earlier import in this session
        return sys.modules["bench_refiners"]
    spec = importlib.util.spec_from_file_location("bench_refiners", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_refiners"] = module
    spec.loader.exec_module(module)
    return module


def test_paper_form_reference_equals_dape_forward_and_gradients():
    load_bench()                               # registers the paper_dape refiner
    torch.manual_seed(0)
    cfg = dict(vocab_size=256, n_layer=2, n_head=4, n_embd=32, block_size=16, pe="kerple_log")
    ours = md.GPT(md.GPTConfig(refiner="dape", **cfg))
    paper = md.GPT(md.GPTConfig(refiner="paper_dape", attn_chunk=40, **cfg))
    for layer in ours.blocks:                  # make the MLP matter
        torch.nn.init.normal_(layer.attn.refiner.f.mlp[2].weight, std=0.5)
    paper.load_state_dict({k.replace("refiner.f.mlp", "refiner.mlp"): v for k, v in ours.state_dict().items()})
    idx = torch.randint(0, 256, (2, 40))
    loss_ours, loss_paper = ours(idx, idx)[1], paper(idx, idx)[1]
    loss_ours.backward()
    loss_paper.backward()
    torch.testing.assert_close(loss_ours, loss_paper)
    grads_paper = dict(paper.named_parameters())
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, grads_paper[name.replace("refiner.f.mlp", "refiner.mlp")].grad,
                                   atol=1e-6, rtol=1e-4)


def test_plain_rope_gpt_matches_ours_in_size():
    bench = load_bench()
    ours = bench.build("tiny", "rope", "none", 64, torch.device("cpu"))
    plain = bench.build("tiny", "rope", "none", 64, torch.device("cpu"), plain=True)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in plain.parameters())


def test_bench_cli_help():
    out = subprocess.run([sys.executable, "-m", "minidape", "bench", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--quick" in out.stdout
