"""The grader's side of a worker: starts it confined (see :mod:`minidape.classroom.sandbox`), sends requests, reads
answers under a deadline, and ends it with everything it started."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..exercises import NotDone, StudentError, WorkerGone
from . import confine
from .confine import UID_BASE, UIDS_PER_GRADER, kill_user
from .limits import FALLBACK_PROCESSES, LIMITS, Box
from .protocol import TimeLimit, from_bytes, receive, request_bytes, send


def needed_trees() -> list[str]:
    """The folders a worker reads its code and data from: the Python installation (the interpreter, its prefixes,
    the site-packages folders on sys.path), minidape and its corpora (an editable install maps the package to the
    checkout, outside sys.path). Nothing else of sys.path: the grader's working folder, a test folder or any
    folder a .pth file adds beside them stay out of the view (the checkout's root above all: the package and the
    corpora are bound on their own)."""
    from ...lab import data

    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix)}
    path = [
        folder
        for folder in map(os.path.realpath, filter(None, sys.path))
        if any(Path(folder).is_relative_to(prefix) for prefix in prefixes)
        or Path(folder).name in ("site-packages", "dist-packages")
    ]
    return sorted(
        {
            os.path.realpath(p)
            for p in (*prefixes, os.path.dirname(sys.executable), *path, str(PACKAGE), str(data.DATA_DIR))
            if p and os.path.isdir(p)
        }
    )


PACKAGE = Path(__file__).resolve().parents[2]


class Worker:
    """One sandboxed worker process (see the package doc); a context manager. ``censored``: the package copy
    (:func:`censor.censored_copy`) it sees instead of minidape (the grader always gives one; without, the real
    package is in its view); ``box``: the submission's cgroup, which it joins (whoever made it removes it)."""

    def __init__(
        self,
        level: str,
        slot: int,
        env: dict[str, str],
        cpu_seconds: int = 3600,
        censored: Path | None = None,
        box: Box | None = None,
    ):
        self.level, self.box = level, box
        self.uid = UID_BASE + (os.getpid() % 1_000_000) * UIDS_PER_GRADER + slot
        requests_r, self._requests = os.pipe()
        self._answers, answers_w = os.pipe()
        command = [sys.executable, "-I", confine.__file__, str(requests_r), str(answers_w)]
        self.scratch = None
        if level in ("uid", "none"):  # no tmpfs of its own: a folder only its user may enter
            self.scratch = tempfile.mkdtemp(prefix="minidape-worker-")
            if level == "uid":
                os.chown(self.scratch, self.uid, self.uid)
        if level in ("root", "userns"):
            command = [
                "unshare",
                *(["--user", "--map-root-user"] if level == "userns" else []),
                "--mount",
                "--pid",
                "--net",
                "--ipc",
                "--fork",
                "--kill-child",
                "--mount-proc",
                *command,
            ]
        if censored is not None and level in ("uid", "none"):  # no mount namespace: first on its path
            env = {**env, "PYTHONPATH": os.pathsep.join([str(censored.parent), env.get("PYTHONPATH", "")])}
        self.process = subprocess.Popen(
            command,
            pass_fds=(requests_r, answers_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env={"PATH": env.get("PATH", "/usr/bin:/bin")},
        )
        os.close(requests_r)
        os.close(answers_w)
        # The set-up travels through the pipe, not the command line that `ps` shows to everyone.
        limits = {**LIMITS, "cpu_seconds": int(cpu_seconds)}
        if box is None and level in ("root", "uid"):
            limits["processes"] = FALLBACK_PROCESSES
        setup = {
            "level": level,
            "uid": self.uid,
            "limits": limits,
            "scratch": self.scratch,
            "env": env,
            "needed": needed_trees(),
            "package": str(PACKAGE),
            "package_copy": str(censored if censored is not None else PACKAGE),
            "cgroups": box.procs if box is not None else [],
        }
        os.write(self._requests, json.dumps(setup).encode() + b"\n")
        os.set_blocking(self._requests, False)
        self.alive = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def wait_ready(self, timeout: float) -> None:
        try:
            self.unpack(self.read(timeout))
        except (WorkerGone, StudentError) as gone:
            self.close()
            raise WorkerGone(f"did not start ({gone})") from None

    def request(self, op: str, *args, timeout: float):
        """Send one request and wait for its answer: data, handles decoded; raises what the worker reports."""
        deadline = time.monotonic() + timeout
        try:
            self.send_only(op, *args, deadline=deadline)
            answer = self.read(max(0.0, deadline - time.monotonic()))
        except TimeLimit:
            self.close()
            raise
        return self.unpack(answer)

    def unpack(self, answer):
        """An answer's value; what the worker reports as an error is raised here."""
        if not isinstance(answer, dict) or "error" not in answer or "value" not in answer:
            self.close()
            raise WorkerGone("broke the protocol")
        if answer["error"] is not None:
            if not (isinstance(answer["error"], (tuple, list)) and len(answer["error"]) == 2):
                self.close()
                raise WorkerGone("broke the protocol")
            kind, message = (str(part) for part in answer["error"])
            raise (NotDone if kind == "NotImplementedError" else StudentError)(message)
        return answer["value"]

    def send_only(self, op: str, *args, deadline: float) -> None:
        """Send a request whose answer :meth:`read` collects (a cell, which may need an interrupt)."""
        if not self.alive:
            raise WorkerGone("ended earlier")
        try:
            payload = request_bytes(op, *args)
        except (pickle.PicklingError, TypeError, AttributeError) as error:
            raise TypeError(f"the grader could not send {op}'s arguments to the worker: {error}") from None
        try:
            send(self._requests, payload, deadline)
        except TimeLimit:
            self.close()
            raise
        except OSError:
            self.close()
            raise WorkerGone("ended") from None

    def interrupt(self) -> None:
        """SIGINT to the worker itself (a KeyboardInterrupt in the cell it runs)."""
        pid = self.process.pid
        if self.level in ("root", "userns"):  # the worker is unshare's child
            try:
                with open(f"/proc/{pid}/task/{pid}/children") as children:
                    pid = int(children.read().split()[0])
            except (OSError, ValueError, IndexError):
                return
        try:
            os.kill(pid, signal.SIGINT)
        except OSError:
            pass

    def read(self, timeout: float):
        """The next answer. On :class:`TimeLimit` the worker keeps running; on any other failure it is closed."""
        try:
            return from_bytes(receive(self._answers, time.monotonic() + timeout))
        except TimeLimit:
            raise
        except WorkerGone:
            self.close()
            raise

    def close(self) -> None:
        """End the worker and everything it started; idempotent."""
        if not self.alive:
            return
        self.alive = False
        for fd in (self._requests, self._answers):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except OSError:
            pass
        self.process.kill()
        self.process.wait()
        if self.level in ("root", "uid"):
            kill_user(self.uid)
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
