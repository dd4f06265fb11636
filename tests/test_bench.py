"""The refiner benchmark compares like with like: its reference row (`fast=False`) computes what `dape` computes."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import torch

import minidape as md

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_refiners.py"


def load_bench():
    if "bench_refiners" in sys.modules:        # loaded by an earlier test in this session
        return sys.modules["bench_refiners"]
    spec = importlib.util.spec_from_file_location("bench_refiners", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_refiners"] = module
    spec.loader.exec_module(module)
    return module


def test_reference_row_is_the_dape_row_in_its_paper_form():
    bench = load_bench()
    torch.manual_seed(0)
    fast = bench.build("tiny", "kerple_log", "dape", 40, torch.device("cpu"))
    torch.manual_seed(0)
    reference = bench.build("tiny", "kerple_log", "dape", 40, torch.device("cpu"), fast=False)
    assert fast.cfg.fast and not reference.cfg.fast
    idx = torch.randint(0, 256, (2, 40))
    torch.testing.assert_close(fast(idx, idx)[1], reference(idx, idx)[1])


def test_plain_rope_gpt_matches_ours_in_size():
    bench = load_bench()
    ours = bench.build("tiny", "rope", "none", 64, torch.device("cpu"))
    plain = bench.build("tiny", "rope", "none", 64, torch.device("cpu"), plain=True)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in plain.parameters())


def test_bench_cli_help():
    out = subprocess.run([sys.executable, "-m", "minidape", "bench", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--quick" in out.stdout


def test_ratio_table_gives_the_median_ratio_of_the_rounds_and_their_range():
    bench = load_bench()
    rounds = [{"none": 0.100, "dape": 0.150}, {"none": 0.200, "dape": 0.260}, {"none": 0.100, "dape": 0.170}]
    table = bench.ratio_table("t", rounds, "none", tokens=1000)
    dape_row = next(line for line in table.splitlines() if line.startswith("| dape"))
    cells = [c.strip() for c in dape_row.strip("|").split("|")]
    # median step time 0.170 s; per-round ratios 1.50, 1.30, 1.70 -> median 1.50, range 1.30-1.70
    assert cells == ["dape", "170.0", "5,882", "1.50 (1.30–1.70)"]
    single = bench.ratio_table("t", rounds[:1], "none", tokens=1000)
    assert "| dape | 150.0 | 6,667 | 1.50 |" in single.splitlines()


def test_timing_round_in_a_fresh_process_reports_every_case():
    bench = load_bench()
    cases = {"none": ("kerple_log", "none", False), "dape": ("kerple_log", "dape", False)}
    rounds = bench.timed_rounds(cases, T=16, B=2, size="tiny", device=torch.device("cpu"), repeats=1, rounds=2)
    assert len(rounds) == 2
    for medians in rounds:
        assert set(medians) == set(cases) and all(seconds > 0 for seconds in medians.values())


def test_bench_rejects_zero_rounds():
    out = subprocess.run([sys.executable, str(SCRIPT), "--rounds", "0"], capture_output=True, text=True)
    assert out.returncode == 2 and "--rounds" in out.stderr and "got 0" in out.stderr


def test_a_users_bias_is_timed_like_the_built_in_ones(tmp_path):
    """What `bench --import FILE.py --pe NAME` relies on: a PE registered from a user's file builds and times,
    in this process and in the fresh processes of `--rounds` (which load the file again)."""
    bench = load_bench()
    path = tmp_path / "bench_bias.py"
    path.write_text("import torch\nimport minidape as md\n\n\n@md.register_pe('bench_bias')\n"
                    "class BenchBias(md.AdditiveBias):\n    def __init__(self, cfg):\n        super().__init__()\n"
                    "        self.scale = torch.nn.Parameter(torch.ones(cfg.n_head, 1, 1))\n\n"
                    "    def forward(self, q_pos, k_pos):\n"
                    "        return -self.scale * (q_pos[:, None] - k_pos[None, :]).abs().float()\n")
    md.utils.import_file(path)
    medians = bench.timed_rounds({"bench_bias": ("bench_bias", "none", False), "dape": ("bench_bias", "dape", False)},
                                 T=16, B=2, size="tiny", device=torch.device("cpu"), repeats=1, rounds=2)
    assert len(medians) == 2
    for round_medians in medians:
        assert set(round_medians) == {"bench_bias", "dape"} and all(s > 0 for s in round_medians.values())
