"""Shared test set-up: one CPU thread, and every test's registrations undone after it."""

import contextlib
import sys

import pytest
import torch

from minidape.model import PE_REGISTRY, REFINER_REGISTRY

USER_MODULES = "minidape_user_"  # how lab.user_code.import_file (and the study's --pe FILE.py:Class) name a user's file


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """The tests run tiny models and small eigenproblems, where OpenMP threads mostly wait on each other: one
    thread is as fast, and stays fast when other jobs share the CPU (there two threads were up to 10x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@contextlib.contextmanager
def registrations_restored():
    """Put the PE and refiner registries back as they were, and forget the users' files imported meanwhile (a
    file imported again must register its names again, as the registrations it made are gone)."""
    saved = [(registry, dict(registry)) for registry in (PE_REGISTRY, REFINER_REGISTRY)]
    modules = {name for name in sys.modules if name.startswith(USER_MODULES)}
    try:
        yield
    finally:
        for registry, entries in saved:
            registry.clear()
            registry.update(entries)
        for name in [name for name in sys.modules if name.startswith(USER_MODULES) and name not in modules]:
            del sys.modules[name]


@pytest.fixture(autouse=True, scope="module")
def module_registrations_undone():
    """What a test module's module-scoped fixtures register lasts for that module's tests, and no longer.
    (pytest sets up module fixtures before function ones, so `registrations_undone` below keeps them.)"""
    with registrations_restored():
        yield


@pytest.fixture(autouse=True)
def registrations_undone():
    """`md.register_pe` / `register_refiner` in a test (its own classes, a user's file, the study's leaky
    refiner) last until the test ends: tests may reuse a name, and none sees another's registrations."""
    with registrations_restored():
        yield


@pytest.fixture
def figures_keep_the_rules(monkeypatch):
    """Every figure the test writes to disk keeps the rules the notebooks' figures keep (lab/figure_rules.py): the
    demo's, the study's and compare's figures are read by the same people. Returns the paths written, so that a test
    can see that its figures were checked at all."""
    from matplotlib.figure import Figure

    from minidape.lab.figure_rules import figure_problems

    save, written = Figure.savefig, []

    def checked(figure, target, *args, **kwargs):
        problems = figure_problems(figure)
        assert not problems, f"the figure written to {target} breaks the figure rules: {problems}"
        written.append(target)
        return save(figure, target, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", checked)
    return written
