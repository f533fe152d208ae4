"""Unpacking an uploaded program archive without trusting a byte of it.

Neither ``tarfile.extractall`` nor its ``data`` filter is used: on Python 3.11 a chain of long
symlinks gets past the filter (CVE-2025-4517), and its header parser has had denial-of-service
bugs of its own. This module reads the tar format itself, accepts only regular files and
folders, checks every name, and creates every file below a fresh folder with
``O_CREAT | O_EXCL | O_NOFOLLOW`` through directory descriptors (:mod:`pie_core.safepath`, as
every user-named path is opened), so no member can place a byte outside it. The gzip stream is
inflated a slice at a time and every byte is counted, so a bomb is stopped after about a
mebibyte, not after it has filled the disk.
"""

from __future__ import annotations

import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from pie_core import safepath
from pie_core.errors import InvalidInput

__all__ = ["ArchiveLimits", "unpack_archive"]

_BLOCK = 512
_SLICE = 64 * 2**10  # compressed bytes fed to zlib at a time
_RATIO_FREE = 2**20  # inflated bytes before the ratio is checked (tar headers are mostly zeros)
_MAX_EXTENDED = 64 * 2**10  # pax / GNU long-name header data
_MAX_PATH = 1024  # bytes of a member name
_MAX_PART = 255  # bytes of one name component (NAME_MAX)
_MAX_DEPTH = 32
_FILE_MODE, _DIR_MODE = 0o644, 0o755
_CONTROL = re.compile(r"[\x00-\x1f\x7f\\]")
_TYPES = {b"1": "hard link", b"2": "symlink", b"3": "character device", b"4": "block device", b"6": "fifo",
          b"7": "contiguous file", b"K": "GNU long link name", b"S": "GNU sparse file", b"V": "volume label",
          b"M": "multi-volume continuation", b"D": "GNU dump directory"}


@dataclass(frozen=True, slots=True)
class ArchiveLimits:
    """What one archive may unpack to.

    Attributes:
        max_bytes: Total size of all its files.
        max_members: Files and folders it may hold.
        max_ratio: Largest inflated / compressed size of a gzip archive (checked while inflating,
            once a mebibyte came out).
    """

    max_bytes: int = 64 * 2**20
    max_members: int = 2000
    max_ratio: int = 100


def unpack_archive(data: bytes | bytearray, dest: Path, limits: ArchiveLimits) -> None:
    """Unpack a tar archive (plain or gzip-compressed) into ``dest``, a folder it creates.

    Only regular files and folders are accepted; names must be relative, without ``..``,
    control characters or backslashes, at most 1024 bytes, 32 levels and 255 bytes per
    component, and each may appear once. Files get mode 0644, folders 0755.

    Raises:
        InvalidInput: The archive breaks one of these rules or ``limits``; ``dest`` may then hold
            part of it, and the caller removes it.
        FileExistsError: ``dest`` exists.
    """
    os.mkdir(dest, 0o700)
    root = safepath.open_root(dest)
    try:
        seen: dict[tuple[str, ...], bool] = {}  # path -> is a folder
        stream = _TarStream(data, limits)
        count = total = 0
        for parts, size, is_dir in _members(stream):
            count += 1
            if count > limits.max_members:
                raise _refused(f"it holds more than {limits.max_members} files and folders; pack only the "
                               "inferlet folder (no virtual environments, caches or data sets)")
            shown = "/".join(parts)
            if is_dir:
                if seen.get(parts) is False:
                    raise _refused(f"{shown!r} appears as a file and as a folder")
                os.close(_open_dirs(root, parts, seen))
                continue
            if parts in seen:
                raise _refused(f"{shown!r} appears twice (or as a folder and a file); each name may appear once")
            total += size
            if total > limits.max_bytes:
                raise _refused(f"its files add up to more than {limits.max_bytes} bytes (at {shown!r}); "
                               "pack only the inferlet's code and small assets")
            parent = _open_dirs(root, parts[:-1], seen)
            try:
                seen[parts] = False
                _write_file(parent, parts[-1], stream, size)
            finally:
                os.close(parent)
        os.fchmod(root, _DIR_MODE)
    finally:
        os.close(root)


def _members(stream: _TarStream) -> Iterator[tuple[tuple[str, ...], int, bool]]:
    """``(name parts, size, is folder)`` per member; the caller reads a file's bytes."""
    long_name: bytes | None = None
    pax: dict[bytes, bytes] = {}
    while True:
        header = stream.read(_BLOCK, at_boundary=True)
        if not header or header == bytes(_BLOCK):
            return
        kind, size = _check_header(header)
        if kind in (b"x", b"g", b"L"):
            if size > _MAX_EXTENDED:
                raise _refused(f"an extended header holds {size} bytes; at most {_MAX_EXTENDED} are allowed")
            body = stream.read(size)
            stream.skip(-size % _BLOCK)
            if kind == b"L":
                long_name = body.split(b"\0", 1)[0]
            elif kind == b"x":
                pax.update(_pax_records(body))
            elif {b"path", b"size", b"linkpath"} & set(_pax_records(body)):
                raise _refused("a global pax header renames or resizes members; pack the folder with plain tar")
            continue
        if kind not in (b"0", b"\0", b"5"):
            what = _TYPES.get(kind, f"member of type {kind!r}")
            shown = _raw_name(header, long_name, pax).decode("utf-8", "replace")[:200]
            raise _refused(f"it holds a {what} ({shown!r}); only regular files and folders are accepted")
        if any(k.startswith(b"GNU.sparse") for k in pax):
            raise _refused("it holds a sparse file; only regular files and folders are accepted")
        raw = _raw_name(header, long_name, pax)
        if b"size" in pax:
            size = _pax_size(pax[b"size"])
        is_dir = kind == b"5" or (kind == b"\0" and raw.endswith(b"/"))
        if is_dir and size:
            raise _refused(f"folder {raw.decode('utf-8', 'replace')[:200]!r} carries {size} bytes of data")
        yield _safe_parts(raw, is_dir), size, is_dir
        long_name, pax = None, {}


def _check_header(header: bytes) -> tuple[bytes, int]:
    """The type flag and data size of a ustar/pax/GNU header whose checksum must be right."""
    unsigned = sum(header[:148]) + 8 * 32 + sum(header[156:])
    signed = unsigned - 2 * sum(b for b in header[:148] + header[156:] if b > 127)
    text = header[148:156].split(b"\0", 1)[0].strip(b" ")
    if not re.fullmatch(rb"[0-7]{1,8}", text) or int(text, 8) not in (unsigned, signed):
        raise _refused("a header checksum is wrong: this is not a tar archive (plain or gzip-compressed; "
                       "bzip2, xz, zstd and zip are not accepted), or it is damaged")
    return header[156:157], _octal(header[124:136], "size")


def _octal(field: bytes, what: str) -> int:
    if field[:1] and field[0] & 0x80:  # GNU base-256: only for sizes of 8 GiB and more
        raise _refused(f"a member's {what} is stored in base-256 (over 8 GiB)")
    text = field.split(b"\0", 1)[0].strip(b" ")
    if not text:
        return 0
    if not re.fullmatch(rb"[0-7]{1,12}", text):
        raise _refused(f"a header's {what} field is not an octal number")
    return int(text, 8)


def _pax_records(body: bytes) -> dict[bytes, bytes]:
    """``length key=value\\n`` records, parsed in one pass (tarfile's regexes backtrack)."""
    out: dict[bytes, bytes] = {}
    pos = 0
    while pos < len(body) and body[pos] != 0:
        space = body.find(b" ", pos, pos + 20)
        digits = body[pos:space]
        if space < 0 or not digits.isdigit():
            raise _refused("a pax header record has no length")
        end = pos + int(digits)
        if end <= space or end > len(body) or body[end - 1 : end] != b"\n" or b"=" not in body[space + 1 : end]:
            raise _refused("a pax header record is malformed")
        key, _, value = body[space + 1 : end - 1].partition(b"=")
        out[key] = value
        pos = end
    return out


def _pax_size(value: bytes) -> int:
    if not value.isdigit() or len(value) > 20:
        raise _refused("a pax header gives a size that is not a decimal number")
    return int(value)


def _raw_name(header: bytes, long_name: bytes | None, pax: dict[bytes, bytes]) -> bytes:
    if b"path" in pax:
        return pax[b"path"]
    if long_name is not None:
        return long_name
    name = header[0:100].split(b"\0", 1)[0]
    if header[257:265] == b"ustar\x0000":  # POSIX ustar: a prefix field (GNU tar puts times there)
        prefix = header[345:500].split(b"\0", 1)[0]
        if prefix:
            return prefix + b"/" + name
    return name


def _safe_parts(raw: bytes, is_dir: bool) -> tuple[str, ...]:
    """The components of a member name, or a refusal saying what is wrong with it."""
    if len(raw) > _MAX_PATH:
        raise _refused(f"a member name is {len(raw)} bytes long; at most {_MAX_PATH} are allowed")
    try:
        name = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _refused(f"member name {raw[:200]!r} is not UTF-8") from None
    if _CONTROL.search(name):
        raise _refused(f"member name {name!r} holds a NUL, control character or backslash")
    if name.startswith("/"):
        raise _refused(f"member name {name!r} is absolute; names must be relative to the inferlet folder")
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if ".." in parts:
        raise _refused(f"member name {name!r} contains '..'; names must stay inside the inferlet folder")
    if not parts and not is_dir:
        raise _refused(f"member name {name!r} names no file")
    if len(parts) > _MAX_DEPTH or any(len(p.encode()) > _MAX_PART for p in parts):
        raise _refused(f"member name {name!r} is over {_MAX_DEPTH} levels deep or has a component over "
                       f"{_MAX_PART} bytes")
    return parts


def _open_dirs(root: int, parts: tuple[str, ...], seen: dict[tuple[str, ...], bool]) -> int:
    """A descriptor of folder ``parts`` below ``root``, creating what is missing (never
    following a link; the caller closes it)."""
    fd = os.dup(root)
    try:
        for depth in range(1, len(parts) + 1):
            here = parts[:depth]
            made = seen.get(here)
            if made is False:
                raise _refused(f"{'/'.join(parts)!r} goes through {'/'.join(here)!r}, which is a file")
            child = safepath.open_dir(fd, here[-1:], create=made is None, mode=_DIR_MODE)
            seen[here] = True
            os.close(fd)
            fd = child
            if made is None:
                os.fchmod(fd, _DIR_MODE)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _write_file(parent: int, name: str, stream: _TarStream, size: int) -> None:
    fd = safepath.create_file(parent, name, _FILE_MODE)
    try:
        os.fchmod(fd, _FILE_MODE)
        left = size
        while left:
            view = memoryview(stream.read(min(left, _SLICE)))
            left -= len(view)
            while view:
                view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    stream.skip(-size % _BLOCK)


class _TarStream:
    """The tar bytes of a plain or gzip archive, inflated on demand and counted.

    The inflated stream may exceed the files' total only by header overhead (4 KiB a member);
    a gzip archive may not inflate to more than ``max_ratio`` times what it consumed.
    """

    def __init__(self, data: bytes | bytearray, limits: ArchiveLimits) -> None:
        self._src = memoryview(data)
        self._pos = 0  # compressed bytes handed to zlib
        self._limits = limits
        self._cap = limits.max_bytes + 4096 * (limits.max_members + 1)
        self._gzip = bytes(self._src[:2]) == b"\x1f\x8b"
        self._zlib = zlib.decompressobj(16 + zlib.MAX_WBITS) if self._gzip else None
        self._buffer = bytearray()
        self.inflated = 0

    def read(self, n: int, *, at_boundary: bool = False) -> bytes:
        """Exactly ``n`` bytes; ``b""`` at a clean end when ``at_boundary``."""
        while len(self._buffer) < n:
            more = self._more(max(n - len(self._buffer), _SLICE))
            if not more:
                if at_boundary and not self._buffer:
                    return b""
                raise _refused("it ends in the middle of a member (truncated upload?)")
            self._buffer += more
        out = bytes(self._buffer[:n])
        del self._buffer[:n]
        return out

    def skip(self, n: int) -> None:
        if n:
            self.read(n)

    def _more(self, want: int) -> bytes:
        if self._zlib is None:
            out = bytes(self._src[self._pos : self._pos + want])
            self._pos += len(out)
        else:
            out = self._inflate(want)
        self.inflated += len(out)
        if self.inflated > self._cap:
            raise _refused(f"it unpacks to more than {self._cap} bytes of tar data; inferlets may hold at most "
                           f"{self._limits.max_bytes} bytes in {self._limits.max_members} files")
        consumed = self._pos - len(self._zlib.unconsumed_tail) if self._zlib is not None else self._pos
        if self._gzip and self.inflated > _RATIO_FREE and self.inflated > self._limits.max_ratio * consumed:
            raise _refused(f"it inflates more than {self._limits.max_ratio}:1 ({consumed} compressed bytes gave "
                           f"{self.inflated}); this looks like a decompression bomb")
        return out

    def _inflate(self, want: int) -> bytes:
        assert self._zlib is not None
        try:
            while True:
                if self._zlib.eof:  # a following gzip member, as pigz and cat write them
                    self._pos -= len(self._zlib.unused_data)
                    if self._pos >= len(self._src):
                        return b""
                    self._zlib = zlib.decompressobj(16 + zlib.MAX_WBITS)
                tail = self._zlib.unconsumed_tail
                if not tail:
                    if self._pos >= len(self._src):
                        return self._zlib.flush()  # b"" here means the gzip stream is cut short
                    tail = self._src[self._pos : self._pos + _SLICE]
                    self._pos += len(tail)
                out = self._zlib.decompress(tail, want)
                if out:
                    return out
        except zlib.error as exc:
            raise _refused(f"its gzip stream is damaged ({exc})") from None


def _refused(why: str) -> InvalidInput:
    return InvalidInput(f"upload is not a safe tar archive of an inferlet folder: {why}")
