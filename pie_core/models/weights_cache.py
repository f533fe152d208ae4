"""On-disk cache of dequantised float32 weights, loaded back as read-only memory maps.

Dequantising a GGUF costs seconds; reading it back from ``.npy`` files through ``mmap`` costs
milliseconds (the pages come from the OS page cache on first touch). An entry lives in
``<cache>/weights/<key>/``: one ``.npy`` per tensor plus ``manifest.json`` listing
``(name, file)`` in order. Entries are written to a temporary folder and renamed into place once complete, so a
crash or an abandoned iteration never leaves a half entry that looks whole.

The key is a content id when the caller has one, else the source's resolved path, size and
modification time (editing or replacing the file invalidates the entry). For a GGUF file the
registry passes :func:`content_id`, the file's sha256, so the same bytes reached by any path (a
symlink, another relative path, a copy, or the embedded default model named by its file) share
one entry: entries are ~5x the GGUF (float32), far too big to duplicate. The sha256 is computed
once per file version and remembered by (device, inode, size, mtime) under
``<cache>/identities/``; later loads cost one ``stat`` (hashing is ~0.5-1.5 s per GB).
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import json
import os
import queue
import shutil
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["cache_dir", "WeightsCache", "source_key", "content_id", "remembered_content_id", "Allocator"]

Allocator = Callable[[str, tuple[int, ...]], np.ndarray]

_FORMAT = 2  # bump when the canonical weight conventions or the layout change
_STOP = object()
_HASH_BLOCK = 8 << 20


def cache_dir() -> Path:
    """The user's cache folder: ``$PIE_CACHE_DIR``, else ``~/.cache/pie``."""
    env = os.environ.get("PIE_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "pie"


def source_key(source: str | Path, content_id: str | None = None) -> str:
    """Cache key of a checkpoint.

    Args:
        source: The checkpoint file or folder.
        content_id: A digest of the content when known (e.g. a verified sha256); the key then
            survives moves and copies of the file.

    Returns:
        A 32-hex-digit key.
    """
    if content_id is not None:
        ident = f"content:{content_id}"
    else:
        path = Path(source).resolve()
        files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
        ident = "|".join(f"{p}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)
    return hashlib.sha256(f"v{_FORMAT}|{ident}".encode()).hexdigest()[:32]


def _memo(real: Path, st: os.stat_result) -> Path:
    return cache_dir() / "identities" / f"{st.st_dev:x}-{st.st_ino:x}.json"


def remembered_content_id(path: str | Path) -> str | None:
    """The sha256 :func:`content_id` remembered for this version of the file (same device,
    inode, size and mtime), or ``None`` when it would have to hash."""
    real = Path(path).resolve()
    st = real.stat()
    try:
        known = json.loads(_memo(real, st).read_text())
        if known["size"] == st.st_size and known["mtime_ns"] == st.st_mtime_ns:
            return str(known["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def content_id(path: str | Path, progress: Callable[[int, int], None] | None = None) -> str:
    """sha256 of a file's bytes, hashed on first sight and remembered by file identity.

    The memo, ``<cache>/identities/<device>-<inode>.json``, holds the digest with the size and
    mtime it was computed at; a file whose size or mtime changed is hashed again. A copy (new
    inode) is hashed once and then shares the original's digest, hence its cache entry.

    Args:
        path: The file (symlinks are followed).
        progress: ``progress(done_bytes, total_bytes)`` while hashing (not called on a memo hit).

    Returns:
        64 hex digits.
    """
    if (known := remembered_content_id(path)) is not None:
        return known
    real = Path(path).resolve()
    st = real.stat()
    digest = hashlib.sha256()
    done = 0
    with real.open("rb") as f:
        while block := f.read(_HASH_BLOCK):
            digest.update(block)
            done += len(block)
            if progress is not None:
                progress(done, st.st_size)
    sha = digest.hexdigest()
    memo = _memo(real, st)
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_name(f".{memo.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps({"sha256": sha, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "path": str(real)}))
        os.replace(tmp, memo)
    except OSError:
        pass  # a read-only cache only costs a re-hash next time
    return sha


class WeightsCache:
    """Cache of canonical float32 weights under one root folder."""

    def __init__(self, root: str | Path | None = None) -> None:
        """Use ``root`` (default :func:`cache_dir`) ``/weights``."""
        self.root = (Path(root) if root is not None else cache_dir()) / "weights"

    def entry(self, key: str) -> Path:
        """Folder of the entry for ``key`` (it may not exist)."""
        return self.root / key

    def has(self, key: str) -> bool:
        """Whether a complete entry exists for ``key``."""
        return (self.entry(key) / "manifest.json").is_file()

    def load(self, key: str) -> Iterator[tuple[str, np.ndarray]]:
        """Yield the cached weights of ``key`` as read-only memory-mapped float32 arrays.

        Raises:
            FileNotFoundError: No complete entry for ``key``.
        """
        folder = self.entry(key)
        manifest = json.loads((folder / "manifest.json").read_text())
        for name, file in manifest["entries"]:
            yield name, np.load(folder / file, mmap_mode="r")

    def weights(
        self,
        key: str,
        produce: Callable[[Allocator], Iterator[tuple[str, np.ndarray]]],
        info: dict[str, Any] | None = None,
        keep: bool = True,
    ) -> Iterator[tuple[str, np.ndarray]]:
        """Yield weights from the cache, or from ``produce(allocate)`` while storing them.

        On a miss, ``produce`` is handed an allocator whose arrays are memory maps of the
        entry's own ``.npy`` files: a producer that dequantises into them writes every byte
        once, straight into the cache. Arrays the producer made some other way are written
        by a background thread. The entry is committed after the last weight; if the caller
        stops early the partial entry is discarded; if writing fails (disk full) a
        ``RuntimeWarning`` is issued and the weights are still all yielded.

        Args:
            key: From :func:`source_key`.
            produce: Makes a fresh iterator over the weights (called only on a miss).
            info: Extra JSON-serialisable facts stored in the manifest (source path, spec).
            keep: False to store nothing on a miss: ``allocate`` then maps files that are
                unlinked at once, so the arrays live as long as their holder and no longer, and
                a crash leaves nothing behind (for backends that keep their own derived layout).

        Yields:
            ``(name, float32 array)``; arrays are read-only (memory maps of the entry).
        """
        if self.has(key):
            yield from self.load(key)
            return
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{key}.tmp-{os.getpid()}-{threading.get_ident()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        if not keep:
            yield from _transient(tmp, produce)
            return
        writer = _Writer(tmp)
        mapped: dict[str, tuple[str, np.ndarray]] = {}
        count = itertools.count()

        def allocate(name: str, shape: tuple[int, ...]) -> np.ndarray:
            file = f"{next(count):04d}.npy"
            array = _map_reserved(tmp / file, shape) if writer.error is None else None
            if array is None:  # disk full: the weights are still produced, in memory
                writer.fail(OSError(errno.ENOSPC, "no space to reserve", str(tmp / file)))
                return np.empty(shape, dtype=np.float32)
            mapped[name] = (file, array)
            return array

        entries: list[tuple[str, str]] = []
        committed = False
        try:
            for name, array in produce(allocate):
                slot = mapped.pop(name, None)
                if slot is not None and np.may_share_memory(array, slot[1]):
                    file = slot[0]
                else:
                    file = f"w{len(entries):04d}.npy"
                    writer.put(file, array)
                entries.append((name, file))
                array.flags.writeable = False
                yield name, array
            if not writer.close():
                warnings.warn(f"weights cache not written to {tmp}: {writer.error}", RuntimeWarning, stacklevel=2)
                return
            manifest = {"format": _FORMAT, "entries": entries, "info": info or {}}
            (tmp / "manifest.json").write_text(json.dumps(manifest))
            try:
                tmp.rename(self.entry(key))
                committed = True
            except OSError:  # another process committed the same entry first
                pass
        finally:
            writer.close()
            if not committed:
                shutil.rmtree(tmp, ignore_errors=True)

    def clear(self) -> int:
        """Delete every entry; returns the bytes freed."""
        freed = 0
        if self.root.is_dir():
            for p in self.root.rglob("*"):
                if p.is_file():
                    freed += p.stat().st_size
            shutil.rmtree(self.root)
        return freed


def _transient(folder: Path, produce: Callable[[Allocator], Iterator[tuple[str, np.ndarray]]]) -> Iterator[tuple[str, np.ndarray]]:
    """Weights from ``produce`` whose allocator maps files unlinked as soon as they are mapped:
    disk pages the kernel may write back under memory pressure, freed when the arrays go."""
    count = itertools.count()

    def allocate(name: str, shape: tuple[int, ...]) -> np.ndarray:
        file = folder / f"{next(count):04d}.npy"
        array = _map_reserved(file, shape)
        file.unlink(missing_ok=True)
        return np.empty(shape, dtype=np.float32) if array is None else array

    try:
        for name, array in produce(allocate):
            array.flags.writeable = False
            yield name, array
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _map_reserved(file: Path, shape: tuple[int, ...]) -> np.ndarray | None:
    """A writable float32 ``.npy`` memory map at ``file`` whose disk blocks are reserved, or
    None (and no file) when the disk cannot hold it.

    A fresh map is a sparse file: writing a page the disk has no room for kills the process
    with SIGBUS instead of raising. Reserving every block first turns a full disk into an
    ``OSError`` here, where the caller can fall back to memory.
    """
    array = np.lib.format.open_memmap(file, mode="w+", dtype=np.float32, shape=shape)
    try:
        fd = os.open(file, os.O_RDWR)
        try:
            os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
        finally:
            os.close(fd)
    except OSError:
        del array
        file.unlink(missing_ok=True)
        return None
    return array


class _Writer:
    """Writes ``.npy`` files on a background thread (file I/O releases the GIL)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.error: BaseException | None = None
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=64)
        self._thread = threading.Thread(target=self._run, name="pie-weights-cache", daemon=True)
        self._thread.start()
        self._closed = False

    def _run(self) -> None:
        while (item := self._queue.get()) is not _STOP:
            if self.error is None:
                file, array = item
                try:
                    np.save(self.folder / file, array, allow_pickle=False)
                except BaseException as e:  # reported by close()
                    self.error = e

    def put(self, file: str, array: np.ndarray) -> None:
        self._queue.put((file, array))

    def fail(self, error: BaseException) -> None:
        """Record ``error`` (the first one wins): the entry will not be committed."""
        if self.error is None:
            self.error = error

    def close(self) -> bool:
        """Wait for pending writes; returns whether all of them succeeded (see ``error``)."""
        if not self._closed:
            self._closed = True
            self._queue.put(_STOP)
            self._thread.join()
        return self.error is None
