"""What one submission may use, as a whole: a cgroup per submission where the machine has one (memory, CPU time
share and processes of all its workers together), else per-process limits whose sum is bounded; and the caps on
what the grader keeps of a notebook's outputs."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from .confine import WARNINGS

# Per submission (the cgroup) and per process (rlimits). Memory per process is address space (torch alone reserves
# about 0.7 GB of it); processes count threads too. "files" bounds the files of the scratch file system.
LIMITS = {
    "memory_bytes": 6 << 30,
    "processes": 256,
    "open_files": 256,
    "file_bytes": 64 << 20,
    "scratch_bytes": 256 << 20,
    "files": 4096,
    "cpus": 1,
}
# Without a cgroup, at the levels with a user id per worker (rlimit processes count per user): the two workers of
# a submission hold at most 2 x 32 processes of 6 GB address space each.
FALLBACK_PROCESSES = 32
MAX_CELL_OUTPUT = 1_000_000  # characters of a cell's outputs the grader keeps, all kinds together
MAX_NOTEBOOK_OUTPUT = 8_000_000  # ... and of a notebook's
CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "cpu", "pids")


def warnings(level: str, cgroups: str | None) -> list[str]:
    """What this machine's isolation level and the lack of cgroups leave open, in words, for the grader to print."""
    found = [WARNINGS[level]] if level in WARNINGS else []
    if cgroups is None:
        bound = (
            f"at most 2 workers x {FALLBACK_PROCESSES} processes of {LIMITS['memory_bytes'] >> 30} GB address "
            f"space each"
            if level in ("root", "uid")
            else f"{LIMITS['processes']} processes per worker counted "
            f"against your own user, each of {LIMITS['memory_bytes'] >> 30} GB address space"
        )
        found.append(
            f"no cgroup per submission (it needs root and cgroup v1 memory, cpu and pids hierarchies or "
            f"v2 with those controllers): each submission is bounded per process only ({bound}), and its "
            f"processes share the CPU with the submissions graded beside it, so a CPU-hungry one can slow "
            f"them towards --timeout"
        )
    return found


def cgroup_version(root: Path = CGROUP_ROOT) -> str | None:
    """``"v2"``, ``"v1"`` (memory, cpu and pids hierarchies) or None: what :class:`Box` can use here (root only)."""
    if os.geteuid() != 0:
        return None
    if (root / "cgroup.controllers").is_file():
        found = set((root / "cgroup.controllers").read_text().split())
        version = "v2" if set(CONTROLLERS) <= found else None
    else:
        version = "v1" if all((root / c / "cgroup.procs").is_file() for c in CONTROLLERS) else None
    if version is None:
        return None
    try:  # permitted here? (a read-only /sys in a container is not)
        Box(version, f"probe-{os.getpid()}", root).close()
    except OSError:
        return None
    return version


class Box:
    """One submission's cgroup: its workers join it before they run anything of the student's (the grader
    passes :attr:`procs`); :meth:`close` ends whatever is left in it and removes it."""

    def __init__(self, version: str, name: str, root: Path = CGROUP_ROOT):
        self.version = version
        if version == "v2":
            (root / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in CONTROLLERS))
            self.folders = [root / f"minidape-{name}"]
        else:
            self.folders = [root / controller / f"minidape-{name}" for controller in CONTROLLERS]
        for folder in self.folders:
            folder.mkdir(exist_ok=True)
        memory, cpus, processes = LIMITS["memory_bytes"], LIMITS["cpus"], LIMITS["processes"]
        if version == "v2":
            self._write("memory.max", memory)
            self._write("memory.swap.max", 0, optional=True)
            self._write("cpu.max", f"{cpus * 100_000} 100000")
            self._write("pids.max", processes)
        else:
            self._write("memory.limit_in_bytes", memory)
            self._write("memory.memsw.limit_in_bytes", memory, optional=True)
            self._write("cpu.cfs_period_us", 100_000)
            self._write("cpu.cfs_quota_us", cpus * 100_000)
            self._write("pids.max", processes)

    def _write(self, name: str, value, optional: bool = False) -> None:
        for folder in self.folders:
            if (folder / name).exists():
                (folder / name).write_text(str(value))
                return
        if not optional:
            raise OSError(f"cgroup file {name} is missing")

    def _read(self, name: str) -> str:
        return next((folder / name).read_text() for folder in self.folders if (folder / name).exists())

    @property
    def procs(self) -> list[str]:
        return [str(folder / "cgroup.procs") for folder in self.folders]

    def pids(self) -> set[int]:
        found = set()
        for folder in self.folders:
            try:
                found |= {int(p) for p in (folder / "cgroup.procs").read_text().split()}
            except OSError:
                pass
        return found

    def close(self) -> None:
        for _ in range(200):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.01)
        for folder in self.folders:
            for _ in range(100):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # the last processes are still being torn down
                    time.sleep(0.02)


def cap_outputs(outputs: list[dict], room: int) -> tuple[list[dict], int]:
    """A cell's outputs as the grader keeps them: every kind of output (streams, every mime type of display data,
    tracebacks) counts towards :data:`MAX_CELL_OUTPUT` for the cell and ``room`` for the rest of the notebook;
    what does not fit is replaced by one line saying so. Returns the outputs kept and the room left."""
    kept, cell_room, dropped = [], min(MAX_CELL_OUTPUT, room), 0
    for output in outputs:
        size = _size(output)
        if size <= cell_room:
            kept.append(output)
            cell_room, room = cell_room - size, room - size
        elif output.get("output_type") == "stream" and cell_room > 0:
            text = output["text"][:cell_room]
            kept.append({**output, "text": text})
            cell_room, room, dropped = cell_room - len(text), room - len(text), dropped + size - len(text)
        else:
            dropped += size
    if dropped:
        kept.append(
            {
                "output_type": "stream",
                "name": "stderr",
                "text": f"\n[grader: {dropped} characters of "
                f"output left out; the grader keeps {MAX_CELL_OUTPUT} per cell and {MAX_NOTEBOOK_OUTPUT} per "
                f"notebook]\n",
            }
        )
    return kept, room


def _size(output) -> int:
    if isinstance(output, str):
        return len(output)
    if isinstance(output, dict):
        return sum(_size(value) for value in output.values())
    if isinstance(output, list):
        return sum(_size(value) for value in output)
    return 8
