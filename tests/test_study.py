"""The claim study and the bias comparison: statistics, verdict rule, the leaky refiner of C4, and both commands
end to end at the hidden tiny budget (every code path, no meaning)."""

import dataclasses
import hashlib
import importlib.metadata
import itertools
import json
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import matplotlib.colors
import numpy as np
import pytest
import torch
from scipy import stats

import minidape as md
from minidape import study
from minidape.__main__ import main
from minidape.lab import figure_rules, user_code
from minidape.lab.checkpoints import load_checkpoint

TEXT = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in "
    "want of a wife. However little known the feelings or views of such a man may be on his first entering "
    "a neighbourhood, this truth is so well fixed in the minds of the surrounding families. "
) * 40

BIAS_FILE = (Path(__file__).parent / "files" / "my_bias.py").read_text()  # the README's example bias


@pytest.fixture
def corpus_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT)
    return path


def one_error(stderr: str) -> str:
    """The CLI's error line, checked to be the only one (a notice of a re-imported file may precede it when
    a test runs the CLI twice in one process)."""
    errors = [line for line in stderr.splitlines() if line.startswith("python -m minidape: error:")]
    assert len(errors) == 1 and stderr.strip().splitlines()[-1] == errors[0], stderr
    return errors[0]


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


def test_endpoint_is_scipys_one_sample_t_test_with_its_interval():
    rng = np.random.default_rng(0)
    values = rng.normal(-0.05, 0.02, size=15)  # a known effect: 15 units, mean -0.05
    endpoint = study.Endpoint(list(values), "below")
    expected = stats.ttest_1samp(values, 0.0)
    n = len(values)
    half_width = stats.t.ppf(0.975, n - 1) * values.std(ddof=1) / math.sqrt(n)
    assert endpoint.estimate == pytest.approx(values.mean())
    assert (endpoint.low, endpoint.high) == pytest.approx((values.mean() - half_width, values.mean() + half_width))
    assert endpoint.p == pytest.approx(expected.pvalue) and endpoint.p < 1e-6 and endpoint.supports
    assert endpoint.low < -0.05 < endpoint.high  # the interval covers the true effect
    # the sign-flip test counts the flips whose mean is at least as extreme: 1 of 2^15 here (all values negative)
    assert (values < 0).all() and endpoint.p_sign_flip == pytest.approx(2 / 2**n)
    assert not study.Endpoint(list(values), "above").supports  # the same data against the other direction


def test_sign_flip_test_is_exact():
    values = [0.3, -0.1, 0.5, 0.2, 0.4]
    flips = np.array(list(itertools.product([1, -1], repeat=len(values)))) * values
    expected = np.mean(np.abs(flips.mean(axis=1)) >= abs(np.mean(values)) - 1e-12)
    assert study.Endpoint(values, "above").p_sign_flip == pytest.approx(expected)


def test_a_null_effect_is_not_declared():
    """Many studies of pure noise: the verdict rule calls few of them (at most about 5 %) reproduced or not."""
    rng = np.random.default_rng(1)
    decided = 0
    for _ in range(400):
        endpoint = study.Endpoint(list(rng.normal(0, 0.03, size=10)), "below")
        decided += study.verdict(endpoint, endpoint.p) != "inconclusive at this budget"
    assert decided <= 0.08 * 400


def test_equivalence_test_is_tost_and_a_departure_beyond_the_margin_is_named():
    margin = math.log(1.1)
    rng = np.random.default_rng(2)
    flat = rng.normal(0.01, 0.01, size=15)
    endpoint = study.Endpoint(list(flat), "within", margin)
    tost = max(
        stats.ttest_1samp(flat, -margin, alternative="greater").pvalue,
        stats.ttest_1samp(flat, margin, alternative="less").pvalue,
    )
    assert endpoint.supports and endpoint.p == pytest.approx(tost) and endpoint.p < 0.05
    assert study.verdict(endpoint, endpoint.p) == "reproduced"
    drifting = rng.normal(0.3, 0.02, size=15)  # clearly more than 10 % worse
    endpoint = study.Endpoint(list(drifting), "within", margin)
    assert not endpoint.supports
    assert endpoint.p == pytest.approx(stats.ttest_1samp(drifting, margin, alternative="greater").pvalue)
    assert study.verdict(endpoint, endpoint.p) == "not reproduced"
    noisy = rng.normal(0.0, 0.3, size=5)  # inside on average, but too uncertain to say
    endpoint = study.Endpoint(list(noisy), "within", margin)
    assert study.verdict(endpoint, endpoint.p) == "inconclusive at this budget"


def test_holm_adjustment():
    p_values = [0.01, 0.04, 0.03, 0.005, math.nan]
    # sorted: 0.005 x 4, 0.01 x 3, 0.03 x 2, 0.04 x 1, each at least the previous one; NaN is not a test
    assert study.holm(p_values)[:4] == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert math.isnan(study.holm(p_values)[4])
    assert study.holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert study.holm([0.001, 0.04]) == pytest.approx([0.002, 0.04])


def test_verdict_rule():
    support = study.Endpoint([-0.1, -0.12, -0.09, -0.11], "below")
    against = study.Endpoint([0.1, 0.12, 0.09, 0.11], "below")
    assert study.verdict(support, 0.01) == "reproduced"
    assert study.verdict(against, 0.01) == "not reproduced"
    assert study.verdict(support, 0.06) == "inconclusive at this budget"  # significant only before Holm
    assert study.verdict(study.Endpoint([1.0, 1.0], "below"), math.nan) == "inconclusive at this budget"
    assert study.claim_verdict(["reproduced", "reproduced"]) == "reproduced"
    assert study.claim_verdict(["reproduced", "not reproduced"]) == "partly reproduced"
    assert study.claim_verdict(["not reproduced", "inconclusive at this budget"]) == "inconclusive at this budget"
    assert study.claim_verdict(["not reproduced"]) == "not reproduced"


def curves(values_by_length):
    return {protocol: values_by_length for protocol in md.evaluate.PROTOCOLS}


def test_statement_endpoints_are_mean_log_ratios_per_corpus_and_seed():
    a = {128: [10.0, 11.0], 256: [12.0, 13.0], 512: [20.0, 21.0]}
    b = {128: [11.0, 11.0], 256: [13.0, 14.0], 512: [20.0, 25.0]}
    results = {
        "lm": {
            (corpus, 128, label): curves(values)
            for corpus in ("austen", "python")
            for label, values in (("DAPE-Kerple", a), ("Kerple-log", b))
        }
    }
    statement = study.claims._lower("DAPE-Kerple", "Kerple-log")
    units = study.statement_units(statement, results, ["austen", "python"], (128,))
    assert list(units) == [f"{corpus} T=128 seed {seed}" for corpus in ("austen", "python") for seed in (0, 1)]
    seed1 = (math.log(11 / 11) + math.log(13 / 14) + math.log(21 / 25)) / 3
    assert units["python T=128 seed 1"] == pytest.approx(seed1)
    beyond = study.statement_units(dataclasses.replace(statement, lengths="beyond"), results, ["austen"], (128,))
    assert beyond["austen T=128 seed 0"] == pytest.approx((math.log(12 / 13) + math.log(20 / 20)) / 2)
    half = study.statement_units(dataclasses.replace(statement, factor=0.5), results, ["austen"], (128,))
    assert half["austen T=128 seed 0"] == pytest.approx(units["austen T=128 seed 0"] - math.log(0.5))
    # "degrades": the model at 16x (here the longest length) against itself at the training length
    degrades = study.statement_units(study.claims._degrades("DAPE-Kerple"), results, ["austen"], (128,))
    assert degrades == pytest.approx(
        {"austen T=128 seed 0": math.log(20 / 10), "austen T=128 seed 1": math.log(21 / 11)}
    )
    cells = study.statement_cells(study.claims._degrades("DAPE-Kerple"), results, ["austen"], (128,))
    assert [cell.where for cell in cells] == [
        f"austen T=128 {protocol} {factor}xT" for protocol in md.evaluate.PROTOCOLS for factor in (2, 4)
    ]
    assert cells[1].a == a[512] and cells[1].b == a[128]
    p_value = stats.ttest_rel(np.log(a[512]), np.log(a[128])).pvalue
    assert cells[1].text() == f"{100 * (math.sqrt(20 / 10 * 21 / 11) - 1):+.1f} % (p={p_value:.3f})"


def test_matched_dape_has_the_parameters_of_the_conv_refiner():
    for n_head in (2, 4, 8):
        cfg = dict(n_layer=1, n_embd=8 * n_head, n_head=n_head, block_size=16, pe="kerple_log")
        plain = md.GPT(md.GPTConfig(**cfg)).num_params()
        conv = md.GPT(md.GPTConfig(refiner="conv", refiner_kernel=3, **cfg)).num_params() - plain
        width = study.matched_dape_width(n_head)
        dape = md.GPT(md.GPTConfig(refiner="dape", refiner_width=width, **cfg)).num_params() - plain
        step = 3 * n_head + 1  # one more hidden unit
        assert abs(dape - conv) <= step / 2


def test_every_statement_names_study_models_and_a_known_scope():
    for claim in study.CLAIMS:
        models = study.CHE_MODELS if claim.che else study.MODELS
        for statement in claim.statements:
            assert statement.model in models and (statement.other is None or statement.other in models)
            assert statement.scope in study.SCOPES and statement.kind in study.KINDS
            assert (statement.task is not None) == claim.che
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


def test_reproduce_tiny_end_to_end_resumes_and_refuses_other_settings(
    tmp_path, corpus_file, capsys, figures_keep_the_rules, monkeypatch
):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # one count for every run: a run made again is bit-identical
    out = tmp_path / "study"
    argv = ["reproduce", "--budget", "tiny", "--seeds", "2", "--corpus", corpus_file, "--out", out]
    code, stdout, _ = run_cli(argv, capsys)
    assert code == 0
    report = (out / "REPRODUCTION.md").read_text()
    assert len(figures_keep_the_rules) >= len(study.CLAIMS)  # a figure per claim, each checked
    for claim in study.CLAIMS:
        assert f"## {claim.key}:" in report
        assert (out / "figures" / f"{claim.key}.png").stat().st_size > 0
    results = json.loads((out / "results.json").read_text())
    assert set(results["verdicts"]) == {claim.key for claim in study.CLAIMS}
    allowed = {"reproduced", "not reproduced", "inconclusive at this budget", study.NOT_TESTED}
    assert all(s["verdict"] in allowed for claim in results["verdicts"].values() for s in claim)
    runs = sorted(out.glob("runs/**/seed*.json"))
    progress = [line for line in stdout.splitlines() if re.match(r"\[\d+/\d+\] ", line)]  # one line per run
    assert len(runs) == len(progress) and stdout.count("done before") == 0
    assert f"it trained {len(runs)} of the {len(runs)} runs" in report

    # The same study as a list of runs, for a cluster's scheduler (`--list`: argparse takes the abbreviation, and
    # the lines drop it). A listed line (run here in this process: test_the_readme_slurm_array... runs compare's,
    # made by the same code, in processes of their own) writes the file the single process wrote; with the other
    # runs' files beside it, --report writes the same report.
    cluster = tmp_path / "cluster"
    code, listed, _ = run_cli([*argv[:-1], cluster, "--list"], capsys)
    lines = listed.splitlines()
    assert code == 0 and len(lines) == len(runs) and not any(" --list " in line for line in lines)
    cd, folder, then, python, dash_m, package, *line_argv = shlex.split(lines[0], comments=True)
    assert (cd, folder, then, python, dash_m, package) == ("cd", os.getcwd(), "&&", sys.executable, "-m", "minidape")
    assert line_argv == [str(arg) for arg in argv[:-1]] + [str(cluster), "--run", "0"]
    assert run_cli(line_argv, capsys)[0] == 0
    [made] = sorted(cluster.glob("runs/**/seed*.json"))

    def numbers(path: Path) -> dict:
        return {key: value for key, value in json.loads(path.read_text()).items() if not key.endswith("_seconds")}

    assert numbers(made) == numbers(out / made.relative_to(cluster))
    for run in runs:
        if not (cluster / run.relative_to(out)).exists():
            (cluster / run.relative_to(out)).parent.mkdir(parents=True, exist_ok=True)
            (cluster / run.relative_to(out)).write_bytes(run.read_bytes())
    code, _, _ = run_cli([*argv[:-1], cluster, "--report"], capsys)
    assert code == 0
    assert json.loads((cluster / "results.json").read_text()) == json.loads((out / "results.json").read_text())
    first_paragraph = re.compile(r"\A.*?\n\n.*?\n\n", re.S)  # the title, then the command, times and machine
    assert first_paragraph.sub("", (cluster / "REPRODUCTION.md").read_text()) == first_paragraph.sub("", report)

    # A killed study restarted: only the missing run is trained again.
    runs[0].unlink()
    code, stdout, _ = run_cli(argv, capsys)
    assert code == 0 and runs[0].is_file()
    assert stdout.count("done before") == len(runs) - 1
    assert f"it trained 1 of the {len(runs)} runs" in (out / "REPRODUCTION.md").read_text()

    # Other settings (here another corpus) into the same folder: refused in one line, nothing trained.
    other = corpus_file.with_name("other.txt")
    other.write_text(TEXT)
    code, stdout, stderr = run_cli(
        ["reproduce", "--budget", "tiny", "--seeds", "2", "--corpus", other, "--out", out], capsys
    )
    assert code == 2 and "other settings (corpora differ" in stderr and len(stderr.strip().splitlines()) == 1
    assert stdout == "" and len(sorted(out.glob("runs/**/seed*.json"))) == len(runs)

    # The same corpus file edited: every run file records the old text's sha256, so none is reused.
    corpus_file.write_text(TEXT.replace("wife", "WIFE"))
    code, stdout, stderr = run_cli(argv, capsys)
    assert code == 2 and "corpus_sha256" in stderr and "--rerun" in one_error(stderr)
    assert stdout.count("done before") == 0 and "[1/" not in stdout


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--budget", "tiny", "--corpus", "no_such_corpus"], "unknown corpus"),
        (["--budget", "tiny", "--corpus", "missing.txt"], "does not exist"),
        (["--budget", "tiny", "--seeds", "1"], "seeds must be an integer >= 2"),
        (["--budget", "small", "--corpus", "CORPUS"], "validation tokens"),  # the budget does not fit the corpus
    ],
)
def test_reproduce_errors_are_one_line(argv, message, tmp_path, corpus_file, capsys):
    argv = [corpus_file if arg == "CORPUS" else arg for arg in argv]
    code, _, stderr = run_cli(["reproduce", *argv, "--out", tmp_path / "out"], capsys)
    assert code == 2 and message in stderr and len(stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "runs").exists()


def che_results(within: dict[str, float]) -> dict:
    """Results of the C6 table: every model at `within[task]` inside the training lengths, 0.6 beyond."""
    keys = [(task, label) for task in study.CHE_TASKS for label in study.CHE_MODELS]
    return {
        "che": {key: [0.6, 0.6] for key in keys},
        "che_within": {key: [within[key[0]]] * 2 for key in keys},
        "che_chance": {task: 0.5 for task in study.CHE_TASKS},
    }


def test_a_task_no_model_learned_is_not_tested_and_leaves_holms_family():
    first, *rest = study.CHE_TASKS
    results = che_results({first: 0.52, **{task: 0.9 for task in rest}})
    accuracy = {"Kerple-log": [0.60, 0.61, 0.62], "DAPE-Kerple": [0.70, 0.72, 0.71]}  # DAPE 10 points higher
    results["che"] = {(task, label): values for task in study.CHE_TASKS for label, values in accuracy.items()}
    results["che_within"] = {key: [value[0]] * 3 for key, value in results["che_within"].items()}
    (claim,) = [claim for claim in study.CLAIMS if claim.che]
    judged = study.judge(results, [], (128,), claims=(claim,))
    verdicts = {item["statement"].task: item["verdict"] for item in judged}
    assert verdicts[first] == study.NOT_TESTED and math.isnan(judged[0]["p_holm"])
    tested = [item for item in judged if item["statement"].task != first]
    assert [item["p_holm"] for item in tested] == pytest.approx(study.holm([item["endpoint"].p for item in tested]))
    assert study.claim_verdict([study.NOT_TESTED]) == "inconclusive at this budget"
    assert study.claim_verdict([study.NOT_TESTED, "reproduced"]) == "reproduced"


def test_che_table_names_the_tasks_no_model_learned_within_training():
    first, *rest = study.CHE_TASKS
    table = study.report.che_table(che_results({first: 0.52, **{task: 0.9 for task in rest}}))
    assert f"above chance on {first}:" in table and "did not learn that task" in table
    assert f"| {first} | 50 | 52.00 ± 0.00 |" in table
    table = study.report.che_table(che_results({task: 0.9 for task in study.CHE_TASKS}))
    assert "Every task is learned" in table and "did not learn" not in table


# ----------------------------------------------------------------------------- compare


TINY = ["--budget", "tiny", "--steps", "2"]


def compare_cli(capsys, out, corpus, *args, pe="rope", against=("alibi",), seeds=2):
    return run_cli(
        [
            "compare",
            "--pe",
            pe,
            "--against",
            *against,
            "--seeds",
            seeds,
            *TINY,
            "--corpus",
            corpus,
            "--out",
            out,
            *args,
        ],
        capsys,
    )


def test_compare_a_bias_from_a_file_end_to_end(tmp_path, corpus_file, capsys):
    bias_file = tmp_path / "my_bias.py"
    bias_file.write_text(BIAS_FILE)
    out = tmp_path / "compare"
    code, stdout, stderr = compare_cli(
        capsys, out, corpus_file, pe=f"{bias_file}:MyBias", against=("alibi", "kerple_log")
    )
    assert code == 0
    payload = json.loads((out / "compare.json").read_text())
    assert payload["baselines"] == ["alibi", "kerple_log"]
    subject = payload["subject"]
    assert subject == "my_bias:MyBias"
    kinds = [(item.get("baseline") or item["model"], item["endpoint"]) for item in payload["endpoints"]]
    assert kinds == [
        (baseline, where) for baseline in ("alibi", "kerple_log") for where in ("in", "beyond", "longest", "all")
    ] + [(label, "degradation") for label in (subject, "alibi", "kerple_log")]
    for item in payload["endpoints"]:
        assert item["ci95"][0] <= item["ratio_minus_1"] <= item["ci95"][1]
        assert f"| {item['what']} | " in stdout
    # Holm's family is everything the run reports (11 tests here), so with any baseline p (Holm) is not the plain p
    assert [item["p_holm"] for item in payload["endpoints"]] == pytest.approx(
        study.holm([item["p_t"] for item in payload["endpoints"]]), nan_ok=True
    )
    assert "family of all 11 tests" in stdout
    for baseline in payload["baselines"]:
        assert set(payload["p_values"][baseline]["last_k"]) == {"16", "32"}
        assert f"| vs {baseline} | " in stdout
        assert f"{subject} vs {baseline} (beyond-length endpoint): " in stdout  # the verdict names its endpoint
    for label in (subject, "alibi", "kerple_log"):
        assert f"- {label} (degradation endpoint, 32 vs 16, margin ±10%): " in stdout
    for protocol in md.evaluate.PROTOCOLS:
        assert all(len(values) == 2 for values in payload["perplexity"][subject][protocol].values())
    # progress: a bar per run (tqdm, stderr), a line per run and the time left
    assert len(re.findall(r"^\[\d/6\] .* seed \d: .*left\)$", stdout, flags=re.M)) == 6 and "step/s" in stderr
    # the report names the version, the corpus's hash and size, and the byte-frequency floor
    report = (out / "compare.md").read_text()
    data = corpus_file.read_bytes()
    assert f"sha256 {hashlib.sha256(data).hexdigest()}" in report and f"{len(data)} bytes" in report
    assert f"minidape {importlib.metadata.version('minidape')}" in report
    assert f"perplexity per byte of {study.unigram_perplexity(str(corpus_file)):.2f}" in report
    assert (out / "compare.png").stat().st_size > 0

    # The bias file edited: its runs were made by other code, so they are refused, naming the file.
    bias_file.write_text(BIAS_FILE + "\n# changed\n")
    code, stdout, stderr = compare_cli(
        capsys, out, corpus_file, pe=f"{bias_file}:MyBias", against=("alibi", "kerple_log")
    )
    assert code == 2 and f"{out / 'runs' / 'my-bias-mybias' / 'seed0.json'} was made with another" in one_error(stderr)
    assert "code_sha256.pe" in stderr


def test_an_edited_corpus_is_refused_or_rerun_never_reused(tmp_path, corpus_file, capsys):
    out = tmp_path / "compare"
    assert compare_cli(capsys, out, corpus_file)[0] == 0
    before = json.loads((out / "runs" / "rope" / "seed0.json").read_text())
    corpus_file.write_text(TEXT.replace("truth", "TRUTH"))  # same path, same size, other text
    code, stdout, stderr = compare_cli(capsys, out, corpus_file)
    assert code == 2 and len(stderr.strip().splitlines()) == 1
    assert str(out / "runs" / "rope" / "seed0.json") in stderr and "corpus_sha256" in stderr
    assert json.loads((out / "runs" / "rope" / "seed0.json").read_text()) == before  # nothing replaced
    code, stdout, _ = compare_cli(capsys, out, corpus_file, "--rerun")  # asked for: trained again
    assert code == 0 and "done before" not in stdout
    after = json.loads((out / "runs" / "rope" / "seed0.json").read_text())
    assert after["run"]["corpus_sha256"] == hashlib.sha256(corpus_file.read_bytes()).hexdigest()
    assert after["run"]["corpus_sha256"] != before["run"]["corpus_sha256"]
    code, stdout, _ = compare_cli(capsys, out, corpus_file)  # now they match: reused
    assert code == 0 and stdout.count("done before") == 4


def test_two_corpora_with_one_file_name_are_two_corpora(tmp_path, capsys):
    first, second = tmp_path / "one" / "notes.txt", tmp_path / "two" / "notes.txt"
    for path, text in ((first, TEXT), (second, TEXT.replace("man", "woman"))):
        path.parent.mkdir()
        path.write_text(text)
    # reproduce keys its runs by corpus: the two files get two places
    assert study.runs.lm_run_path(tmp_path, str(first), 16, "RoPE", 0) != study.runs.lm_run_path(
        tmp_path, str(second), 16, "RoPE", 0
    )
    # compare into one folder: the second corpus's runs are not the first one's
    out = tmp_path / "compare"
    assert compare_cli(capsys, out, first)[0] == 0
    code, _, stderr = compare_cli(capsys, out, second)
    assert code == 2 and "corpus_sha256" in stderr


def test_a_run_file_from_another_configuration_is_refused(tmp_path, corpus_file, capsys):
    out = tmp_path / "compare"
    assert compare_cli(capsys, out, corpus_file)[0] == 0
    code, _, stderr = compare_cli(capsys, out, corpus_file, "--lr", "0.01")
    assert code == 2 and "seed0.json was made with another corpus or configuration (lr 0.003 there, 0.01 now)" in stderr
    # a file of another run copied in by hand: its recorded seed is not this run's
    runs = out / "runs" / "rope"
    (runs / "seed1.json").write_text((runs / "seed0.json").read_text())
    code, _, stderr = compare_cli(capsys, out, corpus_file)
    assert code == 2 and f"{runs / 'seed1.json'} was made" in stderr and "seed 0 there, 1 now" in stderr
    # a file from before runs recorded their corpus and configuration cannot be checked: refused too
    old = json.loads((runs / "seed0.json").read_text())
    del old["run"]
    (runs / "seed1.json").write_text(json.dumps(old))
    code, _, stderr = compare_cli(capsys, out, corpus_file)
    assert code == 2 and "it records neither (written before minidape recorded them)" in stderr


@pytest.mark.parametrize("broken", ["manifest.json", "runs/rope/seed0.json"])
@pytest.mark.parametrize("content", ["", "{\"truncated\": "])
def test_an_empty_or_malformed_store_file_is_named(broken, content, tmp_path, corpus_file, capsys):
    out = tmp_path / "compare"
    assert compare_cli(capsys, out, corpus_file)[0] == 0
    (out / broken).write_text(content)
    code, _, stderr = compare_cli(capsys, out, corpus_file)
    assert code == 2 and f"{out / broken} is not a valid JSON file" in stderr
    assert len(stderr.strip().splitlines()) == 1


def test_fewer_than_five_seeds_say_what_they_cannot_show(corpus_file, capsys):
    result = study.compare("rope", against=("alibi",), seeds=3, corpus=str(corpus_file), budget="tiny", steps=2)
    warning = capsys.readouterr().err
    assert (
        "warning: 3 seeds (fewer than 5): the exact sign-flip test cannot go below p = 0.25 (two-sided), so it "
        "cannot show an effect at α = 0.05" in warning
    )
    spread = np.std(next(item["units"] for item in result["endpoints"] if item["endpoint"] == "beyond"), ddof=1)
    power = study.statistics.t_test_power(spread, 3, math.log(1.05))
    assert f"at the observed spread (α = 0.05, before Holm): alibi {power:.0%}" in result["text"]
    study.compare("rope", against=("alibi",), seeds=5, corpus=str(corpus_file), budget="tiny", steps=2)
    assert "warning" not in capsys.readouterr().err


def test_t_test_power_is_the_noncentral_t():
    rng = np.random.default_rng(3)
    samples = rng.normal(0.05, 0.04, size=(4000, 5))  # 5 units, effect 0.05, spread 0.04
    simulated = np.mean(stats.ttest_1samp(samples, 0.0, axis=1).pvalue < 0.05)
    assert study.statistics.t_test_power(0.04, 5, 0.05) == pytest.approx(simulated, abs=0.03)
    # a tiny spread (two seeds of one run, far out in the tail where scipy's nct.cdf gives NaN): power near 1
    assert study.statistics.t_test_power(0.00165, 2, math.log(1.05)) == pytest.approx(1.0, abs=0.01)
    assert study.statistics.sign_flip_floor(5) == 2 / 32


def test_the_knobs_reach_the_trained_model(tmp_path, corpus_file, capsys):
    out = tmp_path / "compare"
    code, _, _ = run_cli(
        [
            "compare",
            "--pe",
            "kerple_log+conv:5",
            "--against",
            "kerple_log+dape:w=matched",
            "--seeds",
            "2",
            "--budget",
            "tiny",
            "--steps",
            "3",
            "--batch-size",
            "3",
            "--lr",
            "0.002",
            "--n-layer",
            "2",
            "--n-embd",
            "24",
            "--n-head",
            "3",
            "--train-length",
            "8",
            "--lengths",
            "2",
            "8",
            "24",
            "--corpus",
            corpus_file,
            "--out",
            out,
            "--keep-checkpoints",
        ],
        capsys,
    )
    assert code == 0
    model, checkpoint = load_checkpoint(out / "runs" / "kerple-log-conv-k-5" / "seed1" / "checkpoint.pt")
    kernels = [module.kernel_size for module in model.modules() if isinstance(module, torch.nn.Conv2d)]
    assert kernels and all(kernel == (1, 5) for kernel in kernels)  # a 1x5 refiner has 1x5 kernels
    cfg = model.cfg
    assert (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.block_size) == (2, 24, 3, 8)
    assert checkpoint["step"] == 3 and checkpoint["seed"] == 1
    dape, _ = load_checkpoint(out / "runs" / "kerple-log-dape-w-matched" / "seed0" / "checkpoint.pt")
    assert dape.cfg.refiner_width == study.matched_dape_width(3)
    run = json.loads((out / "runs" / "kerple-log-conv-k-5" / "seed0.json").read_text())["run"]
    assert (run["batch_size"], run["lr"], run["lengths"]) == (3, 0.002, [2, 8, 24])  # a length below T too
    result = json.loads((out / "compare.json").read_text())
    assert list(result["perplexity"]["kerple_log+conv:k=5"]["nonoverlap"]) == ["2", "8", "24"]
    assert set(run["config"]) == {field.name for field in dataclasses.fields(md.GPTConfig)}  # the full config


@pytest.mark.parametrize(
    "args, message",
    [
        (["--pe", "rope+conv:4"], "refiner_kernel must be an odd integer"),
        (["--pe", "rope+conv:x=2"], "bad refiner option 'x=2' in 'rope+conv:x=2'; valid: K or k=K"),
        (["--pe", "rope+conv:w=matched"], "only DAPE's MLP (refiner dape)"),
        (["--pe", "rope+nothing"], "unknown refiner 'nothing' in 'rope+nothing'; valid choices: none, dape"),
        (["--pe", "rope", "--against", "bogus"], "unknown pe 'bogus'; valid choices: none, learned"),
        (["--pe", "rope", "--lengths", "16", "24"], "longer lengths multiples of it, shorter ones dividing it"),
        (["--pe", "rope", "--lengths", "6", "16", "32"], "lengths must include the training length 16"),
        (["--pe", "rope", "--lengths", "8", "16"], "and go beyond it"),
        (["--pe", "rope", "--lengths", "16"], "and go beyond it"),
        (["--pe", "rope", "--seeds", "1"], "seeds must be an integer >= 2"),
    ],
)
def test_compare_model_and_knob_errors_are_one_line(args, message, tmp_path, corpus_file, capsys):
    code, _, stderr = run_cli(["compare", *args, *TINY, "--corpus", corpus_file, "--out", tmp_path / "out"], capsys)
    assert code == 2 and message in stderr and len(stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "runs").exists()


def test_compare_function_returns_the_statistics(corpus_file):
    result = study.compare(
        "rope", against=("alibi",), seeds=2, steps=2, corpus=str(corpus_file), budget="tiny", progress=False
    )
    assert result["subject"] == "rope"
    curves = result["perplexity"]
    assert set(curves) == {"rope", "alibi"}
    rope, alibi = curves["rope"]["nonoverlap"][32], curves["alibi"]["nonoverlap"][32]
    expected = stats.ttest_rel(np.log(rope), np.log(alibi)).pvalue  # on log perplexity
    assert result["p_values"]["alibi"]["nonoverlap"][32] == pytest.approx(expected, nan_ok=True)
    endpoints = {item["endpoint"] + item.get("model", ""): item for item in result["endpoints"]}
    for where, lengths in (("in", (16,)), ("beyond", (32,)), ("all", (16, 32))):
        per_seed = [
            np.mean(
                [
                    math.log(curves["rope"][protocol][length][seed] / curves["alibi"][protocol][length][seed])
                    for protocol in md.evaluate.PROTOCOLS
                    for length in lengths
                ]
            )
            for seed in (0, 1)
        ]
        assert endpoints[where]["ratio_minus_1"] == pytest.approx(math.expm1(np.mean(per_seed)))
        assert endpoints[where]["p_t"] == pytest.approx(stats.ttest_1samp(per_seed, 0.0).pvalue, nan_ok=True)
    degradation = [
        np.mean(
            [
                math.log(curves["alibi"][protocol][32][seed] / curves["alibi"][protocol][16][seed])
                for protocol in md.evaluate.PROTOCOLS
            ]
        )
        for seed in (0, 1)
    ]
    assert endpoints["degradationalibi"]["units"] == pytest.approx(degradation)


def test_rope_against_nope_fails_beyond_the_training_length_where_the_all_lengths_endpoint_sees_nothing():
    """The issue's point, on a bundled corpus: one endpoint pooled over all lengths averages the extrapolation
    away. RoPE against NoPE, 1 layer x 64, trained at 64 on python for 500 steps of 16 (5 seeds, 10 runs),
    evaluated at two lengths below the training length, at it and at 8x and 16x: RoPE is far better up to the
    training length and far worse beyond it, so the beyond-length endpoint is significant (RoPE worse) while
    the all-lengths one, pooling both, is not. On the seeds 5-9 this budget and these lengths gave the same
    (at the training length -28.9 %; beyond +37.7 %, Holm p = 0.004; all +2.4 %, p = 0.39; here -28.6 %,
    +37.4 % with Holm p = 0.007, +1.9 % with p = 0.42). About 50 s of CPU time."""
    result = study.compare(
        "rope",
        against=("none",),
        corpus="python",
        budget="small",
        train_length=64,
        lengths=(16, 64, 512, 1024),
        n_layer=1,
        n_embd=64,
        n_head=4,
        steps=500,
        batch_size=16,
        lr=3e-3,
        device="cpu",
        progress=False,
    )
    found = {item["endpoint"]: item for item in result["endpoints"] if item.get("baseline") == "none"}
    within, beyond, pooled = found["in"], found["beyond"], found["all"]
    assert within["ci95"][1] < 0 and within["p_holm"] < 0.05  # RoPE better at the training length
    assert beyond["ratio_minus_1"] > 0.1 and beyond["ci95"][0] > 0 and beyond["p_holm"] < 0.05  # worse beyond
    assert pooled["p_t"] > 0.05 and pooled["ci95"][0] < 0 < pooled["ci95"][1]  # pooled: no difference
    assert within["ratio_minus_1"] < pooled["ratio_minus_1"] < beyond["ratio_minus_1"]
    assert result["verdicts"][0].startswith(
        "rope vs none (beyond-length endpoint): higher (worse) perplexity beyond the training length"
    )


def test_compares_endpoints_are_reproduces_statements():
    """C1's "stays within 10 %" and the C2/C5 comparisons come out of `compare_endpoints` as out of `judge`."""
    rng = np.random.default_rng(4)
    lengths = (128, 256, 512, 1024, 2048)
    results = {
        "lm": {
            ("austen", 128, label): curves({length: list(rng.uniform(8, 12, size=5)) for length in lengths})
            for label in ("ALiBi", "Kerple-log", "DAPE-Kerple", "Kerple-power")
        }
    }
    judged = {
        item["statement"].text: item
        for item in study.judge(
            results,
            ["austen"],
            (128,),
            claims=(
                dataclasses.replace(study.CLAIMS[0], statements=(study.claims._stays_near("ALiBi"),)),
                dataclasses.replace(study.CLAIMS[1], statements=(study.claims._lower("DAPE-Kerple", "Kerple-log"),)),
                study.CLAIMS[4],
            ),
        )
    }
    perplexity = {label: results["lm"][("austen", 128, label)] for label in ("ALiBi", "Kerple-log", "DAPE-Kerple")}
    tests = study.compare_endpoints(perplexity, "DAPE-Kerple", ["Kerple-log"], 128, study.FLAT_MARGIN)
    found = {(test.get("baseline") or test["model"], test["endpoint_kind"]): test["endpoint"] for test in tests}
    flat = judged[study.claims._stays_near("ALiBi").text]
    assert list(flat["units"].values()) == found[("ALiBi", "degradation")].values
    assert flat["endpoint"].p == found[("ALiBi", "degradation")].p and flat["endpoint"].margin == pytest.approx(
        math.log(1.1)
    )
    lower = judged[study.claims._lower("DAPE-Kerple", "Kerple-log").text]
    assert list(lower["units"].values()) == found[("Kerple-log", "all")].values
    assert lower["endpoint"].p == found[("Kerple-log", "all")].p
    perplexity["Kerple-power"] = results["lm"][("austen", 128, "Kerple-power")]
    tests = study.compare_endpoints(perplexity, "Kerple-log", ["Kerple-power"], 128, study.FLAT_MARGIN)
    beyond = next(
        test for test in tests if test.get("baseline") == "Kerple-power" and test["endpoint_kind"] == "beyond"
    )
    c5 = judged[study.CLAIMS[4].statements[0].text]
    assert list(c5["units"].values()) == beyond["endpoint"].values


def test_compares_printed_degradations_are_c1s_statements_on_the_same_runs(corpus_file):
    """The runs of one `compare` (C1's models by their study labels) put through `judge`, as `reproduce` does
    with its runs: each model's degradation row that `compare` prints (ratio - 1, CI, t-test and sign-flip p)
    is the estimate and the tests REPRODUCTION.md prints under C1's statement about that model, from the same
    per-seed values; only Holm's family differs (the run's tests against the report's)."""
    result = study.compare(
        "ALiBi", against=("Kerple-log", "RoPE"), seeds=3, corpus=str(corpus_file), budget="tiny", steps=2
    )
    train_length = result["settings"]["train_lengths"][0]
    corpus = str(corpus_file)
    results = {"lm": {(corpus, train_length, label): curves for label, curves in result["perplexity"].items()}}
    c1 = study.CLAIMS[0]  # NoPE and sinusoidal APE are not among this run's models
    c1 = dataclasses.replace(c1, statements=tuple(s for s in c1.statements if s.model in result["perplexity"]))
    judged = study.judge(results, [corpus], (train_length,), claims=(c1,))
    printed = {row.split(" | ")[0].removeprefix("| "): row for row in result["table"].splitlines()}
    checked = []
    for item in judged:
        statement, endpoint = item["statement"], item["endpoint"]
        row = next(test for test in result["endpoints"] if test.get("model") == statement.model)
        assert list(item["units"].values()) == row["units"]
        if statement.kind == "flat":  # C1's "stays within 10 %": compare's TOST against its default margin
            assert endpoint.p == row["p_t"] and endpoint.p_sign_flip == row["p_sign_flip"]
            block = study.report._statement_block(item)
            shown = f"| degradation of {statement.model} | {study.report._estimate_text(statement, endpoint)} | "
            assert printed[f"degradation of {statement.model}"].startswith(shown)
            format_p = study.statistics.format_p
            assert f"t-test {format_p(row['p_t'])}, sign-flip {format_p(row['p_sign_flip'])}" in block
            checked.append(statement.model)
    assert checked == ["ALiBi", "Kerple-log"]


def test_compare_figure_draws_the_subject_strongest_and_every_model_in_its_own_colour(tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(study.figures, "save_figure", lambda fig, path: figures.append(fig))
    labels = ("my_bias", "kerple_log", "kerple_log+dape", "kerple_log+conv:k=5", "alibi")
    perplexity = {label: curves({16: [5.0 + i, 5.1 + i], 32: [5.5 + i, 5.4 + i]}) for i, label in enumerate(labels)}
    study.figures.compare_figure(perplexity, "my_bias", 16, 2, tmp_path / "compare.png")
    assert figure_rules.figure_problems(figures[0]) == []  # the notebooks' figure rules, here too
    for ax in figures[0].axes:
        lines = {line.get_label(): line for line in ax.get_lines() if line.get_label() in labels}
        assert len({line.get_color() for line in lines.values()}) == len(labels)
        widths = {label: line.get_linewidth() for label, line in lines.items()}
        assert widths["my_bias"] > max(width for label, width in widths.items() if label != "my_bias")
        assert lines["my_bias"].get_zorder() > max(
            line.get_zorder() for label, line in lines.items() if label != "my_bias"
        )
        darkness = {label: sum(matplotlib.colors.to_rgb(line.get_color())) for label, line in lines.items()}
        assert darkness["my_bias"] < min(value for label, value in darkness.items() if label != "my_bias")


@pytest.mark.parametrize(
    "pe, message",
    [
        ("missing_file.py:Bias", "no file"),
        ("BIAS_FILE:NotABias", "not a subclass of md.AdditiveBias"),
        ("BIAS_FILE:Nothing", "defines no 'Nothing'"),
        ("no_such_pe", "unknown pe"),
    ],
)
def test_compare_errors_are_one_line(pe, message, tmp_path, corpus_file, capsys):
    bias_file = tmp_path / "bias.py"
    bias_file.write_text(BIAS_FILE)
    pe = pe.replace("BIAS_FILE", str(bias_file))
    code, _, stderr = run_cli(
        ["compare", "--pe", pe, "--budget", "tiny", "--corpus", corpus_file, "--out", tmp_path / "out"], capsys
    )
    assert code == 2 and message in stderr and len(stderr.strip().splitlines()) == 1


def test_unigram_perplexity_is_the_cross_entropy_of_byte_frequencies(corpus_file):
    train, val = md.load_corpus(corpus_file, "train"), md.load_corpus(corpus_file, "val")
    counts = {byte: 1 for byte in range(256)}  # add-one smoothing
    for byte in train.tolist():
        counts[byte] += 1
    total = sum(counts.values())
    expected = math.exp(-sum(math.log(counts[byte] / total) for byte in val.tolist()) / len(val))
    assert study.unigram_perplexity(str(corpus_file)) == pytest.approx(expected, rel=1e-9)


def test_a_bias_file_given_to_import_and_to_pe_runs_once(tmp_path):
    """`--import FILE.py` and `--pe FILE.py:Class` load one module (`lab.user_code.import_file`): the file runs once, so
    a class that registers itself keeps its name instead of failing as registered twice."""
    path = tmp_path / "self_registering.py"
    path.write_text(
        "import minidape as md\nimport torch\n\nwith open(__file__ + '.runs', 'a') as f:\n    f.write('x')\n\n"
        "@md.register_pe('self_registering_bias')\nclass Bias(md.AdditiveBias):\n"
        "    def forward(self, q_pos, k_pos):\n"
        "        return torch.zeros(1, len(q_pos), len(k_pos))\n"
    )
    try:
        user_code.import_file(path)
        name, digest = study.resolve_pe(f"{path}:Bias")
        assert name == "self_registering_bias" and study.resolve_pe(f"{path}:Bias") == (name, digest)
        assert Path(f"{path}.runs").read_text() == "x"
    finally:
        md.model.PE_REGISTRY.pop("self_registering_bias", None)


# ----------------------------------------------------------------------------- the study on a cluster

FAKE_SBATCH = """#!/bin/sh
# A stand-in for Slurm's sbatch: runs the job array's tasks, two at a time (xargs -P 2), each with its index in
# SLURM_ARRAY_TASK_ID, as a cluster's nodes would.
for arg in "$@"; do
  case "$arg" in --array=*) range="${arg#--array=}" ;; esac
done
wrap="$2"; [ "$1" = --wrap ] || wrap="$3"
seq "${range%-*}" "${range#*-}" | SCRIPT="$wrap" xargs -P 2 -I{} env SLURM_ARRAY_TASK_ID={} sh -c "$wrap"
"""


def readme_cluster_lines() -> list[str]:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("### The study on a cluster", 1)[1]
    return section.split("```bash\n", 1)[1].split("```", 1)[0].strip().splitlines()


def test_the_readme_slurm_array_through_two_workers_gives_the_single_process_report(
    tmp_path, corpus_file, capsys, monkeypatch
):
    """The README's three lines (list, job array, report), with a tiny budget and an `sbatch` that runs the
    array's tasks in parallel, two at a time (subprocesses sharing the folder): the report is the one a single
    process writes (the header's timing and provenance aside). Over 10 s: six Python processes start (list,
    four runs, report), as a scheduler would start them."""
    lines = readme_cluster_lines()
    assert [line.split()[:4] for line in lines] == [
        ["python", "-m", "minidape", "compare"],
        ["sbatch", "--array=1-$(wc", "-l", "<"],
        ["python", "-m", "minidape", "compare"],
    ]
    tiny = f"{' '.join(TINY)} --seeds 2 --corpus {corpus_file} --out"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(FAKE_SBATCH)
    (bin_dir / "sbatch").chmod(0o755)
    python_dir = Path(sys.executable).parent  # `python` is this environment's
    env = {**os.environ, "PATH": f"{bin_dir}:{python_dir}:{os.environ['PATH']}", "MINIDAPE_THREADS": "1"}
    cluster = tmp_path / "cluster"
    cluster.mkdir()
    for line in lines:
        done = subprocess.run(
            ["sh", "-c", line.replace("--out", tiny)], cwd=cluster, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
    listed = (cluster / "runs.txt").read_text().splitlines()
    assert len(listed) == 4 and all(f"--run {n}  # " in line for n, line in enumerate(listed))

    pe, against = lines[0].split("--pe ")[1].split()[0], lines[0].split("--against ")[1].split()[0]
    monkeypatch.chdir(tmp_path)
    code, _, _ = compare_cli(capsys, tmp_path / "one", corpus_file, pe=pe, against=(against,))
    assert code == 0
    one, many = tmp_path / "one", cluster / "study"
    assert json.loads((many / "compare.json").read_text()) == json.loads((one / "compare.json").read_text())
    first_paragraph = re.compile(r"\A.*?\n\n.*?\n\n", re.S)  # the title, then wall time, runs trained, machine
    assert first_paragraph.sub("", (many / "compare.md").read_text()) == first_paragraph.sub(
        "", (one / "compare.md").read_text()
    )
    assert sorted(p.name for p in (many / "runs").rglob("*")) == sorted(p.name for p in (one / "runs").rglob("*"))


def test_a_report_with_runs_missing_is_refused_and_a_run_outside_the_list_named(tmp_path, corpus_file, capsys):
    out = tmp_path / "out"
    code, stdout, _ = compare_cli(capsys, out, corpus_file, "--list-runs")
    assert code == 0 and len(stdout.splitlines()) == 4 and not (out / "runs").exists()
    code, _, _ = compare_cli(capsys, out, corpus_file, "--run", "1")
    assert code == 0 and [p.name for p in (out / "runs").rglob("*.json")] == ["seed1.json"]
    code, _, stderr = compare_cli(capsys, out, corpus_file, "--report")
    assert code == 2 and "3 of the 4 runs are not done" in one_error(stderr) and "rope seed 0" in stderr
    assert "(--run 0,2-3: lines 1,3-4 of --list-runs, as a job array's indices)" in stderr  # to submit again
    assert "--seeds" not in stderr  # no seed is done by both models
    assert not (out / "compare.md").exists()
    code, _, stderr = compare_cli(capsys, out, corpus_file, "--run", "4")
    assert code == 2 and "run 4 is not in the list: valid runs are 0 to 3" in one_error(stderr)
    # Of 3 seeds, seeds 0 and 1 done by both models (runs 0, 1 and 3, 4): the report of those 2 is offered, and made
    three = tmp_path / "three"
    for number in (0, 1, 3, 4):
        assert compare_cli(capsys, three, corpus_file, "--run", number, seeds=3)[0] == 0
    code, _, stderr = compare_cli(capsys, three, corpus_file, "--report", seeds=3)
    assert code == 2 and "(--run 2,5: lines 3,6 of --list-runs" in stderr
    assert one_error(stderr).endswith("report the 2 seeds every model has done now: the same command with --seeds 2")
    code, _, _ = compare_cli(capsys, three, corpus_file, "--report", seeds=2)
    assert code == 0 and json.loads((three / "compare.json").read_text())["seeds"] == 2
    # reproduce lists its runs alike, checked as a whole before any is listed
    code, stdout, _ = run_cli(
        [
            "reproduce",
            "--budget",
            "tiny",
            "--seeds",
            "2",
            "--corpus",
            corpus_file,
            "--out",
            tmp_path / "r",
            "--list-runs",
        ],
        capsys,
    )
    assert code == 0 and stdout.splitlines()[0].endswith("--run 0  # " + stdout.splitlines()[0].split("# ")[1])
    assert len(stdout.splitlines()) == len(set(stdout.splitlines())) > 4
