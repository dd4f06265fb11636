"""The claim study and the bias comparison: statistics, verdict rule, the leaky refiner of C4, and both commands
end to end at the hidden tiny budget (every code path, no meaning)."""

import json
import math
from pathlib import Path

import pytest
import torch
from scipy import stats

import minidape as md
from minidape import study
from minidape.__main__ import main

TEXT = ("It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in "
        "want of a wife. However little known the feelings or views of such a man may be on his first entering "
        "a neighbourhood, this truth is so well fixed in the minds of the surrounding families. ") * 40

BIAS_FILE = (Path(__file__).parent / "files" / "my_bias.py").read_text()   # the README's example bias


@pytest.fixture
def corpus_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT)
    return path


def run_cli(argv, capsys):
    """Run the CLI; return (exit code, stdout, stderr)."""
    try:
        main([str(arg) for arg in argv])
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ----------------------------------------------------------------------------- statistics and the verdict rule


def test_cell_is_the_paired_t_test_of_the_differences():
    lower, higher = [5.0, 6.5, 5.5, 7.0], [6.0, 7.0, 6.8, 7.2]
    factor = 1.05
    differences = torch.tensor(lower, dtype=torch.float64) - factor * torch.tensor(higher, dtype=torch.float64)
    n = len(lower)
    t = differences.mean() / (differences.std() / math.sqrt(n))           # the paired t statistic by hand
    expected_p = 2 * stats.t.sf(abs(float(t)), df=n - 1)
    mean_difference, p_value = study.Cell("x", lower, higher, factor).test()
    assert mean_difference == pytest.approx(float(differences.mean()))
    assert p_value == pytest.approx(expected_p, rel=1e-6)


def test_cell_status_follows_direction_and_significance():
    consistent = [1.0, 2.0, 3.0, 4.0]
    shifted = [value + 1.0 + 0.01 * i for i, value in enumerate(consistent)]
    assert study.Cell("x", consistent, shifted).status == "support"
    assert study.Cell("x", shifted, consistent).status == "contradict"
    assert study.Cell("x", [1.0, 3.0, 2.0], [2.0, 2.0, 2.1]).status == "unclear"
    assert study.Cell("x", [1.0, 1.0], [1.0, 1.0]).status == "unclear"        # p is NaN: no evidence either way
    nan = math.nan
    assert study.Cell("x", [5.0, 6.0], [nan, nan]).status == "support"       # the claimed-worse model cannot run
    assert study.Cell("x", [nan, nan], [5.0, 6.0]).status == "contradict"


def test_verdict_rule():
    support = study.Cell("s", [1.0, 2.0, 3.0], [2.0, 3.1, 4.0])
    contradict = study.Cell("c", [2.0, 3.1, 4.0], [1.0, 2.0, 3.0])
    unclear = study.Cell("u", [1.0, 3.0, 2.0], [2.0, 2.0, 2.1])
    assert [c.status for c in (support, contradict, unclear)] == ["support", "contradict", "unclear"]
    assert study.verdict([support, support, unclear, unclear]) == "reproduced"
    assert study.verdict([support, unclear, unclear]) == "inconclusive at this budget"
    assert study.verdict([support, support, support, contradict]) == "inconclusive at this budget"
    assert study.verdict([contradict, contradict, support]) == "not reproduced"
    assert study.claim_verdict(["reproduced", "reproduced"]) == "reproduced"
    assert study.claim_verdict(["reproduced", "not reproduced"]) == "partly reproduced"
    assert study.claim_verdict(["not reproduced", "inconclusive at this budget"]) == "inconclusive at this budget"
    assert study.claim_verdict(["not reproduced"]) == "not reproduced"


def test_statements_read_the_right_lengths():
    """'X degrades' compares X at the training length with X at each longer length, paired by seed."""
    curve = {128: [10.0, 11.0], 256: [12.0, 13.0], 512: [20.0, 21.0]}
    results = {"lm": {("austen", 128, "RoPE"): {protocol: curve for protocol in md.evaluate.PROTOCOLS}}}
    statement = study._degrades("RoPE")
    cells = study.statement_cells(statement, results, ["austen"], (128,))
    assert [cell.where for cell in cells] == [f"austen T=128 {p} {f}xT" for p in md.evaluate.PROTOCOLS for f in (2, 4)]
    assert cells[0].lower == curve[128] and cells[0].higher == curve[256]
    assert cells[1].lower == curve[128] and cells[1].higher == curve[512]


def test_every_statement_names_study_models_and_a_known_scope():
    for claim in study.CLAIMS:
        models = study.CHE_MODELS if claim.che else study.MODELS
        for statement in claim.statements:
            assert statement.better in models and statement.worse in models
            assert statement.scope in study.SCOPES
        assert set(claim.models) <= set(models)


def test_budgets_grow_on_cuda_and_unknown_budgets_are_refused():
    for name in study.BUDGET_NAMES:
        cpu, cuda = study.resolve_budget(name, torch.device("cpu")), study.resolve_budget(name, torch.device("cuda"))
        assert cuda.n_embd > cpu.n_embd and cuda.steps > cpu.steps
    with pytest.raises(ValueError, match="valid budgets: small, default"):
        study.resolve_budget("huge", torch.device("cpu"))


# ----------------------------------------------------------------------------- C4: the conv refiner without tril


def leaky_config(**overrides):
    study.register_leaky_refiner()
    options = dict(n_layer=1, n_embd=16, n_head=2, block_size=32, pe="kerple_log", refiner=study.LEAKY_REFINER)
    return md.GPTConfig(**{**options, **overrides})


def test_conv_without_tril_reads_the_future_and_conv_does_not():
    assert not md.check_causal(leaky_config())
    assert md.check_causal(leaky_config(refiner="conv"))


def test_conv_without_tril_is_the_plain_formula_on_unmasked_scores():
    """A = S + B + conv2(LeakyReLU(conv1([S, B]))) with nn.Conv2d on the full matrix, future cells included."""
    cfg = leaky_config(refiner_kernel=3)
    torch.manual_seed(0)
    refiner = study.ConvRefinerWithoutTril(cfg)
    T = 10
    scores, bias = torch.randn(2, cfg.n_head, T, T), torch.randn(cfg.n_head, T, T)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    features = torch.cat([scores, bias.expand_as(scores)], dim=1)
    expected = scores + bias + refiner.conv2(torch.nn.functional.leaky_relu(refiner.conv1(features), 0.01))
    torch.testing.assert_close(refiner(scores, bias, mask), expected, rtol=1e-5, atol=1e-5)


def test_conv_without_tril_gives_the_same_logits_in_query_blocks():
    """Its key margin hands every block the future keys its two convolutions read."""
    cfg = leaky_config(refiner_kernel=5, block_size=48)
    torch.manual_seed(0)
    whole = md.GPT(cfg).eval()
    blocked = md.GPT(leaky_config(refiner_kernel=5, block_size=48, attn_chunk=16)).eval()
    blocked.load_state_dict(whole.state_dict())
    tokens = torch.randint(256, (1, 48))
    with torch.no_grad():
        torch.testing.assert_close(blocked(tokens)[0], whole(tokens)[0], rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- reproduce end to end


def test_reproduce_tiny_end_to_end_resumes_and_refuses_other_settings(tmp_path, corpus_file, capsys):
    out = tmp_path / "study"
    argv = ["reproduce", "--budget", "tiny", "--seeds", "2", "--corpus", corpus_file, "--out", out]
    code, stdout, _ = run_cli(argv, capsys)
    assert code == 0
    report = (out / "REPRODUCTION.md").read_text()
    for claim in study.CLAIMS:
        assert f"## {claim.key}:" in report
        assert (out / "figures" / f"{claim.key}.png").stat().st_size > 0
    results = json.loads((out / "results.json").read_text())
    assert set(results["verdicts"]) == {claim.key for claim in study.CLAIMS}
    allowed = {"reproduced", "not reproduced", "inconclusive at this budget"}
    assert all(s["verdict"] in allowed for claim in results["verdicts"].values() for s in claim)
    runs = sorted(out.glob("runs/**/seed*.json"))
    assert len(runs) == stdout.count("] ") and stdout.count("done before") == 0
    assert f"it trained {len(runs)} of the {len(runs)} runs" in report

    # A killed study restarted: only the missing run is trained again.
    runs[0].unlink()
    code, stdout, _ = run_cli(argv, capsys)
    assert code == 0 and runs[0].is_file()
    assert stdout.count("done before") == len(runs) - 1
    assert f"it trained 1 of the {len(runs)} runs" in (out / "REPRODUCTION.md").read_text()

    # Other settings (here another corpus) into the same folder: refused in one line, nothing trained.
    other = corpus_file.with_name("other.txt")
    other.write_text(TEXT)
    code, stdout, stderr = run_cli(["reproduce", "--budget", "tiny", "--seeds", "2", "--corpus", other, "--out", out],
                                   capsys)
    assert code == 2 and "other settings (corpora differ" in stderr and len(stderr.strip().splitlines()) == 1
    assert stdout == "" and len(sorted(out.glob("runs/**/seed*.json"))) == len(runs)


@pytest.mark.parametrize("argv, message", [
    (["--budget", "tiny", "--corpus", "no_such_corpus"], "unknown corpus"),
    (["--budget", "tiny", "--corpus", "missing.txt"], "does not exist"),
    (["--budget", "tiny", "--seeds", "1"], "seeds must be an integer >= 2"),
    (["--budget", "small", "--corpus", "CORPUS"], "validation tokens"),       # the budget does not fit the corpus
])
def test_reproduce_errors_are_one_line(argv, message, tmp_path, corpus_file, capsys):
    argv = [corpus_file if arg == "CORPUS" else arg for arg in argv]
    code, _, stderr = run_cli(["reproduce", *argv, "--out", tmp_path / "out"], capsys)
    assert code == 2 and message in stderr and len(stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "runs").exists()


def che_results(within: dict[str, float]) -> dict:
    """Results of the C6 table: every model at `within[task]` inside the training lengths, 0.6 beyond."""
    keys = [(task, label) for task in study.CHE_TASKS for label in study.CHE_MODELS]
    return {"che": {key: [0.6, 0.6] for key in keys}, "che_within": {key: [within[key[0]]] * 2 for key in keys},
            "che_chance": {task: 0.5 for task in study.CHE_TASKS}}


def test_che_table_names_the_tasks_no_model_learned_within_training():
    first, *rest = study.CHE_TASKS
    table = study._che_table(che_results({first: 0.52, **{task: 0.9 for task in rest}}))
    assert f"above chance on {first}:" in table and "did not learn that task" in table
    assert f"| {first} | 50 | 52.00 ± 0.00 |" in table
    table = study._che_table(che_results({task: 0.9 for task in study.CHE_TASKS}))
    assert "Every task is learned" in table and "did not learn" not in table


# ----------------------------------------------------------------------------- compare


def test_compare_a_bias_from_a_file_end_to_end(tmp_path, corpus_file, capsys):
    bias_file = tmp_path / "my_bias.py"
    bias_file.write_text(BIAS_FILE)
    out = tmp_path / "compare"
    code, stdout, _ = run_cli(["compare", "--pe", f"{bias_file}:MyBias", "--against", "alibi", "kerple_log",
                               "--seeds", "2", "--steps", "2", "--budget", "tiny", "--corpus", corpus_file,
                               "--out", out], capsys)
    assert code == 0
    payload = json.loads((out / "compare.json").read_text())
    assert payload["baselines"] == ["alibi", "kerple_log"]
    subject = payload["subject"]
    assert subject.endswith("MyBias")
    for baseline in payload["baselines"]:
        p_values = payload["p_values"][baseline]["last_k"]
        assert set(p_values) == {"16", "32"}
        assert "p vs " + baseline in stdout
    for protocol in md.evaluate.PROTOCOLS:
        assert all(len(values) == 2 for values in payload["perplexity"][subject][protocol].values())
    assert (out / "compare.png").stat().st_size > 0 and (out / "compare.md").is_file()

    # Another bias file into the same folder would mix results: refused.
    bias_file.write_text(BIAS_FILE + "\n# changed\n")
    code, _, stderr = run_cli(["compare", "--pe", f"{bias_file}:MyBias", "--against", "alibi", "kerple_log",
                               "--seeds", "2", "--steps", "2", "--budget", "tiny", "--corpus", corpus_file,
                               "--out", out], capsys)
    assert code == 2 and "pe_file_sha256" in stderr


def test_compare_function_returns_the_statistics(corpus_file):
    result = study.compare("rope", against=("alibi",), seeds=2, steps=2, corpus=str(corpus_file), budget="tiny",
                           progress=False)
    assert result["subject"] == "rope"
    curves = result["perplexity"]
    assert set(curves) == {"rope", "alibi"}
    rope, alibi = curves["rope"]["nonoverlap"][32], curves["alibi"]["nonoverlap"][32]
    expected = stats.ttest_rel(rope, alibi).pvalue
    assert result["p_values"]["alibi"]["nonoverlap"][32] == pytest.approx(expected, nan_ok=True)


@pytest.mark.parametrize("pe, message", [
    ("missing_file.py:Bias", "no file"),
    ("BIAS_FILE:NotABias", "not a subclass of md.AdditiveBias"),
    ("BIAS_FILE:Nothing", "defines no 'Nothing'"),
    ("no_such_pe", "unknown pe"),
])
def test_compare_errors_are_one_line(pe, message, tmp_path, corpus_file, capsys):
    bias_file = tmp_path / "bias.py"
    bias_file.write_text(BIAS_FILE)
    pe = pe.replace("BIAS_FILE", str(bias_file))
    code, _, stderr = run_cli(["compare", "--pe", pe, "--budget", "tiny", "--corpus", corpus_file,
                               "--out", tmp_path / "out"], capsys)
    assert code == 2 and message in stderr and len(stderr.strip().splitlines()) == 1
