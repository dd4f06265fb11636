"""minidape's CPU threads (minidape/threads.py): an explicit choice wins, else the cores allowed, the work and the
load; idle threads wait briefly when minidape loads torch."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import minidape as md
from minidape import __main__ as cli
from minidape import grade, notebook, threads
from minidape.lab import bench

REPO = Path(__file__).resolve().parent.parent
NO_SETTING = ("MINIDAPE_THREADS", "OMP_NUM_THREADS")


@pytest.fixture
def machine(monkeypatch):
    """A machine of 8 allowed cores (as many online) and a load set by the test; no thread setting in the
    environment."""
    for variable in NO_SETTING:
        monkeypatch.delenv(variable, raising=False)
    state = {"load": 0.0}
    monkeypatch.setattr(threads, "allowed_cores", lambda: 8)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 8)
    monkeypatch.setattr(threads, "machine_load", lambda: state["load"])
    return state


def test_an_explicit_choice_wins_in_order(machine, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads.choose_threads(work=10**9) == threads.ThreadChoice(3, "OMP_NUM_THREADS=3")
    monkeypatch.setenv("MINIDAPE_THREADS", "5")
    assert threads.choose_threads(work=1) == threads.ThreadChoice(5, "MINIDAPE_THREADS=5")
    assert threads.choose_threads(requested=2) == threads.ThreadChoice(2, "--threads")
    assert str(threads.ThreadChoice(1, "--threads")) == "1 CPU thread (--threads)"


@pytest.mark.parametrize("value", ["0", "-3", "two", "1.5"])
def test_a_bad_setting_is_named(machine, monkeypatch, value):
    monkeypatch.setenv("MINIDAPE_THREADS", value)
    with pytest.raises(ValueError, match=f"MINIDAPE_THREADS must be a positive integer .*got '{value}'"):
        threads.choose_threads()


@pytest.mark.parametrize("waits", ["short waits", "idle threads spin: torch was loaded first"])
def test_threads_take_the_cores_other_processes_leave(machine, monkeypatch, waits):
    monkeypatch.setattr(threads, "WAITS", waits)
    for load, expected in ((0.0, 8), (2.6, 5), (7.6, 1), (30.0, 1)):
        machine["load"] = load
        choice = threads.choose_threads()
        assert choice.threads == expected, load
        assert choice.reason.endswith(f"load {load:.1f}, {waits}")
    machine["load"] = 2.0
    assert threads.choose_threads(work=2 * threads.WORK_PER_THREAD).threads == 2
    # the work caps them: one thread per WORK_PER_THREAD elements, and small work runs on one
    machine["load"] = 0.0
    assert threads.choose_threads(work=3 * threads.WORK_PER_THREAD).threads == 3
    assert threads.choose_threads(work=threads.WORK_PER_THREAD).threads == 1


def test_a_load_that_ended_does_not_count(monkeypatch):
    """The 1-minute load average still counts a load that ended (this process's own work a minute ago, the
    benchmark's previous run): the load read is the tasks running now."""
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (40.0, 40.0, 40.0))
    monkeypatch.setattr(threads, "running_now", lambda: 0.0)
    assert threads.machine_load() == 0.0
    monkeypatch.setattr(threads, "running_now", lambda: 3.0)
    assert threads.machine_load() == 3.0


def test_cgroup_quota(tmp_path):
    assert threads.cgroup_cpu_limit(tmp_path) is None  # no cgroup files
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert threads.cgroup_cpu_limit(tmp_path) is None
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert threads.cgroup_cpu_limit(tmp_path) == 2
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("400000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert threads.cgroup_cpu_limit(tmp_path) == 4
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert threads.cgroup_cpu_limit(tmp_path) is None


def test_the_machine_is_read():
    assert 1 <= threads.allowed_cores() <= (os.cpu_count() or 1)
    assert threads.machine_load() >= 0


@pytest.mark.parametrize(
    "torch_first,preset,expected",
    [
        (False, {}, "1000 0 short waits"),
        (True, {}, "None None idle threads spin: torch was loaded first"),
        (False, {"OMP_WAIT_POLICY": "PASSIVE"}, "None None waits as set: OMP_WAIT_POLICY=PASSIVE"),
    ],
)
def test_idle_threads_wait_briefly_when_minidape_loads_torch(torch_first, preset, expected):
    """Imported before torch, minidape bounds GNU OpenMP's spin (GOMP_SPINCOUNT) and makes LLVM's and Intel's
    OpenMP sleep at once (KMP_BLOCKTIME); after torch, or where the user chose a wait setting, it sets nothing."""
    code = ("import torch; " if torch_first else "") + (
        "import os, minidape; "
        "print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('KMP_BLOCKTIME'), minidape.threads.WAITS)"
    )
    env = {key: value for key, value in os.environ.items() if key not in threads.WAIT_VARIABLES} | preset
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == expected


def test_every_command_sets_the_threads_and_says_an_explicit_count(capsys, monkeypatch):
    monkeypatch.setenv("MINIDAPE_THREADS", "x")
    with pytest.raises(SystemExit) as stopped:
        cli.main(["eval", "missing.pt"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "python -m minidape: error: MINIDAPE_THREADS must be a positive integer (CPU threads); got 'x'"
    )
    monkeypatch.setenv("MINIDAPE_THREADS", "2")
    previous = torch.get_num_threads()
    try:
        with pytest.raises(SystemExit):
            cli.main(["eval", "missing.pt", "--threads", "1"])
        assert "minidape: 1 CPU thread (--threads)" in capsys.readouterr().err.splitlines()
        assert torch.get_num_threads() == 1
        with pytest.raises(SystemExit):
            cli.main(["eval", "missing.pt"])
        assert "minidape: 2 CPU threads (MINIDAPE_THREADS=2)" in capsys.readouterr().err.splitlines()
        assert torch.get_num_threads() == 2
        monkeypatch.delenv("MINIDAPE_THREADS")
        monkeypatch.setenv("OMP_NUM_THREADS", "1")  # torch's own setting: honoured, not repeated
        with pytest.raises(SystemExit):
            cli.main(["eval", "missing.pt"])
        assert "CPU thread" not in capsys.readouterr().err and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(previous)


def test_the_graders_workers_get_one_thread_each_unless_told(monkeypatch):
    monkeypatch.delenv("MINIDAPE_THREADS", raising=False)
    env = grade.worker_env()
    assert env["MINIDAPE_THREADS"] == env["OMP_NUM_THREADS"] == "1" and env["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("MINIDAPE_THREADS", "3")
    assert grade.worker_env()["MINIDAPE_THREADS"] == grade.worker_env()["OMP_NUM_THREADS"] == "3"


def test_notebooks_take_the_choice(machine, monkeypatch):
    previous = torch.get_num_threads()
    try:
        monkeypatch.setattr(threads, "WAITS", "short waits")
        assert notebook.start().threads == torch.get_num_threads() == 1  # tiny models: one thread
        assert notebook.start(one_thread=False).threads == torch.get_num_threads() == 8
        monkeypatch.setenv("MINIDAPE_THREADS", "2")
        assert notebook.start().threads == torch.get_num_threads() == 2  # the user's setting wins
    finally:
        torch.set_num_threads(previous)


def test_thread_benchmark_times_every_variant():
    previous = torch.get_num_threads()
    try:
        result = bench.threads_child(dict(variants={"default": None, "1": 1, "all": 2}, warmup=0, repeats=1, seconds=0))
    finally:
        torch.set_num_threads(previous)
    assert set(result) == {"default", "1", "all"}
    assert result["1"]["threads"] == 1 and result["all"]["threads"] == 2 and result["default"]["threads"] >= 1
    assert all(r["seconds"] > 0 for r in result.values())


def test_background_load_stops_by_itself_and_when_left():
    with bench.BackgroundLoad(per_core=1, seconds=60) as load:
        assert load.processes and all(p.poll() is None for p in load.processes)
    assert all(p.poll() is not None for p in load.processes)  # stopped on leaving
    with bench.BackgroundLoad(per_core=1, seconds=0.2) as load:
        deadline = time.monotonic() + 30
        while any(p.poll() is None for p in load.processes) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(p.returncode == 0 for p in load.processes)  # ended on their own


def test_thread_benchmark_rounds_give_the_median_ratio_and_its_range(monkeypatch):
    """Three rounds per row: the table's ratio is the median of the rounds' default / best (here 1.0, 1.2 and
    2.0 idle: 1.20 (1.00–2.00), not met), step times the medians; the goal line follows the median."""
    idle = iter([(10, 10, 12), (12, 10, 20), (40, 20, 30)] * 2)  # (default, 1, all) ms: short, spin alternate
    loaded = iter([(30, 30, 60)] * 6)
    calls = []

    def fake_child(kind, torch_first=False, env=None, **spec):
        calls.append(torch_first)
        default, one, every = next(loaded if load_on else idle)
        return {
            "default": {"threads": 1, "seconds": default / 1e3},
            "1": {"threads": 1, "seconds": one / 1e3},
            "all": {"threads": 2, "seconds": every / 1e3},
        }

    class FakeLoad:
        def __init__(self, seconds):
            pass

        def __enter__(self):
            nonlocal load_on
            load_on = True

        def __exit__(self, *exc):
            pass

    load_on = False
    monkeypatch.setattr(bench, "run_child", fake_child)
    monkeypatch.setattr(bench, "BackgroundLoad", FakeLoad)
    monkeypatch.setattr(bench, "allowed_cores", lambda: 2)
    table = bench.thread_benchmark(repeats=1, rounds=3)
    assert len(calls) == 12
    short_idle = next(line for line in table.splitlines() if line.startswith("| idle | short waits"))
    assert "| 12.0 ms (1) | 10.0 ms | 20.0 ms (2) | 1.20 (1.00–2.00) |" in short_idle
    assert table.splitlines()[-1].endswith("idle: 1.20× (not met); loaded: 1.00× (met)")


@pytest.fixture
def api_state(machine, monkeypatch):
    """No command has chosen in this process, torch's count is its own (as minidape found it when its import loaded
    torch) and nobody set one, and nothing was said yet; the count the test leaves is put back."""
    previous = torch.get_num_threads()
    threads.watch_torch()  # here already: conftest imported minidape
    monkeypatch.setattr(threads, "_command_choice", None)
    monkeypatch.setattr(threads, "_api_choice", None)
    monkeypatch.setattr(threads, "_expected_count", previous)
    monkeypatch.setattr(threads, "_set_by_user", False)
    monkeypatch.setattr(threads, "_found_unchecked", False)
    monkeypatch.setattr(threads, "WAITS", "short waits")
    yield machine
    torch.set_num_threads(previous)


def cli_threads(argv: list[str]) -> int:
    """The count the CLI sets for this command line (its choice only: nothing runs)."""
    cli.set_threads(cli.build_parser().parse_args(argv))
    return torch.get_num_threads()


def test_md_train_under_load_takes_the_threads_the_cli_would(api_state, monkeypatch, capsys):
    # 8 cores, 5 kept busy by others; a batch of 8 x 32 x 32 elements, 8 threads' work at 1,024 a thread (a
    # tiny model stands in for a large one): the CLI takes 3
    api_state["load"] = 5.0
    monkeypatch.setattr(threads, "WORK_PER_THREAD", 2**10)
    size = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32", "--batch-size", "8"]
    expected = cli_threads(["train", *size, "--out", "unused"])
    assert expected == 3
    monkeypatch.setattr(threads, "_command_choice", None)  # the script: no command chose, torch's count its own
    torch.set_num_threads.__wrapped__(threads._expected_count)
    capsys.readouterr()
    seen = []
    cfg = md.GPTConfig(vocab_size=256, n_layer=1, n_head=2, n_embd=32, block_size=32)
    tokens = torch.randint(0, 256, (4000,), generator=torch.Generator().manual_seed(0))

    def record_threads(logits, inputs, targets):
        seen.append(torch.get_num_threads())
        return {}

    md.train(cfg, tokens, steps=2, batch_size=8, metrics=record_threads, progress=False)
    assert seen and set(seen) == {expected}
    said = [line for line in capsys.readouterr().err.splitlines() if "CPU thread" in line]
    assert said == ["minidape: 3 CPU threads (8 cores allowed, 8,192 elements per activation, load 5.0, short waits)"]
    md.train(cfg, tokens, steps=1, batch_size=8, metrics=record_threads, progress=False)
    assert "CPU thread" not in capsys.readouterr().err  # said once
    # evaluation chooses as the CLI's `eval` does: no size of work, the cores the load leaves
    model = md.GPT(cfg)
    model.eval()
    assert cli_threads(["eval", "unused.pt"]) == 3
    monkeypatch.setattr(threads, "_command_choice", None)
    api_state["load"] = 1.0
    md.evaluate.perplexity_by_length(model, tokens, [16], n_windows=2)
    assert torch.get_num_threads() == 7
    assert "minidape: 7 CPU threads (8 cores allowed, load 1.0, short waits)" in capsys.readouterr().err


def test_che_training_and_testing_take_the_threads_the_cli_would(api_state, monkeypatch):
    # 8 cores, 5 kept busy; the CLI's `che` sizes its work as batch x longest training input x n_embd: 8 x 8 x 16
    # elements, 4 threads' work at 256 a thread, of which the load leaves 3; the test inside keeps them
    from minidape.lab import che

    api_state["load"] = 5.0
    monkeypatch.setattr(threads, "WORK_PER_THREAD", 2**8)
    sizes = {"--batch-size": 8, "--max-train-length": 8, "--n-embd": 16}
    expected = cli_threads(["che", "--task", "parity_check", *(str(v) for item in sizes.items() for v in item)])
    assert expected == 3
    monkeypatch.setattr(threads, "_command_choice", None)
    torch.set_num_threads.__wrapped__(threads._expected_count)
    seen = []
    evaluate_task = che.evaluate_task
    monkeypatch.setattr(
        che, "evaluate_task", lambda *a, **k: seen.append(torch.get_num_threads()) or evaluate_task(*a, **k)
    )
    cfg = md.GPTConfig(n_layer=1, n_embd=16, n_head=2, pe="alibi")
    che.train_task(
        "parity_check",
        cfg,
        steps=1,
        batch_size=8,
        max_train_length=8,
        test_lengths=[4, 12],
        eval_samples=2,
        progress=False,
    )
    assert seen == [expected] and torch.get_num_threads() == expected
    api_state["load"] = 1.0  # testing alone chooses as the CLI's `eval`: no size of work
    model = che.train_task(
        "parity_check", cfg, steps=1, batch_size=8, max_train_length=8, test_lengths=[4], eval_samples=2, progress=False
    )[0]
    api_state["load"] = 2.0
    evaluate_task(model, "parity_check", [4], samples=2)
    assert torch.get_num_threads() == 6


def test_the_api_leaves_a_count_the_user_or_a_command_set(api_state, monkeypatch, capsys):
    api_state["load"] = 0.0
    assert threads.choose_for_api().threads == torch.get_num_threads() == 8  # torch's own count: chosen
    torch.set_num_threads(8)  # the user's torch.set_num_threads, even to the count minidape chose: the user's
    api_state["load"] = 6.0  # minidape alone would take 2 now
    assert threads.choose_for_api() is None and torch.get_num_threads() == 8
    assert capsys.readouterr().err == "minidape: 8 CPU threads (8 cores allowed, load 0.0, short waits)\n"
    monkeypatch.setattr(threads, "_set_by_user", False)  # a new script
    md.kernels.smallest_eigenvalue(torch.eye(3))  # minidape's own one-thread section is not the user's
    monkeypatch.setenv("MINIDAPE_THREADS", "2")  # the user's variable: taken, and said
    assert threads.choose_for_api().threads == torch.get_num_threads() == 2
    assert capsys.readouterr().err == "minidape: 2 CPU threads (MINIDAPE_THREADS=2)\n"
    monkeypatch.delenv("MINIDAPE_THREADS")
    assert threads.choose_for_api().threads == 2  # minidape's own last count is not the user's: chosen again
    torch.set_num_threads.__wrapped__(5)  # set where the watch cannot see (a name bound before it): the user's
    assert threads.choose_for_api() is None and torch.get_num_threads() == 5
    monkeypatch.setattr(threads, "_set_by_user", False)
    monkeypatch.setattr(threads, "_expected_count", 5)
    threads.use_threads(1)  # a CLI command's choice (--threads 1): the functions it calls keep it
    assert threads.choose_for_api() is None and torch.get_num_threads() == 1


def test_a_count_found_on_a_torch_loaded_first_is_checked_once_against_a_fresh_one(api_state, monkeypatch):
    asked = []
    monkeypatch.setattr(threads, "start_count", lambda: asked.append(1) or 4)
    monkeypatch.setattr(threads, "_found_unchecked", True)  # torch was imported before minidape
    torch.set_num_threads.__wrapped__(4)
    monkeypatch.setattr(threads, "_expected_count", 4)  # minidape found 4, a fresh torch's count: torch's own
    assert threads.choose_for_api().threads == 8 and threads.choose_for_api().threads == 8 and asked == [1]
    monkeypatch.setattr(threads, "_found_unchecked", True)
    monkeypatch.setattr(threads, "_expected_count", 8)  # found 8 where a fresh torch starts with 4: the user's
    assert threads.choose_for_api() is None and torch.get_num_threads() == 8
    monkeypatch.setattr(threads, "_set_by_user", False)
    monkeypatch.setattr(threads, "_found_unchecked", True)
    monkeypatch.setattr(threads, "start_count", lambda: None)  # a fresh torch cannot be asked: left alone
    assert threads.choose_for_api() is None


def test_a_script_that_sets_torchs_count_before_importing_minidape_keeps_it():
    """A real script, torch imported and its count set before minidape: md.train keeps the count on an idle
    machine of 8 cores, where it would take 8 (the count minidape finds differs from a fresh torch's, asked of a
    new Python); before, the count found was taken for torch's own and replaced."""
    script = """
import os, sys, torch
users = 3 if torch.get_num_threads() != 3 else 5
torch.set_num_threads(users)
import minidape as md
from minidape import threads
threads.allowed_cores, threads.machine_load, threads.WORK_PER_THREAD = (lambda: 8), (lambda: 0.0), 2**10
cfg = md.GPTConfig(vocab_size=256, n_layer=1, n_head=2, n_embd=32, block_size=32)
seen = set()
md.train(cfg, torch.randint(0, 256, (4000,)), steps=1, batch_size=8, progress=False,
         metrics=lambda *_: seen.add(torch.get_num_threads()) or {})
print(users, *seen)
"""
    env = {key: value for key, value in os.environ.items() if key not in NO_SETTING}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    users, *seen = done.stdout.split()
    assert seen == [users] and "CPU thread" not in done.stderr


def test_functions_inside_an_api_function_keep_its_choice(api_state, monkeypatch):
    # the study's functions choose as the CLI's reproduce does (no size of work); the train calls inside keep it
    api_state["load"] = 2.0

    def train():  # as md.train: it chooses from its work, unless called inside an API function
        return threads.choose_for_api(work=10**9)

    @threads.api_entry
    def study():
        api_state["load"] = 0.0
        return train(), torch.get_num_threads()

    assert study() == (None, 6)
    assert train().threads == 8
