"""Nothing lost, nothing silently wrong, round 4: a resumed run keeps its own settings, runs are told apart, a
user's file that exits is an error, a full disk or a bad checkpoint or corpus is one line naming the file,
memory is checked before the model is built, every flag is named in its own error, SIGTERM and SIGHUP stop
training like Ctrl-C, quick mode is said, API arguments of the wrong type are named, stale temporary files are
removed, an interrupted demo resumes."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_cli import error_lines, failing
from test_nothing_lost import cli_process
from test_train import stopped_after_checkpoint

import minidape as md
from minidape import __main__ as cli
from minidape.lab import memory
from minidape.lab.checkpoints import CHECKPOINT_NAME, load_checkpoint, read_checkpoint

REPO = Path(__file__).resolve().parent.parent
TINY = ["--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--block-size", "16"]
train_module = sys.modules["minidape.lab.train"]


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "books.txt"
    path.write_bytes(bytes(md.load_corpus("austen", "train")[:20_000].tolist()))
    return path


# ----------------------------------------------------------------------------- a resumed run keeps its settings


def test_resume_continues_with_the_runs_own_settings_and_refuses_other_ones(tmp_path, corpus_file, capsys):
    """A run with its own --lr, --batch-size, --warmup, --weight-decay, --grad-clip and --seed, stopped after its
    step-4 checkpoint and resumed with `--resume` alone (as the Ctrl-C message says), ends where the run never
    stopped ends; a setting given on resume that differs from the run's is refused in one line naming the flag."""
    settings = [
        *TINY,
        "--corpus",
        str(corpus_file),
        "--steps",
        "8",
        "--checkpoint-every",
        "4",
        "--lr",
        "3e-3",
        "--batch-size",
        "3",
        "--warmup",
        "2",
        "--weight-decay",
        "0.05",
        "--grad-clip",
        "0.5",
        "--seed",
        "7",
    ]
    cli.main(["train", *settings, "--out", str(tmp_path / "whole")])
    with stopped_after_checkpoint(4):
        cli.main(["train", *settings, "--out", str(tmp_path / "cut")])
    cli.main(["train", "--out", str(tmp_path / "cut"), "--resume"])
    whole, cut = (json.loads((tmp_path / run / "history.json").read_text()) for run in ("whole", "cut"))
    assert cut == whole
    assert torch.equal(
        load_checkpoint(tmp_path / "cut")[0].lm_head.weight, load_checkpoint(tmp_path / "whole")[0].lm_head.weight
    )
    for flag, value in (
        ("--lr", "1e-3"),
        ("--batch-size", "4"),
        ("--seed", "0"),
        ("--warmup", "1"),
        ("--weight-decay", "0.1"),
        ("--grad-clip", "1"),
        ("--min-lr", "0"),
    ):
        code, err = failing(capsys, ["train", "--out", str(tmp_path / "cut"), "--resume", flag, value])
        assert code == 2 and len(err) == 1 and flag in err[0] and "the run's own" in err[0], (flag, err)
    # more steps extend the run, and say so
    cli.main(["train", "--out", str(tmp_path / "cut"), "--resume", "--steps", "10"])
    assert "from 8 to 10 steps" in capsys.readouterr().err
    assert read_checkpoint(tmp_path / "cut")["step"] == 10


# ----------------------------------------------------------------------------- every flag named in its own error


def test_every_bad_setting_names_its_flag(tmp_path, corpus_file, capsys):
    """Each bad value is one line naming the flag that set it, not the API's name or a check it failed inside."""
    train = ["train", *TINY, "--corpus", str(corpus_file), "--steps", "1", "--out", str(tmp_path / "run")]
    cases = [
        ([*train, "--block-size", "1"], "--block-size"),
        ([*train, "--n-layer", "0"], "--n-layer"),
        ([*train, "--dropout", "2"], "--dropout"),
        ([*train, "--n-head", "3"], "--n-head"),
        ([*train, "--vocab-size", "3"], "--vocab-size"),
        ([*train, "--min-lr", "-1"], "--min-lr"),
        ([*train, "--warmup", "-1"], "--warmup"),
        ([*train, "--weight-decay", "-1"], "--weight-decay"),
        ([*train, "--grad-clip", "-1"], "--grad-clip"),
        ([*train, "--seed", "-1"], "--seed"),
        (["che", "--task", "parity_check", "--n-layer", "0", "--out", str(tmp_path / "che")], "--n-layer"),
    ]
    for argv, flag in cases:
        code, err = failing(capsys, argv)
        assert code == 2 and len(err) == 1 and flag in err[0], (flag, err)
    assert not (tmp_path / "run").exists() and not (tmp_path / "che").exists()


# ----------------------------------------------------------------------------- distinct labels for distinct runs


def test_eval_of_runs_of_one_kind_labels_each_by_the_path_that_tells_it_apart(tmp_path, corpus_file, capsys):
    """`eval a/run b/run c/run` of three ALiBi models: three rows, each named by what tells its run apart; the
    same run given twice is refused."""
    for parent in ("a", "b", "c"):
        cli.main(
            [
                "train",
                *TINY,
                "--pe",
                "alibi",
                "--corpus",
                str(corpus_file),
                "--steps",
                "1",
                "--batch-size",
                "2",
                "--seed",
                str(ord(parent)),
                "--out",
                str(tmp_path / parent / "run"),
            ]
        )
    runs = [str(tmp_path / parent / "run") for parent in ("a", "b", "c")]
    evaluate = ["eval", "--lengths", "16", "--protocol", "nonoverlap", "--n-tokens", "200"]
    cli.main([*evaluate, *runs, "--out", str(tmp_path / "all")])
    results = json.loads((tmp_path / "all" / "results.json").read_text())["results"]
    assert sorted(results) == ["alibi (a/run)", "alibi (b/run)", "alibi (c/run)"]
    assert len({tuple(curve.values()) for curve in results.values()}) == 3  # three models, three curves
    code, err = failing(
        capsys, [*evaluate, runs[0], str(Path(runs[0]) / CHECKPOINT_NAME), "--out", str(tmp_path / "twice")]
    )
    assert code == 2 and len(err) == 1 and "given twice" in err[0]


# ----------------------------------------------------------------------------- a user's file that exits


@pytest.mark.parametrize("ending", ["import sys\nsys.exit(0)\n", "raise SystemExit('bye')\n"])
def test_an_imported_file_that_exits_is_an_error_naming_it(tmp_path, corpus_file, capsys, ending):
    """`--import` of a file that calls sys.exit: one line naming the file and its line, exit code 2, nothing
    trained (it used to end `train` with exit code 0, having done nothing)."""
    user = tmp_path / "exits.py"
    user.write_text("import minidape as md\n" + ending)
    code, err = failing(
        capsys,
        [
            "train",
            "--import",
            str(user),
            *TINY,
            "--corpus",
            str(corpus_file),
            "--steps",
            "1",
            "--out",
            str(tmp_path / "run"),
        ],
    )
    exit_line = len(user.read_text().splitlines())
    assert code == 2 and len(err) == 1 and str(user) in err[0] and f"line {exit_line}: called exit" in err[0], err
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- a full disk


def limited_files(size: int):
    """For a child process: files it writes cannot grow beyond `size` bytes, as on a disk that is full (Python
    ignores SIGXFSZ, so the write fails with an error, the way a full disk's does)."""
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))


def test_a_full_disk_at_a_checkpoint_write_is_one_line_and_the_earlier_checkpoint_stays(tmp_path, corpus_file):
    run = tmp_path / "run"
    cli.main(["train", *TINY, "--corpus", str(corpus_file), "--steps", "2", "--batch-size", "2", "--out", str(run)])
    before = (run / CHECKPOINT_NAME).read_bytes()
    resumed = cli_process(
        "train", "--out", str(run), "--resume", "--steps", "4", cwd=tmp_path, preexec_fn=limited_files(20_000)
    )
    _, err = resumed.communicate(timeout=300)
    lines = error_lines(err)
    assert resumed.returncode == 2 and len(lines) == 1, err[-2000:]
    assert f"cannot write {run / CHECKPOINT_NAME}" in lines[0] and "holds step 2" in lines[0], lines
    assert (run / CHECKPOINT_NAME).read_bytes() == before
    assert sorted(os.listdir(run)) == [CHECKPOINT_NAME, "history.json"]  # no temporary file left behind


def test_a_full_disk_during_eval_names_the_file_and_writes_no_result(tmp_path, corpus_file):
    """The table and the JSON are small and the plot is not: on a full disk at the plot, none of the three
    results appears (so the next run needs no --overwrite), and the line names the file."""
    cli.main(
        [
            "train",
            *TINY,
            "--corpus",
            str(corpus_file),
            "--steps",
            "1",
            "--batch-size",
            "2",
            "--out",
            str(tmp_path / "run"),
        ]
    )
    evaluate = [
        "eval",
        str(tmp_path / "run"),
        "--lengths",
        "16",
        "32",
        "--n-windows",
        "2",
        "--last-k",
        "8",
        "--out",
        str(tmp_path / "results"),
    ]
    full = cli_process(*evaluate, cwd=tmp_path, preexec_fn=limited_files(20_000))
    _, err = full.communicate(timeout=300)
    lines = error_lines(err)
    assert full.returncode == 2 and len(lines) == 1, err[-2000:]
    assert f"cannot write {tmp_path / 'results' / 'extrapolation.png'}" in lines[0], lines
    assert not (tmp_path / "results").exists() or os.listdir(tmp_path / "results") == []
    cli.main(evaluate)  # no --overwrite needed: nothing was written
    assert {"results.md", "results.json", "extrapolation.png"} <= set(os.listdir(tmp_path / "results"))


# ----------------------------------------------------------------------------- checkpoints that do not fit


def broken_checkpoints(run: Path, folder: Path) -> list[tuple[Path, str]]:
    """Copies of `run`'s checkpoint, each damaged in one way, with what its error must say."""

    def damaged(name: str, damage) -> Path:
        checkpoint = read_checkpoint(run)
        damage(checkpoint)
        (folder / name).mkdir(parents=True)
        torch.save(checkpoint, folder / name / CHECKPOINT_NAME)
        return folder / name / CHECKPOINT_NAME

    def reshape(checkpoint):
        checkpoint["model"]["lm_head.weight"] = checkpoint["model"]["lm_head.weight"][:, :8]

    return [
        (damaged("shape", reshape), "lm_head.weight has shape (256, 8)"),
        (damaged("missing", lambda checkpoint: checkpoint["model"].pop("ln_f.weight")), "ln_f.weight is missing"),
        (damaged("extra", lambda checkpoint: checkpoint["model"].update(stray=torch.zeros(1))), "stray"),
        (damaged("vocab", lambda checkpoint: checkpoint["config"].update(vocab_size=128)), "(256, 16)"),
        (damaged("list", lambda checkpoint: checkpoint.update(config=[1, 2])), "config is a list"),
        (damaged("none", lambda checkpoint: checkpoint.update(model=None)), "model is a NoneType"),
        (damaged("bad", lambda checkpoint: checkpoint["config"].update(n_head=3)), "n_head"),
    ]


def test_a_checkpoint_that_does_not_fit_its_config_is_one_line_naming_the_file(tmp_path, corpus_file, capsys):
    run = tmp_path / "run"
    cli.main(["train", *TINY, "--corpus", str(corpus_file), "--steps", "1", "--batch-size", "2", "--out", str(run)])
    for checkpoint, message in broken_checkpoints(run, tmp_path / "broken"):
        for argv in (
            ["eval", str(checkpoint), "--lengths", "16"],
            ["train", "--out", str(checkpoint.parent), "--resume", "--steps", "2"],
        ):
            code, err = failing(capsys, argv)
            assert code == 2 and len(err) == 1 and str(checkpoint) in err[0] and message in err[0], (argv, err)
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            load_checkpoint(checkpoint)


# ----------------------------------------------------------------------------- corpora that cannot be read


def test_corrupt_compressed_corpora_fifos_and_devices_are_refused_with_the_reason(tmp_path, capsys):
    import gzip

    text = bytes(md.load_corpus("austen", "val")[:5000].tolist())
    corrupt = tmp_path / "corrupt.txt.gz"
    packed = bytearray(gzip.compress(text))
    packed[len(packed) // 2 : len(packed) // 2 + 64] = bytes(64)  # the deflate stream, damaged mid-way
    corrupt.write_bytes(bytes(packed))
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)
    cases = [(corrupt, "corrupt"), (fifo, "named pipe"), (Path("/dev/null"), "character device")]
    for path, reason in cases:
        with pytest.raises(ValueError, match=reason):
            md.load_corpus(path, "train")
        code, err = failing(
            capsys, ["train", *TINY, "--corpus", str(path), "--steps", "1", "--out", str(tmp_path / "run")]
        )
        assert code == 2 and len(err) == 1 and str(path) in err[0] and reason in err[0], err
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- memory: the weights count too


def test_a_model_whose_weights_cannot_fit_is_refused_before_it_is_built(tmp_path, corpus_file, capsys, monkeypatch):
    """The weights, their gradients and Adam's two moments (16 bytes a parameter) are counted before the model
    is built: a model of 12.6 M parameters (200 MB) with 10 MB free is one line, though one step's activations
    (2 MB) would fit; and the issue's 131072-wide model is refused on any machine, never allocated."""
    built = []
    monkeypatch.setattr(train_module, "GPT", lambda cfg: built.append(cfg))
    wide = [
        "train",
        "--n-layer",
        "4",
        "--n-embd",
        "512",
        "--n-head",
        "8",
        "--block-size",
        "16",
        "--batch-size",
        "1",
        "--corpus",
        str(corpus_file),
        "--steps",
        "1",
        "--out",
        str(tmp_path / "wide"),
    ]
    with monkeypatch.context() as scarce:
        scarce.setattr(memory, "available_memory", lambda device: 10 * 2**20)
        code, err = failing(capsys, wide)
    assert code == 2 and len(err) == 1 and "weights" in err[0] and "--n-embd" in err[0], err
    code, err = failing(
        capsys,
        [
            "train",
            "--n-embd",
            "131072",
            "--n-head",
            "1",
            "--corpus",
            str(corpus_file),
            "--steps",
            "1",
            "--out",
            str(tmp_path / "huge"),
        ],
    )
    assert code == 2 and len(err) == 1 and "GiB" in err[0] and "weights" in err[0], err
    assert built == [] and not (tmp_path / "wide").exists() and not (tmp_path / "huge").exists()


# ----------------------------------------------------------------------------- SIGTERM and SIGHUP


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_stop_training_like_ctrl_c(tmp_path, corpus_file, stop):
    """A `kill` (SIGTERM) or a closed terminal (SIGHUP) mid-run: one line saying which checkpoint survives and
    how to resume, exit code 128 + the signal's number, and the checkpoint named loads."""
    run = tmp_path / "run"
    training = cli_process(
        "train",
        *TINY,
        "--corpus",
        str(corpus_file),
        "--steps",
        "100000",
        "--batch-size",
        "2",
        "--checkpoint-every",
        "5",
        "--out",
        str(run),
        cwd=tmp_path,
    )
    deadline = time.monotonic() + 120
    while not (run / CHECKPOINT_NAME).exists() and training.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    training.send_signal(stop)
    _, err = training.communicate(timeout=120)
    lines = error_lines(err)
    assert training.returncode == 128 + stop and len(lines) == 1, (training.returncode, err[-2000:])
    assert signal.Signals(stop).name in lines[0] and "holds step" in lines[0] and "--resume" in lines[0], lines
    assert read_checkpoint(run)["step"] % 5 == 0


def test_a_sigterm_that_lands_in_a_weakref_callback_still_stops_training(tmp_path, monkeypatch):
    """Python prints an exception raised inside a weak reference's callback and goes on: a handler that raised
    there lost the signal (a SIGTERM under load in `make test`, training ran on). Here the signal is sent from
    inside such a callback at step 3: training stops at its next step, as a SIGTERM anywhere else does."""
    import weakref

    update = train_module._update

    def update_then_signal_from_a_callback(*args):
        out = update(*args)
        if args[-1] == 3:
            holder = type("Holder", (), {})()
            weakref.finalize(holder, os.kill, os.getpid(), signal.SIGTERM)
            del holder  # the callback runs here, and the signal's handler with it
        return out

    monkeypatch.setattr(train_module, "_update", update_then_signal_from_a_callback)
    cfg = md.GPTConfig(n_layer=1, n_embd=16, n_head=2, block_size=16)
    tokens = md.load_corpus("austen", "val")[:5000]
    with pytest.raises(train_module.TrainingInterrupted) as stopped:
        md.train(cfg, tokens, steps=50, batch_size=2, out=tmp_path / "run", progress=False)
    assert stopped.value.exit_code == 128 + signal.SIGTERM and "SIGTERM" in str(stopped.value)
    assert "at step 4" in str(stopped.value)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is put back


# ----------------------------------------------------------------------------- quick mode


@pytest.fixture
def tiny_demo(monkeypatch):
    """The demo on a token budget (its real one is its own business): every code path, in seconds."""
    from minidape.study import demo

    tiny = __import__("dataclasses").replace(
        demo.QUICK_BUDGET, n_layer=1, n_embd=16, n_head=2, steps=2, batch_size=2, eval_factors=(1, 2), eval_windows=1
    )
    monkeypatch.setattr(demo, "QUICK_BUDGET", tiny)
    monkeypatch.setenv("MINIDAPE_QUICK", "1")
    return demo


@pytest.mark.parametrize("value", ["false", "no", "2", "on"])
def test_quick_modes_variable_takes_its_documented_values_only(tmp_path, capsys, monkeypatch, value):
    monkeypatch.setenv("MINIDAPE_QUICK", value)
    with pytest.raises(ValueError, match=f"MINIDAPE_QUICK={value!r}.*valid values: 1 .* 0 or empty"):
        md.utils.quick_mode()
    (tmp_path / "file").write_text("")
    code, err = failing(capsys, ["demo", "--out", str(tmp_path / "file")])
    assert code == 2 and len(err) == 1 and f"MINIDAPE_QUICK={value!r}" in err[0], err
    for off in ("0", ""):
        monkeypatch.setenv("MINIDAPE_QUICK", off)
        assert md.utils.quick_mode() is False
    monkeypatch.setenv("MINIDAPE_QUICK", "1")
    assert md.utils.quick_mode() is True


def test_a_quick_run_says_quick_mode_once(tmp_path, capsys, tiny_demo):
    cli.main(["demo", "--out", str(tmp_path), "--device", "cpu"])
    printed = capsys.readouterr()
    assert (printed.out + printed.err).lower().count("quick mode") == 1, printed


# ----------------------------------------------------------------------------- API arguments of the wrong type


def test_api_arguments_of_the_wrong_type_are_named(tmp_path):
    from minidape.lab.evaluate import loss_by_position, perplexity_by_length

    cfg = md.GPTConfig(n_layer=1, n_embd=16, n_head=2, block_size=16)
    model, tokens = md.GPT(cfg), md.load_corpus("austen", "val")[:5000]
    cases = [
        (lambda: perplexity_by_length(model, tokens, "32"), "lengths", "'32'"),
        (lambda: perplexity_by_length(model, tokens, None), "lengths", "None"),
        (lambda: perplexity_by_length(model, tokens, [16, 32.0]), "length", "32.0"),
        (lambda: perplexity_by_length("model", tokens, [16]), "model", "str"),
        (lambda: perplexity_by_length(model, tokens, [16], seed="0"), "seed", "'0'"),
        (lambda: loss_by_position(model, tokens, 16, seed=None), "seed", "None"),
        (lambda: loss_by_position(None, tokens, 16), "model", "NoneType"),
        (lambda: md.train(cfg, tokens, steps=1, out=123, progress=False), "out", "int"),
        (lambda: md.train(None, tokens, steps=1, out=tmp_path / "run", resume=1, progress=False), "resume", "1"),
        (lambda: load_checkpoint(123), "path", "int"),
    ]
    for call, name, value in cases:
        with pytest.raises((TypeError, ValueError)) as error:
            call()
        assert name in str(error.value) and value in str(error.value), (name, error.value)


# ----------------------------------------------------------------------------- litter


def test_temporary_checkpoints_left_by_a_killed_save_are_removed_by_the_next_run(tmp_path, corpus_file):
    """A kill during a checkpoint write leaves its `.checkpoint.pt.*.tmp` (atomic_path's temporary file); the
    next run in that folder, which holds the folder's lock, removes it, and leaves other files alone."""
    run = tmp_path / "run"
    run.mkdir()
    killed = [run / ".checkpoint.pt.k1ll3d.tmp", run / ".history.json.x7.tmp"]
    for path in killed:
        path.write_bytes(bytes(1000))
    (run / "notes.tmp").write_text("the user's")
    train = ["train", *TINY, "--corpus", str(corpus_file), "--batch-size", "2", "--out", str(run)]
    cli.main([*train, "--steps", "1"])
    assert sorted(os.listdir(run)) == [CHECKPOINT_NAME, "history.json", "notes.tmp"]
    killed[0].write_bytes(bytes(1000))
    cli.main([*train, "--steps", "2", "--resume"])
    assert sorted(os.listdir(run)) == [CHECKPOINT_NAME, "history.json", "notes.tmp"]


# ----------------------------------------------------------------------------- an interrupted demo


def test_an_interrupted_demo_is_resumed_by_the_same_command(tmp_path, capsys, tiny_demo):
    """`make demo` cannot pass --overwrite: run again after an interruption (here: after 5 of 7 models), the
    same command keeps the models already trained (bitwise) and trains only the others; a finished demo is still
    refused, and a model of other settings in the folder is refused, not continued."""
    cli.main(["demo", "--out", str(tmp_path), "--device", "cpu"])
    first = json.loads((tmp_path / "results.json").read_text())["results"]
    for name in ("results.md", "results.json", "extrapolation.png"):
        (tmp_path / name).unlink()
    for label in tiny_demo.DEMO_MODELS[5:]:
        (tmp_path / label / CHECKPOINT_NAME).unlink()
    kept = {label: read_checkpoint(tmp_path / label)["model"] for label in tiny_demo.DEMO_MODELS[:5]}
    capsys.readouterr()
    cli.main(["demo", "--out", str(tmp_path), "--device", "cpu"])
    printed = capsys.readouterr().out
    assert printed.count("trained earlier") == 5
    for label, weights in kept.items():
        now = read_checkpoint(tmp_path / label)["model"]
        assert all(torch.equal(weights[key], now[key]) for key in weights), label
    again = json.loads((tmp_path / "results.json").read_text())["results"]
    assert again.keys() == first.keys()
    assert all(again[label] == pytest.approx(first[label], rel=1e-5) for label in first)  # the same seven models
    code, err = failing(capsys, ["demo", "--out", str(tmp_path), "--device", "cpu"])
    assert code == 2 and len(err) == 1 and "--overwrite" in err[0]
    for name in ("results.md", "results.json", "extrapolation.png"):
        (tmp_path / name).unlink()
    code, err = failing(capsys, ["demo", "--out", str(tmp_path), "--device", "cpu", "--steps", "3"])
    assert code == 2 and len(err) == 1 and "--overwrite" in err[0] and "2 steps" in err[0], err


# ----------------------------------------------------------------------------- the benchmark's numbers


@pytest.mark.parametrize("flag", ["--threads", "--eval-length", "--repeats", "--rounds", "--length", "--batch"])
def test_the_benchmarks_numeric_flags_are_checked_in_one_line(capsys, flag):
    code, err = failing(capsys, ["bench", flag, "-3"])
    assert code == 2 and len(err) == 1 and flag in err[0] and "-3" in err[0], err


# ----------------------------------------------------------------------------- grading without its extra


def test_grading_without_its_packages_says_in_one_line_what_to_install(tmp_path):
    """Where jupytext is not installed (a plain `pip install minidape`), `grade` names the extra to install."""
    missing = tmp_path / "without" / "jupytext"
    missing.mkdir(parents=True)
    (missing / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'jupytext'\", name='jupytext')\n")
    (tmp_path / "a.ipynb").write_text("{}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "without"), str(REPO)]), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "minidape", "grade", "a.ipynb"],
        cwd=tmp_path,
        env=env,
        text=True,
        capture_output=True,
        timeout=300,
    )
    lines = error_lines(done.stderr)
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert "jupytext" in lines[0] and "pip install 'minidape[grade]'" in lines[0], lines
