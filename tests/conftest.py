"""Shared test set-up."""
import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """The tests run tiny models and small eigenproblems, where OpenMP threads mostly wait on each other: one
    thread is as fast, and stays fast when other jobs share the CPU (there two threads were up to 10x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
