"""What a graded run can see and reach (issue 47): its file view is an allow-list, its package copy holds no
checks and (in a judged run) only what its notebook declares, and no channel of the kernel joins two workers.

Each test starts workers the way the grader does (``grade.Grader.start``: a first run's package copy, or a judged
run's) and runs a cell in them as a submission would; a few seconds each (a worker imports torch).
"""

import ctypes
import json
import os
import shutil
import textwrap
import time
from pathlib import Path

import pytest

from minidape import exercises, grade
from minidape.classroom import sandbox
from minidape.classroom.sandbox import confine

ROOT = Path(__file__).resolve().parents[1]
LEVEL = sandbox.isolation()
VIEW_LEVELS = pytest.mark.skipif(LEVEL not in ("root", "userns"), reason="a file view of its own needs namespaces")
TOKEN = f"minidape-token-{os.getpid()}"


@pytest.fixture(scope="module")
def grader():
    made = grade.Grader(grade.editions(), LEVEL, grade.worker_env(), timeout=60)
    yield made
    for copy in made.censored.values():
        shutil.rmtree(copy.parent, ignore_errors=True)


@pytest.fixture(scope="module")
def first_run(grader):
    """A worker of a notebook's first run, as the grader starts it (one for the tests that only look around)."""
    worker = grader.start(0)
    try:
        worker.wait_ready(grade.START_TIMEOUT)
        yield worker
    finally:
        grader.stop(worker)


def run(worker, source: str) -> str:
    """What a cell printed in ``worker`` (its error's name and text appended)."""
    outputs = worker.request("run", 0, textwrap.dedent(source), timeout=60)
    return "".join(o.get("text", "") or f"{o.get('ename')}: {o.get('evalue')}\n" for o in outputs)


@VIEW_LEVELS
def test_a_submission_reaches_nothing_of_the_checkout_but_the_package_copy(first_run):
    """A teacher's notebook, a hand-out wheel and an executed .nbtest copy lie in and beside a checkout in an
    ordinary folder: a submission sees none of them, nor the checkout's notebooks or tests. (Under /tmp too, where
    CI may clone: the view binds the venv and the package copy over the submission's scratch /tmp, nothing else.)"""
    planted = [
        ROOT / "handout" / f"{TOKEN}.whl",
        ROOT / ".nbtest" / f"02_{TOKEN}.ipynb",
        ROOT.parent / f"{TOKEN}-teacher" / "02_kerple_cpd_kernels.ipynb",
    ]
    made = [p.parent for p in planted if not p.parent.exists()]
    for path in planted:
        path.parent.mkdir(exist_ok=True)
        path.write_text("the teacher's")
    try:
        printed = run(
            first_run,
            f"""
            import json, os, minidape
            found = [p for p in {[str(p) for p in planted]!r} + {[str(ROOT / "notebooks"), str(ROOT / "tests")]!r}
                     if os.path.exists(p)]
            top = os.path.dirname(os.path.dirname(minidape.__file__))
            print(json.dumps([found, sorted(os.listdir(top)), sorted(os.listdir(os.path.dirname(top)))]))
            """,
        )
    finally:
        for path in planted:
            path.unlink()
        for folder in made:
            shutil.rmtree(folder)
    found, checkout, beside = json.loads(printed)
    assert found == []
    assert set(checkout) <= {"minidape", "data", ".venv", "venv"}  # the package copy, corpora, the interpreter
    if str(ROOT.parent) in confine.VIEW_SCRATCH:  # a checkout in /tmp: its neighbours are the submission's scratch,
        beside = [name for name in beside if name not in (".cache", ".matplotlib")]  # where the run writes these
    assert beside == [ROOT.name]


def test_no_check_reference_or_hint_is_in_a_graded_run(first_run):
    """In a graded run ``exercises.check`` only records: the checks' modules, their reference helpers (FoX's
    cumulative gates), references and hints are not in the package copy at all."""
    printed = run(
        first_run,
        """
            import importlib, pkgutil
            from minidape import exercises
            import minidape.classroom as classroom
            found = sorted(m.name for m in pkgutil.walk_packages(classroom.__path__, "minidape.classroom."))
            exercises.ask = None  # no grader here to ask for a verdict
            exercises.check("fox_bias", lambda x: x)
            print(found, hasattr(exercises, "EXERCISES"), hasattr(exercises, "LIBRARY"), list(exercises.answers))
            for name in ("minidape.classroom.exercises.positions_that_read_the_data", "minidape.classroom.grade",
                         "minidape.classroom.exercises.helpers", "minidape.commands"):
                try:
                    importlib.import_module(name)
                    print("imported", name)
                except ImportError:
                    pass
            """,
    )
    assert "imported" not in printed
    assert "False False ['fox_bias']" in printed
    assert "exercises.framework" not in printed and "minidape.classroom.grade" not in printed


def test_a_judged_run_holds_only_what_its_notebook_declares(grader):
    """A judged run of 03 has no md.kernels, md.tasks or md.study (absent, not refusing); one of 06 refuses the
    kernels that compute the biases 6.3 forbids."""
    assert "kernels" not in exercises.JUDGED_IMPORTS["03"]
    copies = (
        grader.censored_copy(frozenset(), "03"),
        grader.censored_copy(frozenset(exercises.LIBRARY["my_bias"]), "06"),
    )
    printed = []
    for slot, copy in enumerate(copies, 2):
        worker = grader.start(slot, copy)
        try:
            worker.wait_ready(grade.START_TIMEOUT)
            printed.append(
                run(
                    worker,
                    """
                    import importlib
                    import minidape as md
                    for name in ("kernels", "lab.tasks", "study", "lab.che"):
                        try:
                            importlib.import_module(f"minidape.{name}")
                            print("has", name)
                        except ImportError as error:
                            print("no", name, type(error).__name__)
                    try:
                        md.kernels.log_kernel()
                    except (RuntimeError, AttributeError, ImportError) as error:
                        print(type(error).__name__)
                    """,
                )
            )
        finally:
            grader.stop(worker)
    judged_03, judged_06 = printed
    absent = [f"no {name} ModuleNotFoundError" for name in ("kernels", "lab.tasks", "study", "lab.che")]
    assert judged_03.splitlines() == [*absent, "ModuleNotFoundError"]
    assert "has kernels" in judged_06 and "has study" in judged_06 and judged_06.endswith("RuntimeError\n")


PLANT_AND_PROBE = """
import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
token, calls = {token!r}, {calls!r}
key = 0x4D44 + {key}
found = []
# files in every folder a process may write
for folder in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock"):
    if os.path.exists(os.path.join(folder, token)):
        found.append("file " + folder)
# SysV shared memory, message queues and semaphores
for kind, get in (("shm", lambda flags: libc.shmget(key, 4096, flags)), ("msg", lambda flags: libc.msgget(key, flags)),
                  ("sem", lambda flags: libc.semget(key, 1, flags))):
    if get(0) != -1:
        found.append("sysv " + kind)
# POSIX message queues
rt = ctypes.CDLL("librt.so.1", use_errno=True)
rt.mq_open.restype = ctypes.c_int
if rt.mq_open(("/" + token).encode(), os.O_RDONLY) != -1:
    found.append("posix mq")
# keyrings: the session's, the user's
libc.syscall.restype = ctypes.c_long
if libc.syscall(calls["request_key"], b"user", token.encode(), None, 0) != -1:
    found.append("keyring")
# abstract unix sockets
probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    probe.connect("\\0" + token)
    found.append("abstract socket")
except OSError:
    pass
print("FOUND", found)
if {plant}:
    for folder in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock"):
        try:
            open(os.path.join(folder, token), "w").write("x")
        except OSError:
            pass
    libc.shmget(key, 4096, 0o1666); libc.msgget(key, 0o1666); libc.semget(key, 1, 0o1666)
    rt.mq_open(("/" + token).encode(), os.O_CREAT | os.O_RDWR, 0o666, None)
    for ring in (-3, -4):  # KEY_SPEC_SESSION_KEYRING, KEY_SPEC_USER_KEYRING
        libc.syscall(calls["add_key"], b"user", token.encode(), b"x", 1, ctypes.c_int(ring))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\\0" + token)
    listener.listen()
"""
KEY_CALLS = {"x86_64": {"add_key": 248, "request_key": 249}, "aarch64": {"add_key": 217, "request_key": 218}}


@pytest.mark.skipif(LEVEL != "root", reason="a user id and IPC namespace of its own per worker need root")
@pytest.mark.skipif(os.uname().machine not in KEY_CALLS, reason="system call numbers known for x86-64 and arm64")
def test_no_channel_joins_two_workers_or_the_graders_session(grader):
    """A token planted through every channel the kernel offers (files, SysV and POSIX IPC, keyrings, abstract
    sockets) by one submission's run, and by the grader's own login session's keyring, is found neither by a
    submission graded beside it nor by the same submission's judged run, while the planter still runs."""
    calls = KEY_CALLS[os.uname().machine]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(250, 1, f"{TOKEN}-session".encode()) == -1:  # a session keyring of this test's own
        pytest.skip("keyrings are refused here (seccomp)")
    assert libc.syscall(calls["add_key"], b"user", TOKEN.encode(), b"x", 1, ctypes.c_int(-3)) != -1
    code = lambda plant: PLANT_AND_PROBE.format(token=TOKEN, calls=calls, key=os.getpid() % 1000, plant=plant)
    planter = grader.start(4)
    beside = grader.start(5)
    judged = grader.start(6, grader.censored_copy(frozenset(exercises.LIBRARY["find_shift"]), "02"), planter.box)
    try:
        for worker in (planter, beside, judged):
            worker.wait_ready(grade.START_TIMEOUT)
        first = run(planter, code(True))
        time.sleep(0.1)
        others = [run(worker, code(False)) for worker in (beside, judged)]
        again = run(planter, code(False))
    finally:
        for worker in (planter, beside, judged):
            grader.stop(worker)
    assert first == "FOUND []\n"  # not even the grader's session keyring
    assert others == ["FOUND []\n", "FOUND []\n"]
    # the planter itself finds each channel: the probe would see a token that crossed
    assert json.loads(again.split("FOUND ")[1].replace("'", '"')) == [
        "file /tmp",
        "file /var/tmp",
        "file /dev/shm",
        "file /run/lock",
        "sysv shm",
        "sysv msg",
        "sysv sem",
        "posix mq",
        "keyring",
        "abstract socket",
    ]


# A grader run by an unprivileged user (level userns), tried from root: a private mount namespace in which every
# folder on the way to the Python installation and the checkout that other users may not enter (a root-only home
# such as /root holding pyenv) is replaced by an enterable empty one with only those trees bound back in, then the
# user nobody (65534) starts a worker as the grader does. Nothing of the machine changes.
AS_NOBODY = """
import os, subprocess, sys
needed, user = sys.argv[1:-1], 65534
for path in needed:
    blocked = [a for a in [path, *map(str, __import__("pathlib").Path(path).parents)] if os.path.isdir(a)
               and not os.stat(a).st_mode & 0o001]
    if blocked:
        top = blocked[-1]
        keep = [p for p in needed if p.startswith(top + "/")]
        if top in needed:  # a closed tree that is itself needed (a checkout in `mktemp -d`): its entries, each
            keep += [os.path.join(top, entry) for entry in os.listdir(top)]  # bound again into the open top
        keep = list(dict.fromkeys(keep))
        held = [subprocess.run(["mktemp"] + ["-d"] * os.path.isdir(tree), capture_output=True, text=True,
                               check=True).stdout.strip() for tree in keep]
        for tree, spare in zip(keep, held):
            subprocess.run(["mount", "--bind", tree, spare], check=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "none", top], check=True)
        for tree, spare in zip(keep, held):
            if os.path.isdir(spare):
                os.makedirs(tree, exist_ok=True)
            else:  # a file is bound onto a file
                os.makedirs(os.path.dirname(tree), exist_ok=True)
                open(tree, "a").close()
            subprocess.run(["mount", "--bind", spare, tree], check=True)
os.setgroups([])
os.setresgid(user, user, user)
os.setresuid(user, user, user)
os.execve(sys.executable, [sys.executable, "-c", sys.argv[-1]], {
    "PATH": os.environ["PATH"], "HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1", "MINIDAPE_QUICK": "1"})
"""
PROBE = """
import json, sys, textwrap
from minidape import grade
from minidape.classroom import sandbox
level = sandbox.isolation()
if level != "userns":
    print(json.dumps({"level": level})); sys.exit(0)
grader = grade.Grader(grade.editions(), level, grade.worker_env(), timeout=60)
worker = grader.start(0)
worker.wait_ready(grade.START_TIMEOUT)
cell = textwrap.dedent('''
    import json, os, minidape
    top = os.path.dirname(os.path.dirname(minidape.__file__))
    try:
        open(minidape.__file__, "a").close()
        written = "written"
    except OSError as error:
        written = type(error).__name__ + str(error.errno)
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    remounted = libc.mount(b"none", b"/", b"", 32 | 4096, b"")  # MS_REMOUNT | MS_BIND, read-write
    capabilities = [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0]
    print(json.dumps({"uid": os.getuid(), "listed": sorted(os.listdir(top)),
                      "remounted": [remounted, ctypes.get_errno()], "capabilities": capabilities,
                      "processes": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
                      "links": sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else None,
                      "net": [line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:]],
                      "written": written, "root": sorted(os.listdir("/"))}))
''')
outputs = worker.request("run", 0, cell, timeout=60)
grader.stop(worker)
print(json.dumps({"level": level, "seen": "".join(o.get("text", "") or str(o) for o in outputs)}))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="run by a non-root user, the tests above already use level userns")
def test_a_teacher_who_is_not_root_gets_the_userns_view():
    """The userns level as an unprivileged teacher gets it: the view of root's level (only the package copy of the
    checkout, its own processes, only loopback), read-only (EROFS writing into the package copy), and no
    capability in its user namespace, so it cannot remount that view writable (EPERM). Skipped, saying why, where
    the kernel refuses unprivileged user namespaces."""
    import subprocess
    import sys

    needed = sorted({os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, ROOT)})
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", AS_NOBODY, *needed, PROBE],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if report["level"] != "userns":
        pytest.skip(f"an unprivileged user gets level {report['level']!r} here: the kernel refuses it user namespaces")
    seen = json.loads(report["seen"])
    assert seen["uid"] == 0  # the teacher's user, mapped to root in its user namespace
    assert "tests" not in seen["listed"] and "notebooks" not in seen["listed"]
    assert seen["processes"] == [1] and "minidape" in seen["listed"]  # its own PID namespace; the copy
    assert seen["net"] == ["lo"]
    assert seen["written"] == "OSError30"  # EROFS: the view is read-only
    assert seen["capabilities"] == "0000000000000000" and seen["remounted"] == [-1, 1]  # none: EPERM
