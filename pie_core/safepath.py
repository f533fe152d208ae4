"""Files a user names, opened beneath a root folder and never through a link.

An inferlet can make links in its scratch folder (WASI creates relative ones such as
``../alice/x``; a worker may create any), so a path it names must not be resolved by the
operating system as a plain path: the server would follow the link into another user's folder,
or out of every root. Every user-named path is therefore split into components here
(:func:`parts_of`: relative, no ``..``) and opened through directory descriptors:

* :func:`open_dir` opens (or creates) a folder beneath a root descriptor, refusing a link or
  a file at every step. Where the kernel has ``openat2`` (Linux 5.6+) an existing folder is
  opened in one call with ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS``;
  elsewhere, and to create, it walks one component at a time with ``O_NOFOLLOW |
  O_DIRECTORY`` relative to the folder opened before. Both refuse the same paths.
* :func:`read_file` reads a regular file with one name (no link, FIFO, device or hard link)
  through its descriptor; :func:`write_file` writes a temporary file beneath the same folder
  descriptor and renames it over the name (a link there is replaced, never followed).

What is checked is what is used: the caller holds descriptors from the open on, so there is no
gap between a check and the use in which a folder could be swapped for a link. Every refusal
below a root is an ``OSError`` whatever the reason, and callers turn each into one message, so
a refusal never tells whether a path exists.
"""

from __future__ import annotations

import ctypes
import errno
import os
import secrets
import stat
import sys
from typing import Any, Iterable

from pie_core.errors import InvalidInput

__all__ = ["parts_of", "open_root", "open_dir", "create_file", "read_file", "write_file", "MAX_DEPTH"]

MAX_DEPTH = 32
"""Components a user-named path may have."""

_MAX_PART = 255  # bytes of one component (NAME_MAX)
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NOFOLLOW_DIR = _DIR | os.O_NOFOLLOW
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a FIFO does not hang the open

_SYS_OPENAT2 = 437  # the same number on every Linux architecture
_RESOLVE_NO_MAGICLINKS, _RESOLVE_NO_SYMLINKS, _RESOLVE_BENEATH = 0x02, 0x04, 0x08


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_openat2_usable: bool | None = None  # None: not tried yet; tests set False to run the walk


def parts_of(relative: str, what: str) -> tuple[str, ...]:
    """The components of a user-named path relative to its root (``""`` and ``.`` dropped).

    Raises:
        InvalidInput: It is not a non-empty str, is absolute, holds ``..`` or a NUL, or is over
            :data:`MAX_DEPTH` components or 255 bytes per component; the message says so
            (it depends on the string alone, never on what exists).
    """
    if not isinstance(relative, str) or not relative:
        raise InvalidInput(f"{what} must be a non-empty path relative to it, got {relative!r}")
    if relative.startswith("/") or "\x00" in relative:
        raise InvalidInput(f"{what} takes relative paths without NUL bytes, got {relative[:200]!r}")
    parts = tuple(p for p in relative.split("/") if p not in ("", "."))
    if ".." in parts:
        raise InvalidInput(f"{relative[:200]!r} leaves the {what} ('..' is not allowed); use a path inside it")
    if not parts or len(parts) > MAX_DEPTH or any(len(p.encode(errors="surrogatepass")) > _MAX_PART for p in parts):
        raise InvalidInput(f"{relative[:200]!r} must name something inside the {what}, at most {MAX_DEPTH} levels "
                           f"deep with at most {_MAX_PART} bytes per name")
    return parts


def open_root(path: str | os.PathLike[str], *, create: bool = False) -> int:
    """A descriptor of a folder the server chose (a data dir, ``pie run``'s local path): links
    in it are the operator's and are followed. ``create`` makes it and its parents first."""
    if create:
        os.makedirs(path, exist_ok=True)
    return os.open(path, _DIR)


def open_dir(root: int, parts: Iterable[str], *, create: bool = False, mode: int = 0o755) -> int:
    """A descriptor of folder ``parts`` beneath ``root`` (the caller closes it).

    Args:
        root: A folder descriptor; it stays open.
        parts: Components from :func:`parts_of` (or names the server made); none may be
            ``..``. No parts: a new descriptor of ``root`` itself.
        create: Make each missing folder (with ``mode``, less the umask).

    Raises:
        OSError: A component is a link, a file or missing (without ``create``), or cannot be made.
    """
    parts = tuple(parts)
    if ".." in parts or any("/" in p or p in ("", ".") for p in parts):
        raise OSError(errno.EINVAL, "not a path component")
    if not create and parts and _openat2_available():
        return _openat2(root, "/".join(parts), _DIR)
    fd = os.dup(root)
    try:
        for name in parts:
            if create:
                try:
                    os.mkdir(name, mode, dir_fd=fd)  # never follows a link at ``name``
                except FileExistsError:
                    pass
            child = os.open(name, _NOFOLLOW_DIR, dir_fd=fd)
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def create_file(folder: int, name: str, mode: int = 0o644) -> int:
    """A new file ``name`` in ``folder``, open for writing (``O_CREAT | O_EXCL | O_NOFOLLOW``).

    Raises:
        OSError: Something, a link included, exists under that name.
    """
    return os.open(name, _CREATE, mode, dir_fd=folder)


def read_file(folder: int, name: str, limit: int, *, links: bool = False) -> bytes:
    """The bytes of the regular file ``name`` in ``folder``, at most ``limit`` of them.

    Args:
        links: Follow a link at ``name`` and accept a file with other names (hard links):
            only for paths the operator named (``pie run``), never for a user's.

    Raises:
        OSError: ``name`` is missing, a link, not a regular file, has another name (a hard
            link, which may lie outside the root), or is over ``limit`` bytes.
    """
    fd = os.open(name, _READ & ~os.O_NOFOLLOW if links else _READ, dir_fd=folder)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_nlink != 1 and not links):
            raise OSError(errno.EINVAL, "not a regular file with one name")
        if st.st_size > limit:
            raise OSError(errno.EFBIG, f"over {limit} bytes")
        os.set_blocking(fd, True)
        chunks, got = [], 0
        while got <= limit:
            chunk = os.read(fd, min(limit + 1 - got, 1 << 24))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > limit:  # it grew since the fstat
            raise OSError(errno.EFBIG, f"over {limit} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_file(folder: int, name: str, data: bytes | bytearray | memoryview, mode: int = 0o644) -> None:
    """Replace ``name`` in ``folder`` with ``data``: written to a new temporary file beneath the
    same descriptor, then renamed over ``name`` (a link there is replaced, its target untouched).

    Raises:
        OSError: The file cannot be written, or ``name`` is a folder.
    """
    tmp = f".{name[:200]}.{secrets.token_hex(8)}.tmp"
    fd = create_file(folder, tmp, mode)
    try:
        try:
            view = memoryview(data).cast("B")
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=folder)
        except OSError:
            pass
        raise


def _openat2_available() -> bool:
    global _openat2_usable
    if _openat2_usable is None:
        root = os.open("/", _DIR)
        try:
            os.close(_openat2(root, ".", _DIR))
            _openat2_usable = True
        except OSError:  # ENOSYS (a kernel before 5.6), EPERM (a seccomp filter that forbids it)
            _openat2_usable = False
        finally:
            os.close(root)
    return _openat2_usable


def _openat2(root: int, path: str, flags: int) -> int:
    """``openat2(root, path, flags, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)``."""
    how = _OpenHow(flags, 0, _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)
    fd = _syscall(_SYS_OPENAT2, ctypes.c_int(root), ctypes.c_char_p(os.fsencode(path)), ctypes.byref(how),
                  ctypes.c_size_t(ctypes.sizeof(how)))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int(fd)


def _load_syscall() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    fn = libc.syscall
    fn.restype = ctypes.c_long
    return fn


if sys.platform.startswith("linux"):  # the syscall number means something else elsewhere
    try:
        _syscall = _load_syscall()
    except (OSError, AttributeError):  # no libc syscall(): the walk is used
        _openat2_usable = False
else:
    _openat2_usable = False
