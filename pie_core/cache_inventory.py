"""What Pie keeps under its cache folder (``$PIE_CACHE_DIR``, else ``~/.cache/pie``), by kind and
by model, and deleting it (``pie cache list`` and ``pie cache clean``).

Every entry can be rebuilt, at a cost: the first load after cleaning does again what the entry
saved (assembling a built-in model, dequantising, laying out weights, compiling kernels,
building the wasm component). Entries belong to a model through the key the engine names its
weights by (:func:`pie_core.models.weights_cache.source_key`); kernels and the wasm component
belong to none. Files a process still has memory-mapped stay readable after they are deleted
(the disk space returns when it exits).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pie_core.errors import InvalidInput
from pie_core.models.default_model import EMBEDDED_MODELS
from pie_core.models import hub
from pie_core.models.weights_cache import cache_dir, remembered_content_id, source_key

__all__ = ["KINDS", "CacheEntry", "entries", "clean", "delete", "parse_age", "hub_model_names"]

KINDS: dict[str, str] = {
    "models": "built-in models assembled from their packages",
    "weights": "float32 weights dequantised from GGUF files",
    "torch": "the torch backend's weight layouts (bf16, int8, 4-bit packs)",
    "kernels": "the torch backend's CPU kernels, compiled for this CPU",
    "onnx": "the tensorrt backend's exported graphs and engine caches",
    "wasm": "the WebAssembly sandbox's component and its standard library",
    "tokenizers": "tokenizers read from GGUF files",
    "identities": "sha256 of each GGUF seen (so any path to it shares one entry)",
    "other": "anything else under the cache folder",
}
_KEY = re.compile(r"^[0-9a-f]{32}")
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "": 86400}


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """One thing in the cache that is deleted as a whole.

    Attributes:
        kind: One of :data:`KINDS`.
        path: The file or folder (a wasm component is several files: ``paths``).
        size: Bytes on disk.
        last_used: When it was last read or written (seconds since the epoch; file access times,
            which most file systems update at most daily).
        model: The model it was derived from, "" for none or unknown.
        paths: Every file or folder of the entry.
    """

    kind: str
    path: Path
    size: int
    last_used: float
    model: str = ""
    paths: tuple[Path, ...] = ()


def _walk(path: Path) -> Iterator[Path]:
    if path.is_symlink() or path.is_file():
        yield path
    elif path.is_dir():
        for child in path.rglob("*"):
            if child.is_symlink() or child.is_file():
                yield child


def _measure(paths: Iterable[Path]) -> tuple[int, float]:
    size, used = 0, 0.0
    for path in paths:
        for f in _walk(path):
            st = f.lstat()
            size += st.st_size
            used = max(used, st.st_atime, st.st_mtime)
    return size, used


def _model_names(root: Path, extra: dict[str, str]) -> dict[str, str]:
    """Weights key → the model's name, from what the cache itself records: built-in digests, the
    sha256 memo of every GGUF seen, and the name each float32 entry was built under; ``extra``
    fills in the rest."""
    names = {source_key("", m.sha256): m.name for m in EMBEDDED_MODELS.values()}
    for memo in (root / "identities").glob("*.json"):
        try:
            known = json.loads(memo.read_text())
            names.setdefault(source_key("", str(known["sha256"])), Path(str(known["path"])).name)
        except (OSError, ValueError, KeyError, TypeError):
            continue
    for manifest in (root / "weights").glob("*/manifest.json"):
        try:
            info = json.loads(manifest.read_text()).get("info", {})
        except (OSError, ValueError):
            continue
        if name := str(info.get("name") or ""):  # what --model said: a path shows as its file name
            names[manifest.parent.name] = Path(name).name if Path(name).expanduser().exists() else name
    return {**extra, **names}


def hub_model_names() -> dict[str, str]:
    """Weights key → name of the models in the Hugging Face cache (GGUF blobs are named by their
    sha256; folders are keyed by their files), for :func:`entries`' ``names``."""
    names: dict[str, str] = {}
    for found in hub.list_cached():
        if found.sha256:
            names[source_key("", found.sha256)] = found.name
        elif found.format == "gguf" and (sha := remembered_content_id(found.path)):
            names[source_key("", sha)] = found.name
        elif found.format == "hf":
            names[source_key(found.path)] = found.name
    return names


def _entry(kind: str, paths: list[Path], model: str = "") -> CacheEntry:
    size, used = _measure(paths)
    return CacheEntry(kind, paths[0], size, used, model, tuple(paths))


def entries(root: Path | None = None, names: dict[str, str] | None = None) -> list[CacheEntry]:
    """Everything in the cache, one entry per thing :func:`clean` deletes as a whole.

    Args:
        root: The cache folder (default :func:`~pie_core.models.weights_cache.cache_dir`).
        names: Weights key → model name for models the cache holds no record of (Hugging Face
            folders, GGUFs named by their sha256 elsewhere).
    """
    root = root if root is not None else cache_dir()
    if not root.is_dir():
        return []
    names = _model_names(root, names or {})
    by_onnx = {hashlib.sha256(k.encode()).hexdigest()[:24]: n for k, n in names.items()}

    def owner(name: str, table: dict[str, str] = names, width: int = 32) -> str:
        return table.get(name[:width], "")

    found: list[CacheEntry] = []
    for top in sorted(root.iterdir()):
        kids = sorted(top.iterdir()) if top.is_dir() and not top.is_symlink() else []
        if top.name == "models" and kids:
            files = [k for k in kids if not k.name.endswith(".stamp")]
            builtin = {m.filename: m.name for m in EMBEDDED_MODELS.values()}
            for f in files:
                stamp = f.with_name(f.name + ".stamp")
                found.append(_entry("models", [f, stamp] if stamp.exists() else [f], builtin.get(f.name, "")))
        elif top.name in ("weights", "tokenizers", "identities") and kids:
            found += [_entry(top.name, [k], owner(k.name.lstrip(".")) if top.name != "identities" else "")
                      for k in kids]
        elif top.name == "torch" and kids:
            for k in kids:
                if k.name == "ext":
                    found += [_entry("kernels", [e]) for e in sorted(k.iterdir())]
                else:
                    found.append(_entry("torch", [k], owner(k.name)))
        elif top.name == "onnx" and kids:
            found += [_entry("onnx", [k], owner(k.name, by_onnx, 24)) for k in kids]
        elif top.name == "wasm" and kids:
            groups: dict[str, list[Path]] = {}
            for k in kids:
                groups.setdefault(k.name.split(".")[0], []).append(k)
            found += [_entry("wasm", group) for group in groups.values()]
        elif top.is_dir() and not top.is_symlink() and not kids:
            continue
        else:
            found.append(_entry("other", [top]))
    return found


def parse_age(text: str) -> float:
    """Seconds in ``30d``, ``12h``, ``90m``, ``2w`` or ``45s`` (a bare number counts days).

    Raises:
        InvalidInput: Anything else.
    """
    match = _AGE.match(text)
    if match is None:
        raise InvalidInput(f"--older-than takes a number with a unit (30d, 12h, 90m, 2w; a bare number is days), "
                           f"got {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def clean(kinds: Iterable[str] = (), older_than: float | None = None, model: str | None = None,
          dry_run: bool = False, root: Path | None = None, names: dict[str, str] | None = None) -> list[CacheEntry]:
    """Delete the entries of the given kinds (all when none), unused for ``older_than`` seconds
    (any age when None), derived from ``model`` (any when None).

    Links are deleted, never followed. ``names`` is as for :func:`entries`. Returns the entries
    deleted (or that would be, with ``dry_run``).

    Raises:
        InvalidInput: An unknown kind.
    """
    wanted = set(kinds)
    if unknown := sorted(wanted - set(KINDS)):
        raise InvalidInput(f"unknown cache kind {unknown[0]!r}; kinds: {', '.join(KINDS)}")
    cutoff = time.time() - older_than if older_than is not None else None
    chosen = [e for e in entries(root, names)
              if (not wanted or e.kind in wanted) and (cutoff is None or e.last_used < cutoff)
              and (model is None or e.model == model)]
    if not dry_run:
        delete(chosen)
    return chosen


def delete(chosen: Iterable[CacheEntry]) -> None:
    """Delete entries (links are deleted, never followed)."""
    for entry in chosen:
        for path in entry.paths:
            if path.is_symlink() or path.is_file():
                path.unlink(missing_ok=True)
            elif path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
