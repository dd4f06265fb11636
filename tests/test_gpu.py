"""Training and evaluation on a CUDA GPU: bf16 training, resume across devices, the fast path under bf16, bias
gradients through PyTorch's CUDA attention kernels and through FlexAttention, 16k-token evaluation memory, no host
sync between logging steps, DDP with NCCL, and the demo in quick mode.

Skipped with a reason where there is no GPU (CI, the project's CPU machine). `make test-gpu` runs them with
MINIDAPE_EXPECT_GPU=1, which turns "no GPU" into an error instead of a row of skips.
"""

import contextlib
import copy
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from test_fast import assert_same_under_bf16
from test_model import BUILTIN_COMBINATIONS
from test_train import SYNC_FREE_MODELS
from torch.nn.attention import SDPBackend, sdpa_kernel

import minidape as md
from minidape.lab import bench
from minidape.lab.checkpoints import CHECKPOINT_NAME, read_checkpoint

train_module = sys.modules["minidape.lab.train"]
REPO = Path(__file__).resolve().parent.parent
CUDA = torch.cuda.is_available()
if os.environ.get("MINIDAPE_EXPECT_GPU") == "1" and not CUDA:
    raise RuntimeError(
        "MINIDAPE_EXPECT_GPU=1 (make test-gpu) but torch.cuda.is_available() is False: no CUDA GPU "
        f"or a CPU-only torch ({torch.__version__}); install a CUDA build: make test-gpu TORCH=torch"
    )
requires_cuda = pytest.mark.skipif(
    not CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() is False); make test-gpu runs these where one is"
)
SMALL = dict(n_layer=2, n_head=4, n_embd=64, block_size=64)
BIASES_WITH_PARAMETERS = ["t5", "kerple_log", "kerple_power", "fire"]


@pytest.fixture(scope="module")
def tokens():
    return md.load_corpus("austen", "train")[:300_000]


class Interrupted(Exception):
    pass


# ----------------------------------------------------------------------------- training


@requires_cuda
def test_bf16_training_follows_the_float32_loss_curve(tokens, monkeypatch):
    """md.train on CUDA runs under bf16 autocast. The same run with autocast off (float32) must follow the same
    loss curve: within 0.1 nats at every logged step (a tenth of what both learn), not equal to it."""
    cfg = md.GPTConfig(**SMALL, pe="kerple_log", refiner="dape")
    settings = dict(steps=60, batch_size=16, lr=3e-3, log_every=5, device="cuda", seed=0, progress=False)
    _, bf16 = md.train(cfg, tokens, **settings)
    monkeypatch.setattr(train_module, "autocast_for", lambda device: contextlib.nullcontext())
    _, fp32 = md.train(cfg, tokens, **settings)
    bf16_losses, fp32_losses = ([entry["loss"] for entry in history] for history in (bf16, fp32))
    print("bf16:", [f"{loss:.3f}" for loss in bf16_losses], "\nfp32:", [f"{loss:.3f}" for loss in fp32_losses])
    assert fp32_losses[-1] < fp32_losses[0] - 1.0 and bf16_losses[-1] < bf16_losses[0] - 1.0
    assert max(abs(a - b) for a, b in zip(bf16_losses, fp32_losses)) < 0.1
    assert bf16_losses != fp32_losses  # autocast really changed the arithmetic


@requires_cuda
@pytest.mark.parametrize("first, then", [("cpu", "cuda"), ("cuda", "cpu")])
def test_resume_on_the_other_device(tokens, tmp_path, monkeypatch, first, then):
    """A run stopped after its step-4 checkpoint on one device continues on the other: the saved history is kept,
    the optimizer is the fused one of the new device with the saved moments on that device, and the resumed
    losses follow the uninterrupted run's within 0.1 nats (CPU float32 against CUDA bf16)."""
    cfg = md.GPTConfig(**SMALL, pe="kerple_log", refiner="dape")
    settings = dict(steps=10, batch_size=8, lr=3e-3, log_every=1, checkpoint_every=4, seed=3, progress=False)
    _, whole = md.train(cfg, tokens, device=first, **settings)

    save = train_module.save_checkpoint

    def save_then_stop(path, model, optimizer, step, *args, **kwargs):
        save(path, model, optimizer, step, *args, **kwargs)
        if step == 4:
            raise Interrupted

    with monkeypatch.context() as patch:
        patch.setattr(train_module, "save_checkpoint", save_then_stop)
        with pytest.raises(Interrupted):
            md.train(cfg, tokens, device=first, out=tmp_path, **settings)

    saved_history = read_checkpoint(tmp_path)["history"]
    built, build = [], train_module._optimizer
    monkeypatch.setattr(
        train_module, "_optimizer", lambda *args, **kwargs: built.append(build(*args, **kwargs)) or built[-1]
    )
    model, resumed = md.train(None, tokens, device=then, out=tmp_path, resume=True, **settings)
    (optim,) = built
    assert all(group["fused"] for group in optim.param_groups)
    assert {state["exp_avg"].device.type for state in optim.state.values()} == {then}
    assert {float(state["step"]) for state in optim.state.values()} == {10.0}
    # the step-4 checkpoint holds the losses of steps 0-3 (step 4's batch is the fifth update's): those are kept
    assert [entry["step"] for entry in saved_history] == [0, 1, 2, 3] and resumed[:4] == saved_history
    gaps = [abs(a["loss"] - b["loss"]) for a, b in zip(resumed, whole)]
    print(f"{first} -> {then}: loss gaps to the uninterrupted run", [f"{gap:.4f}" for gap in gaps])
    assert len(gaps) == 11 and max(gaps[:5]) < 1e-2 and max(gaps) < 0.1  # CUDA need not repeat itself bitwise
    assert md.utils.model_device(model).type == then and read_checkpoint(tmp_path)["step"] == 10


@requires_cuda
def test_training_steps_between_logs_do_not_synchronise_the_gpu(tokens, monkeypatch):
    """torch.cuda.set_sync_debug_mode("error") makes any host sync raise: on from the third step's batch to the
    last logged step (log_every = steps), off for the logging steps, which may sync."""
    draw_batch, steps = train_module._draw_batch, 8

    def draw(data, step, *args, **kwargs):
        torch.cuda.set_sync_debug_mode("error" if 2 <= step < steps else "default")
        return draw_batch(data, step, *args, **kwargs)

    monkeypatch.setattr(train_module, "_draw_batch", draw)
    try:
        for pe, refiner in SYNC_FREE_MODELS:
            md.train(
                md.GPTConfig(**SMALL, pe=pe, refiner=refiner),
                tokens,
                steps=steps,
                batch_size=8,
                log_every=steps,
                device="cuda",
                progress=False,
            )
    finally:
        torch.cuda.set_sync_debug_mode("default")


# ----------------------------------------------------------------------------- attention on CUDA


@requires_cuda
@pytest.mark.parametrize("pe,refiner", BUILTIN_COMBINATIONS)
def test_fast_equals_reference_under_cuda_bf16_autocast(pe, refiner, monkeypatch):
    """As tests/test_fast.py does under CPU autocast: the same softmax dtype, and bf16 tolerances."""
    assert_same_under_bf16(pe, refiner, "cuda", monkeypatch)


@requires_cuda
@pytest.mark.parametrize("backend", ["dispatcher's choice", "memory-efficient kernel"])
@pytest.mark.parametrize("pe", BIASES_WITH_PARAMETERS)
def test_learnable_bias_gradients_through_cuda_attention_kernels(pe, backend):
    """Without a refiner the fast path gives B to F.scaled_dot_product_attention as a float mask; B's parameters
    get their gradients back through the CUDA kernel (forced to the memory-efficient one, or the one PyTorch
    picks). Reference: model.py's plain softmax in float64 on the CPU; float32 on the GPU within 1% plus 1e-4 of
    the encoding's largest gradient (FIRE's output bias shifts whole score rows: its exact gradient is 0)."""
    torch.manual_seed(0)
    model = md.GPT(md.GPTConfig(vocab_size=64, **SMALL, pe=pe))
    idx = torch.randint(0, 64, (2, 96))  # beyond block_size: the bias extrapolates
    reference = copy.deepcopy(model).double()
    reference.cfg.fast = False
    reference(idx, idx)[1].backward()
    gpu = copy.deepcopy(model).cuda()
    kernel = (
        sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION)
        if backend == "memory-efficient kernel"
        else contextlib.nullcontext()
    )
    with kernel:
        gpu(idx.cuda(), idx.cuda())[1].backward()
    expected = dict(reference.pe.named_parameters())
    scale = max(p.grad.abs().max().item() for p in expected.values())
    assert scale > 0
    for name, p in gpu.pe.named_parameters():
        torch.testing.assert_close(
            p.grad.cpu().double(), expected[name].grad, atol=1e-4 * scale, rtol=1e-2, msg=lambda m: f"{pe} {name}: {m}"
        )


@requires_cuda
@pytest.mark.parametrize("causal", [True, False], ids=["decoder", "encoder"])
@pytest.mark.parametrize("pe", ["alibi", *BIASES_WITH_PARAMETERS])
def test_flex_attention_equals_the_reference_forward_and_gradients(pe, causal, monkeypatch):
    """CUDA training at T >= fast.FLEX_MIN_LENGTH sends a bias without refiner through FlexAttention (compiled):
    the logits, the loss and every gradient (the encoding's parameters included) as model.py's reference form
    computes them in float64 on the CPU, within float32 tolerances; and the path really ran."""
    torch.manual_seed(0)
    T = md.fast.FLEX_MIN_LENGTH
    model = md.GPT(md.GPTConfig(vocab_size=64, **{**SMALL, "block_size": T}, pe=pe, causal=causal))
    idx = torch.randint(0, 64, (2, T))
    reference = copy.deepcopy(model).double()
    reference.cfg.fast = False
    reference_logits, reference_loss = reference(idx, idx)
    reference_loss.backward()
    calls = []
    flex = md.fast.flex_bias_attention
    monkeypatch.setattr(md.fast, "flex_bias_attention", lambda *args, **kw: calls.append(1) or flex(*args, **kw))
    gpu = copy.deepcopy(model).cuda()
    logits, loss = gpu(idx.cuda(), idx.cuda())
    loss.backward()
    assert len(calls) == SMALL["n_layer"]
    torch.testing.assert_close(logits.cpu().double(), reference_logits, atol=1e-4, rtol=1e-3)
    expected = dict(reference.named_parameters())
    largest = max(p.grad.abs().max().item() for p in expected.values())
    for name, p in gpu.named_parameters():  # within 1% plus 0.1% of its own scale and 1e-5 of the largest
        scale = expected[name].grad.abs().max().item()
        torch.testing.assert_close(
            p.grad.cpu().double(),
            expected[name].grad,
            atol=1e-3 * scale + 1e-5 * largest,
            rtol=1e-2,
            msg=lambda m, name=name: f"{pe} {name}: {m}",
        )


@requires_cuda
def test_flex_attention_trains_like_sdpa(tokens, monkeypatch):
    """The same short run with FlexAttention and with SDPA's dense mask (bf16 autocast): the same loss curve
    within 0.05 nats."""
    cfg = md.GPTConfig(**{**SMALL, "block_size": md.fast.FLEX_MIN_LENGTH}, pe="kerple_log")
    settings = dict(steps=20, batch_size=8, lr=3e-3, log_every=5, device="cuda", seed=0, progress=False)
    _, flex = md.train(cfg, tokens, **settings)
    monkeypatch.setattr(md.fast, "FLEX_ON_CUDA", False)
    _, sdpa = md.train(cfg, tokens, **settings)
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(flex, sdpa)) < 0.05


@requires_cuda
def test_the_bias_benchmark_times_every_encoding_both_ways():
    table = bench.bias_table("tiny", md.fast.FLEX_MIN_LENGTH, 2, torch.device("cuda"), repeats=1, warmup=1)
    for pe in bench.bias_pes():
        assert f"| {pe} (FlexAttention) |" in table and f"| {pe} (SDPA, dense mask) |" in table


@requires_cuda
@pytest.mark.parametrize("refiner", ["none", "dape", "conv"])
def test_16k_token_evaluation_stays_within_its_memory_bound(refiner):
    """The evaluation of one 16,384-token window (the demo's longest) by the default-size model needs at most
    1 GiB of GPU memory beyond the weights: linear in T. One layer's full (h, T, T) scores alone would take 2 GiB
    in bf16, DAPE's hidden layer over them 16 GiB."""
    torch.manual_seed(0)
    model = md.GPT(md.GPTConfig(pe="kerple_log", refiner=refiner)).cuda().eval()
    val = md.load_corpus("austen", "val")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    ppl = md.evaluate.perplexity_by_length(model, val, [16384], n_windows=1)[16384]
    used = torch.cuda.max_memory_allocated() - before
    print(f"{refiner}: perplexity {ppl:.1f}, {used / 2**20:.0f} MiB beyond the weights")
    assert 1 < ppl < float("inf") and used < 2**30


# ----------------------------------------------------------------------------- DDP and the demo

DDP_SCRIPT = textwrap.dedent("""
    import os, sys
    import torch
    import torch.distributed as dist
    import minidape as md

    backends = []
    join = dist.init_process_group
    dist.init_process_group = lambda *args, **kwargs: backends.append(kwargs.get("backend")) or join(*args, **kwargs)
    tokens = md.load_corpus("austen")[:100_000]
    cfg = md.GPTConfig(n_layer=2, n_head=4, n_embd=64, block_size=64, pe="kerple_log", refiner="dape")
    model, history = md.train(cfg, tokens, steps=5, batch_size=4, device="auto", out=sys.argv[1], progress=False)
    torch.save({"backends": backends, "device": str(md.utils.model_device(model)), "model": model.state_dict(),
                "history": history}, os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.pt"))
""")


@pytest.mark.skipif(
    torch.cuda.device_count() < 2,
    reason=f"DDP with NCCL needs two GPUs; this machine shows {torch.cuda.device_count()}",
)
def test_ddp_on_two_gpus_joins_with_nccl(tmp_path):
    script = tmp_path / "ddp_gpu.py"
    script.write_text(DDP_SCRIPT)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            str(script),
            str(tmp_path),
        ],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=True) for rank in (0, 1)]
    assert [r["backends"] for r in ranks] == [["nccl"], ["nccl"]]
    assert [r["device"] for r in ranks] == ["cuda:0", "cuda:1"]
    assert all(torch.equal(ranks[0]["model"][key], ranks[1]["model"][key]) for key in ranks[0]["model"])
    assert ranks[0]["history"] == ranks[1]["history"] and (tmp_path / CHECKPOINT_NAME).is_file()


@requires_cuda
def test_the_demo_runs_on_cuda_in_quick_mode(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "minidape", "demo", "--device", "cuda", "--out", str(tmp_path)],
        env={**os.environ, "MINIDAPE_QUICK": "1", "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["device"].startswith("cuda") and results["quick mode"] is True
    assert all(0 < ppl for curve in results["results"].values() for ppl in curve.values() if ppl is not None)
