"""The refiner benchmark compares like with like: its reference row (`fast=False`) computes what `dape` computes."""

import subprocess
import sys
from pathlib import Path

import torch

import minidape as md
from minidape.lab import bench, user_code

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_refiners.py"  # the repository's entry


def test_reference_row_is_the_dape_row_in_its_paper_form():
    torch.manual_seed(0)
    fast = bench.build("tiny", "kerple_log", "dape", 40, torch.device("cpu"))
    torch.manual_seed(0)
    reference = bench.build("tiny", "kerple_log", "dape", 40, torch.device("cpu"), fast=False)
    assert fast.cfg.fast and not reference.cfg.fast
    idx = torch.randint(0, 256, (2, 40))
    torch.testing.assert_close(fast(idx, idx)[1], reference(idx, idx)[1])


def test_plain_rope_gpt_matches_ours_in_size():
    ours = bench.build("tiny", "rope", "none", 64, torch.device("cpu"))
    plain = bench.build("tiny", "rope", "none", 64, torch.device("cpu"), plain=True)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in plain.parameters())


def test_bench_cli_help():
    out = subprocess.run([sys.executable, "-m", "minidape", "bench", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--quick" in out.stdout


def test_ratio_table_gives_the_median_ratio_of_the_rounds_and_their_range():
    rounds = [{"none": 0.100, "dape": 0.150}, {"none": 0.200, "dape": 0.260}, {"none": 0.100, "dape": 0.170}]
    table = bench.ratio_table("t", rounds, "none", tokens=1000)
    dape_row = next(line for line in table.splitlines() if line.startswith("| dape"))
    cells = [c.strip() for c in dape_row.strip("|").split("|")]
    # median step time 0.170 s; per-round ratios 1.50, 1.30, 1.70 -> median 1.50, range 1.30-1.70
    assert cells == ["dape", "170.0", "5,882", "1.50 (1.30–1.70)"]
    single = bench.ratio_table("t", rounds[:1], "none", tokens=1000)
    assert "| dape | 150.0 | 6,667 | 1.50 |" in single.splitlines()


def test_timing_round_in_a_fresh_process_reports_every_case():
    cases = {"none": ("kerple_log", "none", False), "dape": ("kerple_log", "dape", False)}
    rounds = bench.timed_rounds(cases, T=16, B=2, size="tiny", device=torch.device("cpu"), repeats=1, rounds=2)
    assert len(rounds) == 2
    for medians in rounds:
        assert set(medians) == set(cases) and all(seconds > 0 for seconds in medians.values())


def test_bench_rejects_zero_rounds():
    out = subprocess.run([sys.executable, str(SCRIPT), "--rounds", "0"], capture_output=True, text=True)
    assert out.returncode == 2 and "--rounds" in out.stderr and "got '0'" in out.stderr


def test_a_users_bias_is_timed_like_the_built_in_ones(tmp_path):
    """What `bench --import FILE.py --pe NAME` relies on: a PE registered from a user's file builds and times,
    in this process and in the fresh processes of `--rounds` (which load the file again)."""
    path = tmp_path / "bench_bias.py"
    path.write_text(
        "import torch\nimport minidape as md\n\n\n@md.register_pe('bench_bias')\n"
        "class BenchBias(md.AdditiveBias):\n    def __init__(self, cfg):\n        super().__init__()\n"
        "        self.scale = torch.nn.Parameter(torch.ones(cfg.n_head, 1, 1))\n\n"
        "    def forward(self, q_pos, k_pos):\n"
        "        return -self.scale * (q_pos[:, None] - k_pos[None, :]).abs().float()\n"
    )
    user_code.import_file(path)
    medians = bench.timed_rounds(
        {"bench_bias": ("bench_bias", "none", False), "dape": ("bench_bias", "dape", False)},
        T=16,
        B=2,
        size="tiny",
        device=torch.device("cpu"),
        repeats=1,
        rounds=2,
    )
    assert len(medians) == 2
    for round_medians in medians:
        assert set(round_medians) == {"bench_bias", "dape"} and all(s > 0 for s in round_medians.values())


def table_rows(text: str) -> dict[str, list[str]]:
    """The rows of the markdown tables in `text`: {first cell: the other cells}."""
    cells = (
        [cell.strip() for cell in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("| ")
    )
    return {row[0]: row[1:] for row in cells}


def test_cape_table_gives_each_phase_its_ratio_to_the_base_pe_beside_the_papers(monkeypatch):
    medians = {
        "none": {"forward": 0.010, "backward": 0.030, "step": 0.040},
        "dape": {"forward": 0.025, "backward": 0.045, "step": 0.070},
        "conv": {"forward": 0.020, "backward": 0.060, "step": 0.080},
    }
    monkeypatch.setattr(bench, "time_phases", lambda cases, *args, **kwargs: {label: medians[label] for label in cases})
    table = bench.cape_table("tiny", "kerple_log", 64, 2, torch.device("cpu"), repeats=1, memory=False)
    rows = table_rows(table)
    # 2 x 64 tokens per step; dape: 2.5x forward, 1.5x backward, 1.75x the step
    assert rows["dape"] == ["25.0", "45.0", "1,829", "—", "2.50", "1.50", "1.75"]
    assert rows["none"][4:] == ["1.00", "1.00", "1.00"] and rows["conv"][4:] == ["2.00", "2.00", "2.00"]
    # the table's own numbers: CAPE-Kerple against Kerple 133.36 / 54.17 ms forward, 320.44 / 145.95 backward,
    # (133.36 + 320.44) / (54.17 + 145.95) the step
    assert rows["CAPE Table 1 (CAPE-Kerple, D=32)"][4:] == ["2.462", "2.196", "2.268"]
    assert "set for a GPU; here 1.75×" in table


def test_bench_cape_table_runs_on_the_cpu_at_the_tiny_shape():
    """`bench --cape-table` end to end on the CPU, tiny model, a short sequence: every row measured."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "minidape",
            "bench",
            "--device",
            "cpu",
            "--cape-table",
            "--size",
            "tiny",
            "--length",
            "16",
            "--batch",
            "2",
            "--repeats",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = table_rows(out.stdout)
    assert "T=16, B=2" in out.stdout and "float32 on " in out.stdout
    for label in ("none", "dape", "conv"):
        forward, backward, tokens, memory, *ratios = (float(cell.replace(",", "")) for cell in rows[label])
        assert forward > 0 and backward > 0 and tokens > 0 and memory >= 0 and all(r > 0 for r in ratios)
    assert rows["none"][4:] == ["1.00", "1.00", "1.00"]


def test_the_nanogpt_reference_is_ours_in_size_and_learns():
    """benchmarks/bench_nanogpt.py's plain model has md.GPT(pe="learned")'s parameters, and its training step
    (the one timed) lowers the loss of a repeated batch."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import bench_nanogpt
    finally:
        sys.path.remove(str(SCRIPT.parent))
    shape = bench_nanogpt.SHAPES["demo"]
    torch.manual_seed(0)
    plain = bench_nanogpt.PlainGPT(256, 32, shape["n_layer"], shape["n_embd"], shape["n_head"])
    ours = md.GPT(
        md.GPTConfig(
            vocab_size=256,
            block_size=32,
            pe="learned",
            n_layer=shape["n_layer"],
            n_embd=shape["n_embd"],
            n_head=shape["n_head"],
        )
    )
    assert sum(p.numel() for p in plain.parameters()) == sum(p.numel() for p in ours.parameters())
    trainee = bench_nanogpt.Trainee(plain)
    x = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(0))
    first = plain(x, x)[1].item()
    for _ in range(5):
        trainee.step(x, timed=True)
    assert plain(x, x)[1].item() < first - 0.1 and len(trainee.seconds) == 5
