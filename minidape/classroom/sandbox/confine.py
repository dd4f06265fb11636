"""What confines a worker, and the first program it runs: :func:`boot` isolates the process (namespaces' mounts,
the censored package, a cgroup, limits, a user id of its own), then replaces itself with the worker proper
(``python -m minidape.classroom.sandbox.worker``), so nothing loaded before the isolation (minidape's real
implementation above all) stays in the student's process.

This module imports nothing from minidape: the worker starts it by its file path, before any of minidape is
imported, and the grader uses its level probe and its clean-up.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import time

UID_BASE = 2_000_000_000  # workers' user ids (levels root and uid): far above any real account
UIDS_PER_GRADER = 1024  # a grader's workers use UID_BASE + (its pid % 10⁶) · 1024 + slot
SKIPPED_FILE_SYSTEMS = {
    "proc",
    "sysfs",
    "cgroup",
    "cgroup2",
    "devpts",
    "mqueue",
    "debugfs",
    "tracefs",
    "securityfs",
    "pstore",
    "bpf",
    "configfs",
    "fusectl",
    "binfmt_misc",
    "hugetlbfs",
    "autofs",
    "efivarfs",
    "nsfs",
}


WEAKER = "MINIDAPE_ISOLATION"  # names a weaker level than the machine allows (to test what it holds)


def isolation() -> str:
    """``root``, ``uid``, ``userns`` or ``none``: what a worker can get on this machine (see the package doc), or
    the weaker level that the environment variable ``MINIDAPE_ISOLATION`` names (``uid`` only below ``root``)."""
    level, asked = _detected(), os.environ.get(WEAKER)
    if asked is None:
        return level
    weaker = {"root": ("uid", "none"), "userns": ("none",), "uid": ("none",), "none": ()}[level]
    if asked not in (level, *weaker):
        raise ValueError(f"{WEAKER}={asked!r}: this machine allows {level!r} and the weaker {list(weaker)}")
    return asked


def _detected() -> str:
    unshare = shutil.which("unshare")
    if unshare is None:
        return "uid" if os.geteuid() == 0 else "none"
    probe = [unshare, "--mount", "--pid", "--net", "--ipc", "--fork", "--mount-proc", "true"]
    if os.geteuid() != 0:
        probe[1:1] = ["--user", "--map-root-user"]
    try:
        if (
            subprocess.run(
                probe, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30
            ).returncode
            == 0
        ):
            return "root" if os.geteuid() == 0 else "userns"
    except (OSError, subprocess.TimeoutExpired):
        pass
    return "uid" if os.geteuid() == 0 else "none"


def world_writable() -> list[str]:
    """Every folder that anyone may write to (``/tmp``, ``/run/lock``, ...), found on every mounted disk-like file
    system; folders others may not enter are not searched (a worker cannot reach below them either). In the
    root and userns levels each of them becomes a folder of the submission's own scratch file system."""
    found, mounts = [], {}
    with open("/proc/self/mountinfo") as table:
        for line in table:
            fields = line.split()
            mounts[_unescape(fields[4])] = fields[fields.index("-") + 1]
    pending = ["/"]
    while pending:
        folder = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                if not entry.is_dir(follow_symlinks=False):
                    continue
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError:
                continue
            if mounts[_mount_of(entry.path, mounts)] in SKIPPED_FILE_SYSTEMS:
                continue
            if mode & stat.S_IWOTH:
                found.append(entry.path)
            elif mode & stat.S_IXOTH:
                pending.append(entry.path)
    return sorted(found)


def _mount_of(path: str, mounts) -> str:
    """The mount point a path lies on (the longest mount point above it)."""
    return max((m for m in mounts if m == "/" or path == m or path.startswith(m + "/")), key=len)


def _unescape(path: str) -> str:
    return path.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


WARNINGS = {
    "userns": "not running as root: each submission runs in its own PID, mount and network namespaces with "
    "resource limits, but as your own user, so files your user can write outside the hidden folders "
    "(submissions, teacher's edition, the world-writable folders) are writable by the submissions. Grade "
    "as root (a container, CI) for a user id of its own per submission.",
    "uid": "namespaces are not permitted here (a container without CAP_SYS_ADMIN?): each submission runs as a "
    "user id of its own with resource limits, but it can read world-readable files (other submissions, "
    "the teacher's edition, minidape's own implementation if their permissions allow), see other "
    "processes and use the network; the library ban holds only against answers that import minidape.",
    "none": "no namespaces available (util-linux unshare missing or not permitted): submissions run as your "
    "own user with resource limits only; they can read and write your files, see other processes "
    "and signal the grader; the library ban holds only against answers that import minidape. Grade as "
    "root on Linux for isolation.",
}


def kill_user(uid: int) -> None:
    """End every process of ``uid`` (root only): a child that becomes ``uid`` and signals all it may."""
    for _ in range(100):
        if not processes_of(uid):
            return
        pid = os.fork()
        if pid == 0:
            try:
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
                os.kill(-1, signal.SIGKILL)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        time.sleep(0.01)
    raise RuntimeError(f"processes of user id {uid} survive SIGKILL")


def processes_of(uid: int) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat(follow_symlinks=False).st_uid == uid:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


# ----------------------------------------------------------------------------------- the worker's side


def boot() -> None:
    """The worker's first program (``sys.argv``: the request and answer pipes): read the set-up (one JSON line),
    isolate, then become the worker proper. A failure before the student's code is the grader's problem: the
    worker proper reports it in words."""
    requests = int(sys.argv[1])
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(requests, 1)
        if not chunk:
            os._exit(1)
        line += chunk
    setup, failure = json.loads(line), []
    try:
        isolate(setup)
    except BaseException as error:
        failure = [f"{type(error).__name__}: {error}"[:2000]]
    env = {
        **setup["env"],
        "HOME": os.getcwd(),
        "MPLCONFIGDIR": os.path.join(os.getcwd(), ".matplotlib"),
        "MPLBACKEND": "Agg",
    }
    os.execve(
        sys.executable, [sys.executable, "-m", "minidape.classroom.sandbox.worker", *sys.argv[1:3], *failure], env
    )


def isolate(setup: dict) -> None:
    """Before any student code: join the submission's cgroup, hide folders, put the censored package in place,
    scratch space, limits, then (root) an unprivileged user id."""
    for procs in setup["cgroups"]:
        with open(procs, "w") as file:
            file.write(str(os.getpid()))
    if setup["scratch"]:
        os.chdir(setup["scratch"])
    if setup["level"] in ("root", "userns"):
        _mount_namespace(setup)
    limits = setup["limits"]
    for name, value in (
        (resource.RLIMIT_CPU, limits["cpu_seconds"]),
        (resource.RLIMIT_AS, limits["memory_bytes"]),
        (resource.RLIMIT_NPROC, limits["processes"]),
        (resource.RLIMIT_NOFILE, limits["open_files"]),
        (resource.RLIMIT_FSIZE, limits["file_bytes"]),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(name, (value, value))
    if setup["level"] in ("root", "uid"):
        uid = setup["uid"]
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        ctypes.CDLL(None).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: no setuid programs either


def _mount_namespace(setup: dict) -> None:
    libc = ctypes.CDLL(None, use_errno=True)

    def mount(source, target, fstype, flags, data=""):
        if libc.mount(source.encode(), target.encode(), fstype.encode(), flags, data.encode()) != 0:
            raise OSError(ctypes.get_errno(), f"mount {target}")

    read_only, nosuid, nodev, bind, recursive = 1, 2, 4, 4096, 16384
    if setup["censored"]:  # first: every later bind of the package's folder carries the censored copy
        mount(setup["censored"], setup["package"], "", bind)
    # Python, minidape and its corpora may lie in a folder that the scratch file systems below cover (a clone or a
    # venv under /tmp): hold them open now and bind them back at their own paths afterwards. The outermost of them
    # are bound, each whole: the fresh interpreter the worker restarts as finds its venv by the venv's own
    # pyvenv.cfg, beside bin/ and lib/ (binding only those two left a worker under /tmp without torch). A folder
    # above them (a checkout made by `mktemp -d`) may be closed to others: the fresh tmpfs recreates it at 0755.
    needed, writable = set(setup["needed"]), setup["writable"]
    covered = {path for path in needed if any(path == top or path.startswith(top + "/") for top in writable)}
    held = {
        path: os.open(path, os.O_PATH) for path in covered if not any(path.startswith(other + "/") for other in covered)
    }
    mount("tmpfs", "/tmp", "tmpfs", nosuid | nodev, "size=1m,mode=0700")  # staging, root's only
    if setup["level"] == "root":
        _expose_python(needed - covered, mount, libc, bind | recursive)
    # One scratch file system for the submission (its size and number of files bounded together), and each
    # world-writable folder a folder of it: nothing written there is seen by another submission or stays after.
    owner = setup["uid"] if setup["level"] == "root" else 0
    limits = setup["limits"]
    os.mkdir("/tmp/scratch")
    mount(
        "tmpfs",
        "/tmp/scratch",
        "tmpfs",
        nosuid | nodev,
        f"size={limits['scratch_bytes']},nr_inodes={limits['files']},mode=0700,uid={owner},gid={owner}",
    )
    scratch = os.open("/tmp/scratch", os.O_PATH)  # /tmp itself is one of the folders bound over below
    for number, path in enumerate(["/tmp", *(p for p in writable if p != "/tmp")]):
        if os.path.isdir(path) and not os.path.islink(path):
            os.mkdir(f"/proc/self/fd/{scratch}/{number}", 0o700)
            os.chown(f"/proc/self/fd/{scratch}/{number}", owner, owner)
            mount(f"/proc/self/fd/{scratch}/{number}", path, "", bind)
    os.close(scratch)
    for path, handle in held.items():  # in the fresh tmpfs: its folders above path are 0755
        os.makedirs(path, mode=0o755, exist_ok=True)
        mount(f"/proc/self/fd/{handle}", path, "", bind | recursive)
        os.close(handle)
    for path in setup["hide"]:  # last: a tree bound back above may hold some of them
        if os.path.isdir(path):
            mount("tmpfs", path, "tmpfs", read_only | nosuid | nodev, "size=4k,mode=0555")
        elif os.path.exists(path):
            mount("/dev/null", path, "", bind)
    os.chdir("/tmp")


def _expose_python(trees: set[str], mount, libc, rbind: int) -> None:
    """Make the interpreter, its libraries and minidape reachable for the unprivileged user when they lie
    under a folder others may not enter (e.g. /root/.pyenv): an empty tmpfs over the top-most such folder,
    with only the needed trees bound back in at their own paths (so sys.path stays valid)."""
    blocked: dict[str, list[str]] = {}
    for path in sorted(trees):
        ancestors = [a for a in _ancestors(path) if not os.stat(a).st_mode & 0o001]
        if ancestors:
            blocked.setdefault(ancestors[0], []).append(path)
    for number, (top, paths) in enumerate(blocked.items()):
        staging = f"/tmp/{number}"
        os.mkdir(staging)
        mount(top, staging, "", rbind)
        mount("tmpfs", top, "tmpfs", 0, "size=4k,mode=0755")
        for path in paths:
            inside = os.path.join(top, os.path.relpath(path, top))
            os.makedirs(inside, mode=0o755, exist_ok=True)
            mount(os.path.join(staging, os.path.relpath(path, top)), inside, "", rbind)
        libc.umount2(staging.encode(), 2)  # MNT_DETACH


def _ancestors(path: str) -> list[str]:
    """The folders above ``path``, from / down (``path`` itself excluded)."""
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[:i]) for i in range(len(parts) + 1)]


if __name__ == "__main__":
    boot()
