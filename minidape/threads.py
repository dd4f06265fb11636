"""How many CPU threads torch uses: as many as the machine can give this process now, no more.

torch's default is one intra-op thread per core, and GNU OpenMP (the thread pool of the Linux CPU wheels) lets
idle threads spin 300,000 times before they sleep. On a shared machine (a JupyterHub with a class on it, a laptop
with a browser, CI) those threads spin against the other processes and wait on each other: training steps
measured 5-8x slower than on one thread. So minidape
  - bounds the spin (``short_waits``, when the package is imported): GNU OpenMP's idle threads spin
    ``SPIN_COUNT`` = 1,000 times (microseconds) and then sleep (``GOMP_SPINCOUNT``); LLVM's and Intel's
    OpenMP (macOS, some conda builds) sleep at once (``KMP_BLOCKTIME=0``). Measured on the demo model
    (benchmarks/RESULTS.md): as fast as unbounded spinning on an idle machine, 1.5x faster than sleeping at once
    (``OMP_WAIT_POLICY=PASSIVE``), and no slower than sleeping under load, where longer spins collapsed to
    seconds a step. OpenMP reads these once, when torch loads: they apply where minidape is imported before
    torch (every command, ``python -m minidape``); a wait setting the user made is left alone;
  - chooses the thread count (``choose_threads``) from the cores this process may use (affinity, cgroup quota),
    the size of the work, and how busy the cores are right now (the tasks running, not the load average: that
    counts loads which already ended): the cores other processes leave free, at least one;
  - lets an explicit choice win: ``--threads N`` on every command, else ``MINIDAPE_THREADS``, else
    ``OMP_NUM_THREADS``;
  - makes the same choice in the Python API (``choose_for_api``: ``md.train``, ``md.evaluate``'s and ``md.che``'s
    functions, the study's), so a script or notebook gets what the CLI would, unless the user set a count: the
    variables above, or ``torch.set_num_threads`` (``count_is_users``). The rule: from the moment minidape finds torch
    loaded, every call of ``torch.set_num_threads`` from outside minidape's modules is the user's, whatever the
    count (minidape wraps the function to see them); a count set before that (torch imported and set first) is
    the user's when it differs from the one a fresh torch starts with here (asked once of a new Python: a torch
    import). Only a count set to torch's own start count before minidape was imported cannot be told from it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import sys
import time
from pathlib import Path

THREADS_VARIABLE = "MINIDAPE_THREADS"
# A thread gets at least this many elements of one activation (batch x T x n_embd): below that the work is
# split too thin to gain from another thread (the notebooks' models run on one).
WORK_PER_THREAD = 2**15


# GNU OpenMP's spins before an idle thread sleeps: a few microseconds, enough to catch the next parallel region of
# a training step, too short to take a core from another process (benchmarks/bench_wait_policy.py)
SPIN_COUNT = 1000
WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def short_waits() -> str:
    """Bound how long OpenMP's idle threads spin (``SPIN_COUNT``, see the module's doc), if torch is not loaded
    yet and the user has set none of ``WAIT_VARIABLES``. Says how idle threads wait (a value set after torch
    loaded has no effect, and then this sets none)."""
    chosen = [f"{name}={os.environ[name]}" for name in WAIT_VARIABLES if os.environ.get(name)]
    if chosen:
        return "waits as set: " + ", ".join(chosen)
    if "torch" in sys.modules:
        return "idle threads spin: torch was loaded first"
    os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    os.environ["KMP_BLOCKTIME"] = "0"
    return "short waits"


def cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Cores' worth of CPU time the cgroup quota allows (rounded up), or None without a quota: cgroup v2's
    ``cpu.max`` ("max 100000" or "QUOTA PERIOD"), else v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 else max(1, math.ceil(quota / period))
    except (OSError, ValueError):
        return None


def allowed_cores() -> int:
    """Cores this process may run on: its CPU affinity, capped by the cgroup's CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    return max(1, min(cores, limit) if limit else cores)


def running_now(samples: int = 11, interval: float = 0.01) -> float:
    """Tasks running or waiting for a CPU right now, this one excluded: the median of reads of /proc/loadavg's
    ``running/total`` field over a tenth of a second."""
    counts = []
    for i in range(samples):
        try:
            counts.append(int(Path("/proc/loadavg").read_text().split()[3].split("/")[0]) - 1)
        except (OSError, ValueError, IndexError):
            return 0.0
        if i + 1 < samples:
            time.sleep(interval)
    return float(sorted(counts)[len(counts) // 2])


def machine_load() -> float:
    """How many cores other processes keep busy now: the tasks running now. Not the 1-minute load average: it
    lags, counting loads that already ended, this process's own included (a notebook's kernel that trained a
    minute ago, the benchmark's previous run); with it, a default on an idle machine took 1 spinning thread,
    1.74x slower than 2 (benchmarks/RESULTS.md)."""
    return running_now()


@dataclasses.dataclass(frozen=True)
class ThreadChoice:
    threads: int
    reason: str  # where the number came from

    def __str__(self) -> str:
        return f"{self.threads} CPU thread{'s' if self.threads > 1 else ''} ({self.reason})"


def positive_threads(value, source: str) -> int:
    """``value`` as a thread count >= 1, or a ValueError naming ``source`` and the value."""
    try:
        threads = int(str(value).strip())
    except ValueError:
        threads = 0
    if threads < 1:
        raise ValueError(f"{source} must be a positive integer (CPU threads); got {value!r}")
    return threads


def choose_threads(requested: int | None = None, work: int | None = None) -> ThreadChoice:
    """The intra-op thread count: ``requested`` (``--threads``) if given, else ``MINIDAPE_THREADS``, else
    ``OMP_NUM_THREADS``; else the cores allowed minus those other processes keep busy, at least 1, and with
    ``work`` (elements of one activation, batch x T x n_embd) at most one thread per ``WORK_PER_THREAD``."""
    if requested is not None:
        return ThreadChoice(positive_threads(requested, "--threads"), "--threads")
    for variable in (THREADS_VARIABLE, "OMP_NUM_THREADS"):
        if os.environ.get(variable):
            value = os.environ[variable]
            # OpenMP's list of nested levels ("4,2"): torch's threads are its outer level's
            outer = value.split(",")[0] if variable == "OMP_NUM_THREADS" else value
            return ThreadChoice(positive_threads(outer, variable), f"{variable}={value}")
    size = "" if work is None else f", {work:,} elements per activation"
    if work is not None and work < 2 * WORK_PER_THREAD:
        return ThreadChoice(1, "small work" + size)
    cores = allowed_cores()
    most = cores if work is None else min(cores, work // WORK_PER_THREAD)
    # Only as many as the cores other processes leave free: threads that share a core with a busy process wait
    # for it at every parallel region (under the benchmark's load, 2 threads 1.1-1.4x slower than 1)
    load = machine_load()
    free = cores - load * cores / (os.cpu_count() or cores)  # a host-wide load, spread over the host's cores
    reason = f"{cores} core{'s' if cores > 1 else ''} allowed{size}, load {load:.1f}, {WAITS}"
    return ThreadChoice(max(1, min(most, int(free + 0.5))), reason)


def use_threads(requested: int | None = None, work: int | None = None) -> ThreadChoice:
    """``choose_threads`` and set torch's intra-op thread count to it for the rest of the process (the CLI's
    command: the API's functions it runs keep it); the choice (print it: ``str(choice)``)."""
    import torch  # here: short_waits runs before torch loads

    global _command_choice
    choice = choose_threads(requested, work)
    torch.set_num_threads(choice.threads)
    _command_choice = choice
    return choice


_command_choice: ThreadChoice | None = None  # the CLI's choice for this process (``use_threads``)
_api_choice: ThreadChoice | None = None  # the API's last choice, said on stderr when it changes
_api_depth = 0  # API entry points running (``api_entry``): the outermost one chooses
# Whose count torch has (``count_is_users``): the count torch has unless someone else set one (torch's start
# count, then minidape's last), None until minidape watches torch (``watch_torch``); whether a call from outside
# minidape set it; and whether the count found is still to be checked against a fresh torch's (torch was loaded
# before minidape watched it).
_expected_count: int | None = None
_set_by_user = False
_found_unchecked = False


def watch_torch(loaded_here: bool = False) -> None:
    """From the moment minidape finds torch loaded (minidape/__init__.py; at the latest the API's first choice), once:
    note torch's count and wrap ``torch.set_num_threads`` so that a call from outside minidape's modules, whatever
    the count, makes the count the user's. With ``loaded_here`` (minidape's own import just loaded torch) the count
    found is torch's start count; else someone loaded torch first and may have set it already: the first choice
    compares it with a fresh torch's (``start_count``)."""
    global _expected_count, _found_unchecked
    if _expected_count is not None:
        return
    import torch

    _expected_count = torch.get_num_threads()
    _found_unchecked = not loaded_here
    torch.set_num_threads = _watched(torch.set_num_threads)


def _watched(set_num_threads):
    @functools.wraps(set_num_threads)
    def watched_set_num_threads(count):
        global _set_by_user
        set_num_threads(count)
        # minidape's own calls (this module's choices, kernels.py's one-thread sections) are not the user's
        if sys._getframe(1).f_globals.get("__name__", "").partition(".")[0] != __name__.partition(".")[0]:
            _set_by_user = True

    return watched_set_num_threads


def start_count() -> int | None:
    """The count torch starts with in this environment, asked of a fresh Python (a torch import: 1-4 s): what torch's
    count was before anyone set it. None when it cannot be asked."""
    import subprocess

    try:
        answer = subprocess.run(
            [sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        )
        return int(answer.stdout.split()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def count_is_users() -> bool:
    """Whether torch's count is the user's (the API then leaves it): ``torch.set_num_threads`` called from outside
    minidape after minidape watched torch (``watch_torch``), whatever the count; or a count other than the one
    torch had unless someone set it (set where the watch cannot see: a name bound before it, torch._C); or, where
    torch was loaded before minidape watched it, a count other than a fresh torch's when minidape found it (asked
    once; unknown counts as the user's)."""
    import torch

    global _set_by_user, _found_unchecked
    watch_torch()
    if not _set_by_user and torch.get_num_threads() != _expected_count:
        _set_by_user = True
    if not _set_by_user and _found_unchecked:
        _set_by_user = start_count() != _expected_count
    _found_unchecked = False
    return _set_by_user


def choose_for_api(work: int | None = None) -> ThreadChoice | None:
    """The CLI's choice (``choose_threads``) in the Python API, set and said on stderr (once: again only when it
    changes), unless the count is someone else's: a CLI command chose it (the functions it calls keep it), an
    API function running chose it (``api_entry``: ``reproduce`` for the ``train`` calls inside), or the user set
    it (``count_is_users``). ``OMP_NUM_THREADS`` is torch's own setting: honoured, not said. Returns the choice,
    or None where the count was left alone."""
    return None if _api_depth else _choose(work)


def _choose(work: int | None) -> ThreadChoice | None:
    import torch

    global _api_choice, _expected_count
    if _command_choice is not None or count_is_users():
        return None
    choice = choose_threads(None, work)
    torch.set_num_threads(choice.threads)
    _expected_count = choice.threads
    if choice.threads != getattr(_api_choice, "threads", None) and not choice.reason.startswith("OMP_NUM_THREADS"):
        print(f"minidape: {choice}", file=sys.stderr, flush=True)
    _api_choice = choice
    return choice


@contextlib.contextmanager
def api_call(work: int | None = None):
    """Around an API function's work: the outermost such call chooses the threads (``choose_for_api``, with
    ``work`` where the function knows it as the CLI's ``che`` does, else none, as the CLI's ``eval``, ``compare``
    and ``reproduce``); the calls inside it keep them (``md.train`` calls ``choose_for_api`` with its work: it
    chooses only outside them)."""
    global _api_depth
    if not _api_depth:
        _choose(work)
    _api_depth += 1
    try:
        yield
    finally:
        _api_depth -= 1


def api_entry(function):
    """Decorate a function of the API that trains or evaluates: its calls are ``api_call``s without a size of
    work."""

    @functools.wraps(function)
    def entry(*args, **kwargs):
        with api_call():
            return function(*args, **kwargs)

    return entry


# On import: minidape/__init__.py imports this module before anything of the package loads torch.
WAITS = short_waits()
