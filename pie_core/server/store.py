"""Uploaded programs: chunked uploads, content-hashed, stored once, named per user.

An upload is a tar archive (optionally gzip-compressed) of an inferlet folder (``Pie.toml`` at
its root), unpacked by :mod:`pie_core.server.archive` in a worker thread. Its bytes are stored
once under ``<data_dir>/programs/<sha256>/``, however many users upload them, but each user has
their own ``name -> version -> sha256`` index and reaches only what is in it: knowing a hash is
not having the program, so every user sends the bytes once. Built-in inferlets
(``pie_core/server/builtin``) and the bundled examples are visible to everyone.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from pie_core.errors import InvalidInput, NotFound
from pie_core.runtime.library import example_dirs
from pie_core.runtime.manifest import Manifest, load_manifest
from pie_core.server.archive import ArchiveLimits, unpack_archive

__all__ = ["ProgramStore", "Upload", "BUILTIN_DIR", "DEFAULT_MAX_UPLOAD"]

BUILTIN_DIR = Path(__file__).resolve().parent / "builtin"
DEFAULT_MAX_UPLOAD = 64 * 2**20
_STAGING = ".staging-"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(eq=False)
class Upload:
    """An upload in progress: chunks are appended in order until ``size`` bytes arrived."""

    id: str
    user: str
    size: int
    sha256: str
    buffer: bytearray = field(default_factory=bytearray)
    closed: bool = False  # upload_end arrived; it is being unpacked


class ProgramStore:
    """Content-addressed program storage plus a per-user name index (kept in ``index.json``).

    Args:
        data_dir: Programs go to ``data_dir/programs``.
        max_upload: Largest archive, in bytes, as sent.
        max_pending: Uploads one user may have open (being sent or unpacked) at once.
        max_pending_bytes: Declared bytes of all users' open uploads together (their buffers).
        max_unpacked_bytes: Total size of the files one archive may unpack to. 64 MiB: inferlets
            are source code and small assets; models and data are not uploaded with them.
        max_archive_members: Files and folders one archive may hold. 2,000 covers a large
            package tree; 50,000 tiny files once kept the server busy for 21 s.
        max_compression_ratio: Largest inflated / compressed size of a gzip archive. Source
            code compresses 3-10:1; 100:1 refuses a bomb (1,000:1 is zlib's best) after about
            a mebibyte.
        max_unpacking: Archives unpacked at once, server-wide (each in a worker thread).
    """

    def __init__(self, data_dir: Path, *, max_upload: int = DEFAULT_MAX_UPLOAD, max_pending: int = 8,
                 max_pending_bytes: int = 4 * DEFAULT_MAX_UPLOAD,
                 max_unpacked_bytes: int = 64 * 2**20, max_archive_members: int = 2000,
                 max_compression_ratio: int = 100, max_unpacking: int = 2) -> None:
        self.root = Path(data_dir) / "programs"
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_upload = max_upload
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self.limits = ArchiveLimits(max_unpacked_bytes, max_archive_members, max_compression_ratio)
        self._unpacking = asyncio.Semaphore(max_unpacking)
        self._uploads: dict[str, Upload] = {}
        self._shared_cache: tuple[tuple[tuple[str, int], ...], list[str]] | None = None
        self._index_path = self.root / "index.json"
        self._index: dict[str, dict[str, dict[str, str]]] = {}
        if self._index_path.is_file():
            self._index = json.loads(self._index_path.read_text(encoding="utf-8"))
        for stale in self.root.glob(f"{_STAGING}*"):  # left by a crash mid-unpack
            shutil.rmtree(stale, ignore_errors=True)

    # uploads -------------------------------------------------------------------------------

    def begin(self, user: str, size: int, sha256: str) -> Upload | Manifest:
        """Start an upload of ``size`` bytes hashing to ``sha256``.

        Returns:
            The program's manifest when ``user`` uploaded these bytes before (nothing to send),
            else a new :class:`Upload`. Bytes only another user uploaded must be sent again:
            the answer never tells whether anyone else stores them.

        Raises:
            InvalidInput: A bad size or hash, a size over the limit, or too many open uploads.
        """
        sha256 = sha256.lower()
        if not _HEX64.fullmatch(sha256):
            raise InvalidInput("upload_begin 'sha256' must be 64 hex digits (the SHA-256 of the whole archive)")
        if size <= 0 or size > self.max_upload:
            raise InvalidInput(f"upload size must be 1..{self.max_upload} bytes, got {size}; pack only the inferlet folder")
        if self._owns(user, sha256):
            return load_manifest(self.root / sha256)
        if sum(1 for u in self._uploads.values() if u.user == user) >= self.max_pending:
            raise InvalidInput(f"at most {self.max_pending} uploads may be open at once; finish or abandon one")
        mine = sum(u.size for u in self._uploads.values() if u.user == user)
        if mine + size > self.max_pending_bytes // 2:  # one user never holds the whole budget
            raise InvalidInput(f"your open uploads declare {mine} bytes; at most {self.max_pending_bytes // 2} may be "
                               "open at once: finish or abandon one")
        pending = sum(u.size for u in self._uploads.values())
        if pending + size > self.max_pending_bytes:  # declared sizes: what the open buffers may grow to
            raise InvalidInput(f"the server is receiving {pending} bytes of uploads and takes at most "
                               f"{self.max_pending_bytes} at once; try again in a moment")
        up = Upload(uuid.uuid4().hex[:16], user, size, sha256)
        self._uploads[up.id] = up
        return up

    def chunk(self, user: str, upload_id: str, data: bytes) -> int:
        """Append ``data``; returns the bytes received so far.

        Raises:
            NotFound: No such upload of this user.
            InvalidInput: The chunk would exceed the declared size (the upload is dropped).
        """
        up = self._upload(user, upload_id)
        if up.closed:
            raise InvalidInput(f"upload {up.id} has ended and is being unpacked; start a new upload to send more")
        if len(up.buffer) + len(data) > up.size:
            del self._uploads[up.id]
            raise InvalidInput(f"upload {up.id} got more than its declared {up.size} bytes; it was dropped, start again")
        up.buffer += data
        return len(up.buffer)

    async def finish(self, user: str, upload_id: str) -> Manifest:
        """Check the size and hash, unpack, read the manifest, store once, index for ``user``.

        Hashing and unpacking run in a worker thread (at most ``max_unpacking`` at once); the
        upload counts against ``max_pending`` until they are done. Bytes are unpacked and
        checked even when the same archive is already stored, so the reply (and its timing)
        does not tell whether another user uploaded it.

        Raises:
            NotFound: No such upload.
            InvalidInput: Short, wrong hash, an unsafe or oversized archive, or no valid
                Pie.toml (the upload is dropped in every case).
        """
        up = self._upload(user, upload_id)
        if up.closed:
            raise InvalidInput(f"upload {up.id} has already ended")
        up.closed = True
        try:
            if len(up.buffer) != up.size:
                raise InvalidInput(f"upload {up.id} ended after {len(up.buffer)} of {up.size} bytes")
            async with self._unpacking:
                digest = await asyncio.to_thread(self._store_bytes, up.buffer, up.sha256)
        finally:
            del self._uploads[up.id]
        return self._register(user, digest)

    def drop(self, user: str, upload_id: str) -> None:
        """Forget an open upload (its connection closed); unknown ids are ignored."""
        up = self._uploads.get(upload_id)
        if up is not None and up.user == user and not up.closed:
            del self._uploads[upload_id]

    @property
    def open_uploads(self) -> int:
        return len(self._uploads)

    # lookup --------------------------------------------------------------------------------

    def resolve(self, user: str, ref: str) -> Manifest:
        """The manifest of ``name`` or ``name@version``: the user's uploads first, then the
        built-ins and examples.

        Raises:
            InvalidInput: A malformed name.
            NotFound: No such program (or not at that version); the message lists what exists.
        """
        name, _, version = ref.partition("@")
        if not _NAME.fullmatch(name) or (version and not _NAME.fullmatch(version)):
            raise InvalidInput(f"program must be 'name' or 'name@version' (letters, digits, . _ -), got {ref!r}")
        versions = self._index.get(user, {}).get(name, {})
        if versions:
            chosen = version or max(versions, key=_version_key)
            if chosen in versions:
                return load_manifest(self.root / versions[chosen])
            raise NotFound(f"{name} is uploaded at versions {', '.join(sorted(versions))}, not {version}")
        for folder in self._shared_dirs():
            if folder.name == name:
                manifest = load_manifest(folder)
                if version and version != manifest.version:
                    raise NotFound(f"{name} is available at version {manifest.version}, not {version}")
                return manifest
        raise NotFound(f"no program {ref!r}; upload it first (client.install) or use one of: {', '.join(self.names(user))}")

    def names(self, user: str) -> list[str]:
        """``name@version`` of every program ``user`` can launch."""
        mine = [f"{n}@{v}" for n, vs in self._index.get(user, {}).items() for v in vs]
        return sorted(set(mine)) + sorted(set(self._shared_names()) - set(mine))

    # internals -----------------------------------------------------------------------------

    def _upload(self, user: str, upload_id: str) -> Upload:
        up = self._uploads.get(upload_id)
        if up is None or up.user != user:
            raise NotFound(f"no open upload {upload_id!r}; start one with upload_begin")
        return up

    def _owns(self, user: str, digest: str) -> bool:
        mine = any(digest in versions.values() for versions in self._index.get(user, {}).values())
        return mine and (self.root / digest / "Pie.toml").is_file()

    def _store_bytes(self, data: bytearray, declared: str) -> str:
        """Verify, unpack into a fresh staging folder and rename it to ``programs/<sha256>``
        (worker thread: touches no in-memory state). Returns the digest."""
        digest = hashlib.sha256(data).hexdigest()
        if digest != declared:
            raise InvalidInput(f"upload hash mismatch: declared {declared}, received bytes hash to {digest}")
        staging = self.root / f"{_STAGING}{uuid.uuid4().hex}"
        try:
            unpack_archive(data, staging, self.limits)
            _check_name(load_manifest(staging, shown_as="the uploaded archive"))  # Pie.toml at its root
            try:
                os.rename(staging, self.root / digest)
            except OSError:
                if not (self.root / digest / "Pie.toml").is_file():
                    raise
                # the same bytes are stored already: keep that copy (only this user's index changes)
        finally:
            if os.path.lexists(staging):
                shutil.rmtree(staging, ignore_errors=True)
        return digest

    def _register(self, user: str, digest: str) -> Manifest:
        manifest = _check_name(load_manifest(self.root / digest))
        self._index.setdefault(user, {}).setdefault(manifest.name, {})[manifest.version] = digest
        tmp = self._index_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._index, indent=1), encoding="utf-8")
        tmp.replace(self._index_path)
        return manifest

    def _shared_names(self) -> list[str]:
        """``name@version`` of the built-ins and examples, re-read only when a Pie.toml changed
        (``list_programs`` is cheap however often a client asks)."""
        stamp = tuple((str(d), (d / "Pie.toml").stat().st_mtime_ns) for d in self._shared_dirs())
        if self._shared_cache is None or self._shared_cache[0] != stamp:
            names = []
            for folder in self._shared_dirs():
                try:
                    names.append(f"{folder.name}@{load_manifest(folder).version}")
                except InvalidInput:
                    continue
            self._shared_cache = (stamp, names)
        return self._shared_cache[1]

    def _shared_dirs(self) -> list[Path]:
        roots = [BUILTIN_DIR, *example_dirs()]
        return [p.parent for root in roots if root.is_dir() for p in sorted(root.glob("*/Pie.toml"))]


def _check_name(manifest: Manifest) -> Manifest:
    if not _NAME.fullmatch(manifest.name) or not _NAME.fullmatch(manifest.version):
        raise InvalidInput(f"program name/version must use letters, digits, . _ - ; "
                           f"got {manifest.name[:200]!r}@{manifest.version[:200]!r}")
    return manifest


def _version_key(version: str) -> tuple[tuple[int, int | str], ...]:
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"[.-]", version))
