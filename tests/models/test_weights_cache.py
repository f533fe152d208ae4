"""The float32 weights cache: miss stores, hit memory-maps, partial entries never count."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from pie_core.models.weights_cache import Allocator, WeightsCache, cache_dir, source_key


def _weights(allocate: Allocator | None = None) -> Iterator[tuple[str, np.ndarray]]:
    """Odd tensors go into the cache's own arrays, even ones are made here."""
    rng = np.random.default_rng(0)
    for i in range(5):
        name, data = f"blk.{i}.ffn_up.weight", rng.standard_normal((8, 4)).astype(np.float32)
        if allocate is not None and i % 2:
            out = allocate(name, data.shape)
            out[...] = data
            data = out
        yield name, data


def test_miss_stores_and_hit_maps_the_same_arrays(tmp_path: Path) -> None:
    cache = WeightsCache(tmp_path)
    produced = 0

    def produce(allocate: Allocator) -> Iterator[tuple[str, np.ndarray]]:
        nonlocal produced
        produced += 1
        return _weights(allocate)

    first = [(n, a.copy()) for n, a in cache.weights("k", produce)]
    assert all(not a.flags.writeable for _, a in cache.weights("other", produce))
    assert cache.has("k") and produced == 2
    second = list(cache.weights("k", produce))
    assert produced == 2
    assert [n for n, _ in first] == [n for n, _ in second]
    for (_, a), (_, b) in zip(first, second):
        assert isinstance(b, np.memmap) and not b.flags.writeable
        np.testing.assert_array_equal(a, b)


def test_abandoned_iteration_leaves_no_entry(tmp_path: Path) -> None:
    cache = WeightsCache(tmp_path)
    it = cache.weights("k", _weights)
    next(it)
    it.close()
    assert not cache.has("k") and list(cache.root.iterdir()) == []


def test_key_follows_size_and_mtime_unless_a_content_id_is_given(tmp_path: Path) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"abc")
    key = source_key(f)
    os.utime(f, ns=(1, 1))
    assert source_key(f) != key
    assert source_key(f, "digest") == source_key(tmp_path / "elsewhere", "digest")


def test_cache_dir_honours_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PIE_CACHE_DIR", str(tmp_path))
    assert cache_dir() == tmp_path
    monkeypatch.delenv("PIE_CACHE_DIR")
    assert cache_dir() == Path.home() / ".cache" / "pie"


def test_clear_removes_everything(tmp_path: Path) -> None:
    cache = WeightsCache(tmp_path)
    list(cache.weights("k", _weights))
    assert cache.clear() > 0 and not cache.has("k")


def _disk_full(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(fd: int, offset: int, length: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", refuse)


def test_a_full_disk_warns_and_still_yields_every_weight(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Writing through a sparse memory map on a full disk is SIGBUS (CI died of it): the blocks
    are reserved first, and a refusal turns into arrays in memory and no entry."""
    _disk_full(monkeypatch)
    cache = WeightsCache(tmp_path)
    with pytest.warns(RuntimeWarning, match="not written"):
        got = [(n, a.copy()) for n, a in cache.weights("k", _weights)]
    assert [(n, a.tolist()) for n, a in got] == [(n, a.tolist()) for n, a in _weights()]
    assert not cache.has("k")
    assert not any(cache.root.iterdir())


def test_a_full_disk_gives_transient_weights_in_memory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _disk_full(monkeypatch)
    cache = WeightsCache(tmp_path)
    got = list(cache.weights("k", _weights, keep=False))
    assert [(n, a.tolist()) for n, a in got] == [(n, a.tolist()) for n, a in _weights()]
    assert not any(isinstance(a, np.memmap) for _, a in got)
    assert not any(cache.root.iterdir())


def test_mapped_files_have_their_blocks_reserved(tmp_path: Path) -> None:
    """No hole is left for a later page write to fault on."""
    cache = WeightsCache(tmp_path)
    holes = []

    def produce(allocate: Allocator) -> Iterator[tuple[str, np.ndarray]]:
        out = allocate("big", (1 << 20,))  # 4 MiB, not yet written
        (file,) = next(cache.root.iterdir()).glob("*.npy")
        holes.append(file.stat().st_blocks * 512 < file.stat().st_size)
        out[:] = 1.0
        yield "big", out

    assert [n for n, _ in cache.weights("k", produce)] == ["big"]
    assert holes == [False]
