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
import subprocess
import sys
import time

UID_BASE = 2_000_000_000  # workers' user ids (levels root and uid): far above any real account
UIDS_PER_GRADER = 1024  # a grader's workers use UID_BASE + (its pid % 10⁶) · 1024 + slot


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


WARNINGS = {
    "userns": "not running as root: each submission runs in its own PID, mount, IPC and network namespaces "
    "with resource limits and sees only Python and minidape (read-only), but as your own user mapped to "
    "root in a user namespace. Grade as root (a container, CI) for a user id of its own per submission.",
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
        # the refiners' PyTorch form: no compiler run, no compiled file loaded inside a judged run (native.py)
        "MINIDAPE_NATIVE": "0",
    }
    os.execve(
        sys.executable, [sys.executable, "-m", "minidape.classroom.sandbox.worker", *sys.argv[1:3], *failure], env
    )


def isolate(setup: dict) -> None:
    """Before any student code: join the submission's cgroup, build the file view (root, userns: the allow-list
    ``VIEW_*``), limits, then (root, uid) an unprivileged user id, and a session keyring of its own."""
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
    if setup["level"] == "userns":
        _no_capabilities()
    _new_session_keyring()  # last: the keyring belongs to the user the worker runs as


# The judged run's file view, in one place: what a worker in the root and userns levels sees. It is an allow-list:
# a new root file system holds these and nothing else (the teacher's checkout, its hand-out, executed notebooks,
# other submissions, the grader's outputs and any other file of the machine are not there to be named).
VIEW_SYSTEM = (  # the operating system's programs and libraries the interpreter loads, read-only
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc/alternatives",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
)
VIEW_DEVICES = ("null", "zero", "full", "random", "urandom")  # /dev holds these only
VIEW_SCRATCH = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")  # folders of the submission's own scratch tmpfs
# Beside them: the Python installation (``setup["needed"]``: the interpreter, its libraries, the corpora), read-only,
# and at the package's own path the package copy the grader made for this run (``setup["package_copy"]``).
SYSCALLS = {"x86_64": {"pivot_root": 155, "keyctl": 250}, "aarch64": {"pivot_root": 41, "keyctl": 219}}


def _mount_namespace(setup: dict) -> None:
    """Build the view (see ``VIEW_*``) on a new root file system and make it the worker's root (pivot_root),
    the machine's own root detached: nothing else remains reachable by any path."""
    libc = ctypes.CDLL(None, use_errno=True)

    def mount(source, target, fstype, flags, data=""):
        if libc.mount(source.encode(), target.encode(), fstype.encode(), flags, data.encode()) != 0:
            raise OSError(ctypes.get_errno(), f"mount {target}")

    read_only, nosuid, nodev, noexec, remount, bind, recursive, private = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
    mount("none", "/", "", recursive | private)  # nothing mounted here propagates back to the machine
    package = setup["package"]
    sources = {path: path for path in [*VIEW_SYSTEM, *setup["needed"]] if path != package and os.path.lexists(path)}
    sources[package] = setup["package_copy"]
    trees = sorted(p for p in sources if not any(p.startswith(o + "/") for o in sources if o != package))
    if package not in trees:
        trees.append(package)  # inside a bound tree (a wheel's site-packages): bound over it, last
    held = {path: os.open(sources[path], os.O_PATH) for path in trees if not os.path.islink(sources[path])}
    links = {path: os.readlink(path) for path in trees if os.path.islink(path)}
    root = "/tmp"  # the new root's mount point (its old contents are not part of the view)
    mount("tmpfs", root, "tmpfs", nosuid | nodev, "size=1m,mode=0755")
    os.makedirs(root + "/dev", mode=0o755, exist_ok=True)
    mount("tmpfs", root + "/dev", "tmpfs", nosuid, "size=64k,mode=0755")
    for device in VIEW_DEVICES:
        open(f"{root}/dev/{device}", "w").close()
        mount(f"/dev/{device}", f"{root}/dev/{device}", "", bind)
    # First (so that a tree bound below inside one of them, e.g. a checkout or venv under /tmp, stays on top of
    # it): one scratch file system for the submission (its size and number of files bounded together), and each
    # world-writable folder a folder of it: nothing written there is seen by another submission or stays after.
    owner = setup["uid"] if setup["level"] == "root" else 0
    limits = setup["limits"]
    os.mkdir(root + "/.scratch")
    mount(
        "tmpfs",
        root + "/.scratch",
        "tmpfs",
        nosuid | nodev,
        f"size={limits['scratch_bytes']},nr_inodes={limits['files']},mode=0700,uid={owner},gid={owner}",
    )
    for number, path in enumerate(VIEW_SCRATCH):
        folder = f"{root}/.scratch/{number}"
        os.mkdir(folder, 0o700)
        os.chown(folder, owner, owner)
        os.makedirs(root + path, mode=0o755, exist_ok=True)
        mount(folder, root + path, "", bind)
    libc.umount2((root + "/.scratch").encode(), 2)  # MNT_DETACH: the binds keep the file system
    os.rmdir(root + "/.scratch")
    for path in trees:
        inside = root + path
        os.makedirs(os.path.dirname(inside), mode=0o755, exist_ok=True)
        if path in links:
            os.symlink(links[path], inside)
            continue
        source = f"/proc/self/fd/{held[path]}"
        if os.path.isdir(source):
            os.makedirs(inside, mode=0o755, exist_ok=True)
        else:
            open(inside, "w").close()
        mount(source, inside, "", bind | recursive)
        mount("none", inside, "", remount | bind | read_only | nosuid | nodev)
        os.close(held[path])
    os.mkdir(root + "/proc")
    mount("proc", root + "/proc", "proc", nosuid | nodev | noexec)
    os.chdir(root)
    if libc.syscall(_syscall("pivot_root"), b".", b".") != 0:
        raise OSError(ctypes.get_errno(), "pivot_root")
    if libc.umount2(b".", 2) != 0:  # the machine's root, stacked under the view's: detached
        raise OSError(ctypes.get_errno(), "umount the machine's root")
    os.chdir("/")
    mount("none", "/", "", remount | read_only | nosuid | nodev)  # the view's own folders, read-only too
    os.chdir("/tmp")


def _no_capabilities() -> None:
    """Level userns: the worker is root of its own user namespace, which holds every capability there (it could
    remount its view writable, mount or unshare again). Root's special case locked off (securebits NOROOT) and the
    ambient set cleared, the worker proper this process becomes by execve starts with no capability at all, as
    bubblewrap's unprivileged sandbox does; no_new_privs keeps it so."""
    libc = ctypes.CDLL(None, use_errno=True)
    set_securebits, noroot, noroot_locked, ambient, clear_all, no_new_privs = 28, 1, 2, 47, 4, 38
    for option, value, what in (
        (set_securebits, noroot | noroot_locked, "securebits NOROOT"),
        (ambient, clear_all, "clear the ambient capabilities"),
        (no_new_privs, 1, "no_new_privs"),
    ):
        if libc.prctl(option, value, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), what)


def _syscall(name: str) -> int:
    machine = os.uname().machine
    if machine not in SYSCALLS:
        raise OSError(f"the sandbox knows the system call numbers of {sorted(SYSCALLS)}, not {machine}")
    return SYSCALLS[machine][name]


def _new_session_keyring() -> None:
    """Leave the grader's session keyring (a login session's, holding its keys) for a new, empty one: nothing put
    in a keyring by one worker can be read by another. A kernel or container that refuses keyrings altogether
    (seccomp's default in Docker) offers no such channel."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(_syscall("keyctl"), 1, None) == -1:  # KEYCTL_JOIN_SESSION_KEYRING, anonymous
        errno = ctypes.get_errno()
        if errno not in (1, 38):  # EPERM, ENOSYS: keyrings refused to every process here
            raise OSError(errno, "join a new session keyring")


if __name__ == "__main__":
    boot()
