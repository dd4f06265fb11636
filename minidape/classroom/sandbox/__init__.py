"""Sandboxed workers that run one student's notebook, then answer the grader's questions about it.

The grader (:mod:`minidape.classroom.grade`) never judges inside the student's process. Per submission it starts workers
(:class:`Worker`, in ``host``): it sends one the notebook's code cells one at a time (``worker``: ``exec`` in one
namespace, as a kernel would; outputs come back), and afterwards asks it to *call* the answers that the
notebook's ``exercises.check(...)`` cells recorded. Every question is one request; every answer comes back as data
only (``protocol``: tensors, numbers, strings, ``None`` and lists, tuples and dicts of them, read by
``torch.load(weights_only=True)`` after their size and their tensors' real storage are checked); anything else
stays in the worker and comes back as a :class:`Remote` handle that the grader can call in turn. For exercise
6.5 the grader trains models in its own process, and a module of the student's answers only for its output and
its parameters' gradients at the parameter values the grader sends (``built``, ``bias_with``).

What a worker sees of minidape is a package copy (``censor``): its ``exercises`` is the recorder (``recorder``:
``check`` records, and asks the grader for the verdicts a notebook branches on), nothing of the checks, the grader
or the command line is in it. The library ban: an answer to an exercise that forbids parts of minidape
(``exercises.LIBRARY``) and earns points is judged again in another worker that runs the notebook again (up to
that exercise's check, one such run per set of forbidden names) with a judged run's copy: of minidape's optional
modules only those its notebook declares (``exercises.JUDGED_IMPORTS``), and in it those functions and every
method of those classes refuse. Nothing of the real implementation is in that process to reach.

Isolation (``confine``: :func:`isolation` says which level this machine gets; ``limits``: what a submission
may use). Each worker starts as :func:`confine.boot`, which confines itself before it imports anything of
minidape, then replaces itself with the worker proper:

* ``root``: the grader runs as root. The worker is PID 1 of new PID, mount, network and IPC namespaces (util-linux
  ``unshare``); its root file system is a new one built from an allow-list (``confine.VIEW_*``: the system's
  programs and libraries, the Python installation, the corpora, read-only, and the package copy at the package's
  path); ``/tmp`` and the other writable folders are folders of the submission's own scratch tmpfs (size and
  number of files bounded), gone when it ends; then it becomes an unprivileged user id of its own, with a session
  keyring of its own. It cannot see or signal the grader, other workers or their files, and has no network. The
  kernel ends every process it started when it ends; the grader also kills whatever still runs under its user id.
* ``uid``: root, but namespaces are not permitted: a user id of its own, a scratch folder of its own (mode 0700),
  a session keyring, the limits; no file view of its own, no PID or network namespace; the package copy is only
  first on its path.
* ``userns``: not root, but unprivileged user namespaces work: the same namespaces and view as ``root``, but the
  worker keeps the grader's user id (root in its user namespace), so it may remount its view writable.
* ``none``: resource limits, a process group, a scratch folder, a session keyring, the copy first on the path.

Resources, per submission as a whole: where the grader is root and the machine has cgroups (v1 with the memory,
cpu and pids hierarchies, or v2 with those controllers), all workers of a submission share one cgroup bounding
their memory, CPU share and processes (:data:`limits.LIMITS`); elsewhere per-process limits only.
"""

from ..exercises import NotDone, StudentError, WorkerGone, Wrong
from .censor import censored_copy
from .confine import UID_BASE, UIDS_PER_GRADER, WARNINGS, isolation, kill_user, processes_of
from .host import Worker, needed_trees
from .limits import LIMITS, MAX_CELL_OUTPUT, MAX_NOTEBOOK_OUTPUT, Box, cap_outputs, cgroup_version, warnings
from .protocol import (
    MAX_ELEMENTS,
    MAX_MESSAGE,
    Channel,
    Description,
    Remote,
    TimeLimit,
    decode,
    from_bytes,
    request_bytes,
    to_bytes,
)

__all__ = [
    "censored_copy",
    "Worker",
    "needed_trees",
    "UID_BASE",
    "UIDS_PER_GRADER",
    "WARNINGS",
    "isolation",
    "kill_user",
    "processes_of",
    "LIMITS",
    "MAX_CELL_OUTPUT",
    "MAX_NOTEBOOK_OUTPUT",
    "Box",
    "cap_outputs",
    "cgroup_version",
    "warnings",
    "MAX_ELEMENTS",
    "MAX_MESSAGE",
    "Channel",
    "Description",
    "Remote",
    "TimeLimit",
    "decode",
    "from_bytes",
    "request_bytes",
    "to_bytes",
    "NotDone",
    "StudentError",
    "WorkerGone",
    "Wrong",
]
