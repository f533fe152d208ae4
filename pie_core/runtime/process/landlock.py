"""Filesystem confinement with Landlock (Linux >= 5.13), through ``ctypes``; no root needed.

A process restricts itself (and whatever it forks later) to a set of directories, and can never
lift the restriction. Where the kernel lacks Landlock (or a seccomp filter hides it),
:func:`abi_version` is 0 and :func:`confine` changes nothing.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat
from collections.abc import Iterable

__all__ = ["abi_version", "confine"]

# syscall numbers of the generic table, shared by the architectures below
_SYSCALLS = {"create_ruleset": 444, "add_rule": 445, "restrict_self": 446}
_ARCHES = {"x86_64", "amd64", "aarch64", "arm64", "riscv64", "ppc64le", "s390x", "loongarch64"}
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_ABI1 = (1 << 13) - 1  # execute .. make_sym
_REFER, _TRUNCATE, _IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_FILE_ONLY = EXECUTE | WRITE_FILE | READ_FILE | _TRUNCATE | _IOCTL_DEV  # rights a rule on a file may carry
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1 << 0, 1 << 1
_MAKE_SPECIAL = (1 << 6) | (1 << 9) | (1 << 10) | (1 << 11)  # character devices, sockets, FIFOs, block devices

READ = EXECUTE | READ_FILE | READ_DIR


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _syscall(name: str, *args: object) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    result = int(libc.syscall(ctypes.c_long(_SYSCALLS[name]), *args))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"landlock_{name}: {os.strerror(err)}")
    return result


def abi_version() -> int:
    """The kernel's Landlock ABI version, 0 where Landlock is unavailable."""
    if platform.system() != "Linux" or platform.machine().lower() not in _ARCHES:
        return 0
    try:
        return _syscall("create_ruleset", None, ctypes.c_long(0), ctypes.c_long(_CREATE_RULESET_VERSION))
    except OSError:  # ENOSYS (old kernel), EOPNOTSUPP (disabled at boot), EPERM (seccomp)
        return 0


def _handled_fs(abi: int) -> int:
    rights = _ABI1
    if abi >= 2:
        rights |= _REFER
    if abi >= 3:
        rights |= _TRUNCATE
    if abi >= 5:
        rights |= _IOCTL_DEV
    return rights


def confine(read: Iterable[str], write: Iterable[str]) -> int:
    """Restrict the calling process's filesystem access to ``read`` (read and execute beneath
    each path) and ``write`` (every right beneath each path but making FIFOs, sockets and device
    nodes: a FIFO left in a user's scratch would block whoever opens it, a wasm guest's native
    WASI read included); paths that do not exist are skipped. From ABI 6 on, the process also may no longer signal processes outside its
    domain (the server, other workers) or reach their abstract Unix sockets.

    Returns:
        The ABI version enforced, 0 if the kernel has no Landlock (nothing was changed).

    Raises:
        OSError: The kernel has Landlock but refused the ruleset (the caller should not run
            the untrusted code then).
    """
    abi = abi_version()
    if abi == 0:
        return 0
    handled = _handled_fs(abi)
    attr = _RulesetAttr(handled, 0, (_SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL) if abi >= 6 else 0)
    ruleset = _syscall("create_ruleset", ctypes.byref(attr), ctypes.c_long(ctypes.sizeof(attr)), ctypes.c_long(0))
    try:
        for paths, rights in ((read, READ), (write, handled & ~_MAKE_SPECIAL)):
            for path in paths:
                _add_path(ruleset, path, rights & handled)
        if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), ctypes.c_ulong(0),
                                                   ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        _syscall("restrict_self", ctypes.c_long(ruleset), ctypes.c_long(0))
    finally:
        os.close(ruleset)
    return abi


def _add_path(ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.EACCES):
            return
        raise
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= _FILE_ONLY
        rule = _PathBeneath(rights, fd)
        _syscall("add_rule", ctypes.c_long(ruleset), ctypes.c_long(_RULE_PATH_BENEATH), ctypes.byref(rule), ctypes.c_long(0))
    finally:
        os.close(fd)
