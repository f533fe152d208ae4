"""A seccomp-BPF filter that keeps a worker one process: no fork, no exec, no ptrace.

An inferlet has no legitimate reason to start processes (MCP stdio servers run engine-side),
and a process it started could outlive the worker's kill (``setsid``) or multiply its memory
limit (each child gets its own ``RLIMIT_AS``). Once :func:`confine` has run, the worker and every
thread it has or will have get ``EPERM`` from ``fork``, ``vfork``, ``clone`` without
``CLONE_THREAD``, ``execve``, ``execveat`` and ``ptrace``, and ``ENOSYS`` from ``clone3`` (whose
flags a filter cannot read; glibc then falls back to ``clone``, which it can). Threads keep
working. A system call of another ABI (i386 or x32 on x86_64) kills the process.

Installed through ``ctypes`` like :mod:`.landlock`; nothing can lift the filter afterwards.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

__all__ = ["available", "confine"]

_PR_SET_NO_NEW_PRIVS, _PR_GET_SECCOMP = 38, 21
_SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC = 1, 1
_CLONE_THREAD = 0x00010000
_X32_BIT = 0x40000000

_RET_KILL_PROCESS, _RET_ERRNO, _RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|J*|K, BPF_RET|K
_NR, _ARCH, _ARG0_LOW = 0, 4, 16  # offsets in struct seccomp_data (little-endian)


class _Arch:
    def __init__(self, audit: int, seccomp: int, clone: int, clone3: int, denied: dict[str, int], x32: bool) -> None:
        self.audit, self.seccomp, self.clone, self.clone3, self.denied, self.x32 = audit, seccomp, clone, clone3, denied, x32


_ARCHES = {
    "x86_64": _Arch(0xC000003E, 317, 56, 435, {"fork": 57, "vfork": 58, "execve": 59, "ptrace": 101, "execveat": 322}, True),
    "aarch64": _Arch(0xC00000B7, 277, 220, 435, {"execve": 221, "ptrace": 117, "execveat": 281}, False),
}
_ARCHES["amd64"], _ARCHES["arm64"] = _ARCHES["x86_64"], _ARCHES["aarch64"]


class _Filter(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def _arch() -> _Arch | None:
    return _ARCHES.get(platform.machine().lower()) if platform.system() == "Linux" else None


def available() -> bool:
    """Whether this kernel and architecture can take the filter (seccomp built in, x86_64 or
    aarch64)."""
    if _arch() is None:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(_PR_GET_SECCOMP, ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)) >= 0


def _program(arch: _Arch) -> bytes:
    """The filter as packed ``struct sock_filter`` instructions for ``arch``."""

    def op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
        return struct.pack("=HBBI", code, jt, jf, k)

    eperm, enosys = _RET_ERRNO | errno.EPERM, _RET_ERRNO | errno.ENOSYS
    code = [op(_LD_ABS, _ARCH), op(_JEQ, arch.audit, 1, 0), op(_RET, _RET_KILL_PROCESS), op(_LD_ABS, _NR)]
    if arch.x32:  # x32 numbers carry bit 30 and reach the same kernel code under other numbers
        code += [op(_JGE, _X32_BIT, 0, 1), op(_RET, _RET_KILL_PROCESS)]
    for nr in arch.denied.values():
        code += [op(_JEQ, nr, 0, 1), op(_RET, eperm)]
    code += [op(_JEQ, arch.clone3, 0, 1), op(_RET, enosys)]
    code += [op(_JEQ, arch.clone, 0, 4), op(_LD_ABS, _ARG0_LOW), op(_JSET, _CLONE_THREAD, 0, 1),
             op(_RET, _RET_ALLOW), op(_RET, eperm)]
    code.append(op(_RET, _RET_ALLOW))
    return b"".join(code)


def confine() -> bool:
    """Install the filter on every thread of the calling process (and all later ones).

    Returns:
        True once installed; False where the kernel or the architecture has no seccomp
        (nothing was changed: processes the caller starts are not contained then).

    Raises:
        OSError: The kernel has seccomp but refused the filter (the caller should not run
            the untrusted code then).
    """
    arch = _arch()
    if arch is None or not available():
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    code = _program(arch)
    prog = _Filter(len(code) // 8, code)
    libc.syscall.restype = ctypes.c_long
    result = libc.syscall(ctypes.c_long(arch.seccomp), ctypes.c_long(_SECCOMP_SET_MODE_FILTER),
                          ctypes.c_long(_SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(prog))
    if result != 0:  # > 0: the id of a thread that could not be synchronised
        err = ctypes.get_errno() if result < 0 else errno.EBUSY
        raise OSError(err, f"seccomp(SET_MODE_FILTER, TSYNC) failed: {os.strerror(err)}")
    return True
