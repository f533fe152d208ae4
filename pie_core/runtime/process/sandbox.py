"""What a worker does to itself before it imports the inferlet: move into the user's scratch
directory, confine its filesystem view (Landlock, where the kernel has it), stop it from
starting processes (seccomp, where the kernel has it), set its rlimits."""

from __future__ import annotations

import functools
import os
import sys
import tempfile
from pathlib import Path

from pie_core.runtime.process import landlock, seccomp
from pie_core.runtime.process.limits import WorkerLimits, apply_rlimits

__all__ = ["enter", "readable_roots"]

_SYSTEM = ("/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin", "/etc")
_DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")


@functools.cache
def loaded_roots() -> frozenset[str]:
    """Folders of ``sys.path`` and of every loaded top-level module (an editable install's
    packages are not on ``sys.path``). Computed once; the zygote does it before forking."""
    roots = {p for p in sys.path if p and os.path.isabs(p) and os.path.exists(p)}
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if "." not in name and isinstance(file, str) and os.path.isabs(file):
            roots.add(str(Path(file).resolve().parent))  # a package's folder, or the folder a module sits in
    return frozenset(roots)


WORKER_NICE = 10  # workers share the CPU among themselves; the server's loop always comes first


def readable_roots(program: Path) -> list[str]:
    """Where a confined worker may read: the system and Python install, :func:`loaded_roots`
    (so lazy imports keep working), its own ``/proc`` entry and the inferlet's program folder.
    The server's cwd, data dir and config are not among them."""
    roots = {*_SYSTEM, sys.prefix, sys.base_prefix, sys.exec_prefix, str(program.resolve()), f"/proc/{os.getpid()}",
             *loaded_roots()}
    ordered = sorted(roots)
    return [r for i, r in enumerate(ordered) if not any(r.startswith(p.rstrip("/") + "/") for p in ordered[:i])]


def enter(program: Path, scratch: str, limits: WorkerLimits) -> int:
    """Confine the calling worker: cwd and ``TMPDIR`` become ``scratch`` (the only place it may
    write), reads are limited to :func:`readable_roots`, process creation, ``exec`` and
    ``ptrace`` are refused (:mod:`.seccomp`; threads keep working), then the CPU and memory
    limits apply and its CPU priority drops by :data:`WORKER_NICE`. With no process of its own, the worker's limits and its kill cover all the
    inferlet can run.

    Returns:
        The Landlock ABI enforced, 0 where the kernel has none (then only cwd, ``TMPDIR`` and
        the rlimits apply and the worker can still open any path the server can).

    Raises:
        OSError: Landlock or seccomp is present but refused the rules.
    """
    os.chdir(scratch)
    os.environ["TMPDIR"] = tempfile.tempdir = scratch
    abi = landlock.confine(read=readable_roots(program), write=[scratch, *_DEVICES])
    seccomp.confine()  # False where the kernel has none; the zygote says so once at start-up
    os.nice(WORKER_NICE)  # a spinning inferlet never outranks the engine's event loop and batcher
    os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    apply_rlimits(limits)
    return abi
