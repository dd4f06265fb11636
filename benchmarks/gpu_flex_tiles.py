"""Which FlexAttention tiles compile on this card for minidape's bias attention, and how fast (issue 46).

    python benchmarks/gpu_flex_tiles.py                 # every choice below, each in its own process
    python benchmarks/gpu_flex_tiles.py --cape-table    # then CAPE's Table 1 on the 125M model with the fastest one

On a CUDA GPU, for each choice of tiles (``fast.FLEX_KERNEL_OPTIONS``): the forward and backward of
``fast.flex_bias_attention`` at the 125M model's attention shape (B = 8, 12 heads, T = 512, head size 64, bf16,
causal, a float32 bias that takes a gradient), its largest error against the papers' form written out here
(softmax(QK^T / sqrt(d) + B, causal) V in float32 from the same inputs), and its time against SDPA reading the dense
bias as a mask. torch 2.11's own choice on an H100 does not compile (240 KiB of shared memory asked, 227 KiB there).
"""

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from minidape import fast  # noqa: E402

CHOICES = {
    "torch's own": {},
    "64 x 64": {"BLOCK_M": 64, "BLOCK_N": 64},
    "64 x 64, backward 64 x 64": {
        "BLOCK_M": 64,
        "BLOCK_N": 64,
        **{f"bwd_{name}": 64 for name in ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2")},
    },
    "128 x 64, 2 stages": {"BLOCK_M": 128, "BLOCK_N": 64, "num_stages": 2},
}
B, H, T, D = 8, 12, 512, 64


def papers_form(q, k, v, bias):
    """softmax(q k^T / sqrt(d) + B) v with key <= query, in float32."""
    scores = q.float() @ k.float().transpose(-2, -1) / math.sqrt(D) + bias
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    return scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v.float()


def measure(options: dict) -> dict:
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    bias = (-0.1 * (torch.arange(T)[:, None] - torch.arange(T)).abs().float()).expand(H, T, T).to("cuda")
    bias = bias.clone().requires_grad_(True)
    clock = time.perf_counter()
    out = fast.flex_bias_attention(q, k, v, bias, causal=True, kernel_options=options)
    out.float().square().sum().backward()
    torch.cuda.synchronize()
    compile_seconds = time.perf_counter() - clock
    flex_bias_grad = bias.grad.clone()
    bias.grad = None
    expected = papers_form(q, k, v, bias)
    expected.square().sum().backward()
    error = (out.float() - expected).abs().max().item()
    grad_error = (flex_bias_grad - bias.grad).abs().max().item() / bias.grad.abs().max().item()

    causal = torch.ones(T, T, dtype=torch.bool, device="cuda").tril()
    dense = bias.detach().masked_fill(~causal, float("-inf")).to(torch.bfloat16)

    def flex_step():
        fast.flex_bias_attention(q, k, v, bias, causal=True, kernel_options=options).float().sum().backward()

    def sdpa_step():
        F.scaled_dot_product_attention(q, k, v, attn_mask=dense).float().sum().backward()

    times = {"flex": [], "sdpa": []}
    for i in range(13):
        for name, step in (("flex", flex_step), ("sdpa", sdpa_step)):
            torch.cuda.synchronize()
            start = time.perf_counter()
            step()
            torch.cuda.synchronize()
            if i >= 3:
                times[name].append(time.perf_counter() - start)
    flex_ms, sdpa_ms = (statistics.median(times[name]) * 1e3 for name in ("flex", "sdpa"))
    return dict(compile_s=compile_seconds, error=error, grad_error=grad_error, flex_ms=flex_ms, sdpa_ms=sdpa_ms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--choice", help=argparse.SUPPRESS)  # the child's one measurement
    parser.add_argument("--cape-table", action="store_true", help="then CAPE's Table 1 at 125M with the fastest")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds each choice may take (default 60)")
    parser.add_argument("--skip", nargs="*", default=[], help="choices left out")
    args = parser.parse_args()
    if args.choice:
        print(json.dumps(measure(CHOICES[args.choice])))
        return
    print(
        f"**FlexAttention tiles on {torch.cuda.get_device_name(0)}, torch {torch.__version__}: B={B}, {H} heads, "
        f"T={T}, head size {D}, bf16, causal, float32 bias with its gradient; forward + backward**\n"
    )
    print(
        "| tiles | kernel_options | compiles | first call s | max error (out) | error (bias grad, rel.) | "
        "ms | SDPA dense mask ms | × SDPA |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    working = {}
    for name, options in CHOICES.items():
        if name in args.skip:
            continue
        try:
            done = subprocess.run(
                [sys.executable, __file__, "--choice", name], capture_output=True, text=True, timeout=args.timeout
            )
            lines = done.stdout.strip().splitlines()
            result = json.loads(lines[-1]) if done.returncode == 0 and lines else None
            why = "" if result else (done.stderr.strip().splitlines() or ["?"])[-1][:160]
        except subprocess.TimeoutExpired:
            result, why = None, f"not within {args.timeout:.0f} s"
        if result is None:
            print(f"| {name} | `{options}` | no: {why} | | | | | | |", flush=True)
            continue
        working[name] = result
        print(
            f"| {name} | `{options}` | yes | {result['compile_s']:.1f} | {result['error']:.3g} | "
            f"{result['grad_error']:.3g} | {result['flex_ms']:.2f} | {result['sdpa_ms']:.2f} | "
            f"{result['flex_ms'] / result['sdpa_ms']:.2f} |",
            flush=True,
        )
    if args.cape_table and working:
        fastest = min(working, key=lambda name: working[name]["flex_ms"])
        fast.FLEX_KERNEL_OPTIONS = CHOICES[fastest]
        from minidape.lab.bench import cape_table

        print(
            f"\nCAPE's Table 1 with the tiles '{fastest}' (peak memory not measured: its fresh processes would "
            "not have these tiles)\n",
            flush=True,
        )
        print(cape_table("125m", "kerple_log", 512, 8, torch.device("cuda"), 10, memory=False), flush=True)


if __name__ == "__main__":
    main()
