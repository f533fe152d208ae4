"""Uploaded programs: chunked uploads, content-hashed, stored once, named per user.

An upload is a tar archive (optionally gzip-compressed) of an inferlet folder (``Pie.toml`` at
its root). Its bytes are stored once under ``<data_dir>/programs/<sha256>/``, however many
users upload them; each user has their own ``name -> version -> sha256`` index, so one user's
upload never shadows another's. Built-in inferlets (``pie_core/server/builtin``) and the bundled
examples are visible to everyone.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import tarfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from pie_core.errors import InvalidInput, NotFound
from pie_core.runtime.library import example_dirs
from pie_core.runtime.manifest import Manifest, load_manifest

__all__ = ["ProgramStore", "Upload", "BUILTIN_DIR", "DEFAULT_MAX_UPLOAD"]

BUILTIN_DIR = Path(__file__).resolve().parent / "builtin"
DEFAULT_MAX_UPLOAD = 64 * 2**20
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


class ProgramStore:
    """Content-addressed program storage plus a per-user name index (kept in ``index.json``)."""

    def __init__(self, data_dir: Path, *, max_upload: int = DEFAULT_MAX_UPLOAD, max_pending: int = 8) -> None:
        self.root = Path(data_dir) / "programs"
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_upload = max_upload
        self.max_pending = max_pending
        self._uploads: dict[str, Upload] = {}
        self._index_path = self.root / "index.json"
        self._index: dict[str, dict[str, dict[str, str]]] = {}
        if self._index_path.is_file():
            self._index = json.loads(self._index_path.read_text(encoding="utf-8"))

    # uploads -------------------------------------------------------------------------------

    def begin(self, user: str, size: int, sha256: str) -> Upload | Manifest:
        """Start an upload of ``size`` bytes hashing to ``sha256``.

        Returns:
            The program's manifest when these bytes are already stored (nothing to send; the
            program is now in ``user``'s index), else a new :class:`Upload`.

        Raises:
            InvalidInput: A bad size or hash, a size over the limit, or too many open uploads.
        """
        sha256 = sha256.lower()
        if not _HEX64.fullmatch(sha256):
            raise InvalidInput("upload_begin 'sha256' must be 64 hex digits (the SHA-256 of the whole archive)")
        if size <= 0 or size > self.max_upload:
            raise InvalidInput(f"upload size must be 1..{self.max_upload} bytes, got {size}; pack only the inferlet folder")
        if (self.root / sha256 / "Pie.toml").is_file():
            return self._register(user, sha256)
        if sum(1 for u in self._uploads.values() if u.user == user) >= self.max_pending:
            raise InvalidInput(f"at most {self.max_pending} uploads may be open at once; finish or abandon one")
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
        if len(up.buffer) + len(data) > up.size:
            del self._uploads[up.id]
            raise InvalidInput(f"upload {up.id} got more than its declared {up.size} bytes; it was dropped, start again")
        up.buffer += data
        return len(up.buffer)

    def finish(self, user: str, upload_id: str) -> Manifest:
        """Check the size and hash, unpack, read the manifest, store once, index for ``user``.

        Raises:
            NotFound: No such upload.
            InvalidInput: Short, wrong hash, not a tar archive, unsafe member paths, or no valid
                Pie.toml (the upload is dropped in every case).
        """
        up = self._upload(user, upload_id)
        del self._uploads[up.id]
        if len(up.buffer) != up.size:
            raise InvalidInput(f"upload {up.id} ended after {len(up.buffer)} of {up.size} bytes")
        digest = hashlib.sha256(up.buffer).hexdigest()
        if digest != up.sha256:
            raise InvalidInput(f"upload hash mismatch: declared {up.sha256}, received bytes hash to {digest}")
        target = self.root / digest
        if not (target / "Pie.toml").is_file():
            self._unpack(bytes(up.buffer), target)
        return self._register(user, digest)

    def drop(self, user: str, upload_id: str) -> None:
        """Forget an open upload (its connection closed); unknown ids are ignored."""
        up = self._uploads.get(upload_id)
        if up is not None and up.user == user:
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
        shared = []
        for folder in self._shared_dirs():
            try:
                shared.append(f"{folder.name}@{load_manifest(folder).version}")
            except InvalidInput:
                continue
        return sorted(set(mine)) + sorted(set(shared) - set(mine))

    # internals -----------------------------------------------------------------------------

    def _upload(self, user: str, upload_id: str) -> Upload:
        up = self._uploads.get(upload_id)
        if up is None or up.user != user:
            raise NotFound(f"no open upload {upload_id!r}; start one with upload_begin")
        return up

    def _unpack(self, data: bytes, target: Path) -> None:
        staging = self.root / f".staging-{uuid.uuid4().hex[:8]}"
        try:
            try:
                with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
                    tar.extractall(staging, filter="data")  # refuses absolute paths, '..', links out
            except (tarfile.TarError, OSError, EOFError) as exc:
                raise InvalidInput(f"upload is not a safe tar archive of an inferlet folder: {exc}") from None
            load_manifest(staging)  # Pie.toml must be at the archive's root and valid
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _register(self, user: str, digest: str) -> Manifest:
        manifest = load_manifest(self.root / digest)
        if not _NAME.fullmatch(manifest.name) or not _NAME.fullmatch(manifest.version):
            raise InvalidInput(f"program name/version must use letters, digits, . _ - ; got {manifest.name}@{manifest.version}")
        self._index.setdefault(user, {}).setdefault(manifest.name, {})[manifest.version] = digest
        tmp = self._index_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._index, indent=1), encoding="utf-8")
        tmp.replace(self._index_path)
        return manifest

    def _shared_dirs(self) -> list[Path]:
        roots = [BUILTIN_DIR, *example_dirs()]
        return [p.parent for root in roots if root.is_dir() for p in sorted(root.glob("*/Pie.toml"))]


def _version_key(version: str) -> tuple[tuple[int, int | str], ...]:
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"[.-]", version))
