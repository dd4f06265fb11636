"""The set-up the notebooks share (minidape/classroom/notebook.py) and the quick mode it reads from the environment."""

import pytest
import torch

from minidape import grade, notebook
from minidape.utils import quick_mode


@pytest.mark.parametrize("variable", ["MINIDAPE_QUICK", "MINIDAPE_FAST"])
@pytest.mark.parametrize("value", ["1", " 1 "])  # other values are refused (test_nothing_silently_wrong)
def test_either_name_switches_quick_mode_on(variable, value, monkeypatch):
    monkeypatch.delenv("MINIDAPE_QUICK", raising=False)
    monkeypatch.delenv("MINIDAPE_FAST", raising=False)
    assert not quick_mode()
    monkeypatch.setenv(variable, value)
    assert quick_mode() and notebook.start(one_thread=False).quick


def test_nothing_else_switches_quick_mode_on(monkeypatch):
    monkeypatch.delenv("MINIDAPE_QUICK", raising=False)
    monkeypatch.delenv("MINIDAPE_FAST", raising=False)
    for variable, value in [
        ("MINIDAPE_QUICK", "0"),
        ("MINIDAPE_QUICK", ""),
        ("MINIDAPE_FAST", "0"),
        ("MINIDAPE_FASTER", "1"),
        ("QUICK", "1"),
        ("FAST", "1"),
        ("MINIDAPE_EXPECT_GPU", "1"),
    ]:
        monkeypatch.setenv(variable, value)
    assert not quick_mode() and not notebook.start(one_thread=False).quick


@pytest.mark.parametrize("variable", ["MINIDAPE_QUICK", "MINIDAPE_FAST", None])
def test_the_graders_workers_run_in_the_graders_mode_under_one_name(variable, monkeypatch):
    monkeypatch.delenv("MINIDAPE_QUICK", raising=False)
    monkeypatch.delenv("MINIDAPE_FAST", raising=False)
    if variable:
        monkeypatch.setenv(variable, "1")
    env = grade.worker_env()
    assert "MINIDAPE_FAST" not in env and env.get("MINIDAPE_QUICK") == ("1" if variable else None)


@pytest.mark.parametrize("cuda, mps, expected", [(True, True, "cuda"), (False, True, "mps"), (False, False, "cpu")])
def test_the_device_is_cuda_then_mps_then_cpu(cuda, mps, expected, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    assert notebook.device() == expected


def test_start_seeds_torch_and_runs_on_one_thread_when_asked(monkeypatch):
    threads = torch.get_num_threads()
    monkeypatch.delenv("MINIDAPE_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # an explicit setting: what start() then uses unless told
    try:
        notebook.start(seed=3, one_thread=False)
        first = torch.rand(4)
        assert torch.get_num_threads() == 2
        monkeypatch.delenv("OMP_NUM_THREADS")
        run = notebook.start(seed=3)
        assert torch.equal(torch.rand(4), first) and torch.get_num_threads() == 1
        notebook.start(seed=4, one_thread=False)
        assert not torch.equal(torch.rand(4), first)
        assert 0 <= run.seconds() < 3600 and str(run) in ("quick mode", "full mode")
    finally:
        torch.set_num_threads(threads)


def test_the_quick_budget_runs_the_same_experiment_smaller():
    quick, full = notebook.books_budget(True), notebook.books_budget(False)
    assert quick.train_length == full.train_length == full.lengths[0] == quick.lengths[0]
    assert full.lengths[-1] == 16 * full.train_length  # the notebooks' "up to 16 x L"
    assert quick.steps < full.steps and quick.batch <= full.batch and set(quick.lengths) < set(full.lengths)
    assert quick.eval_windows < full.eval_windows and quick.val_windows < full.val_windows
    assert str(full) == "steps 400, batch 16, training length 64"
