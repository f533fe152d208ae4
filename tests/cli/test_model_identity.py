"""``--model`` takes a GGUF path or a Hugging Face folder besides a name, and the weights cache is
keyed by the file's content: the same GGUF reached by another path, a symlink or as a copy
loads from the one cache entry instead of building a second (entries are ~5x the GGUF)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from pie_core.models import registry, weights_cache
from pie_core.models.default_model import DEFAULT_MODEL, assembled_path, stamp_ok
from pie_core.models.registry import resolve_model
from pie_core.models.weights_cache import WeightsCache, content_id, source_key
from tiny_gguf import write_tiny_qwen2


def _entries() -> list[str]:
    root = WeightsCache().root
    return sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) if root.is_dir() else []


def _load_on_cpu(pie, model: str) -> None:
    r = pie("run", "hello-world", "--backend", "cpu", "--model", model, "--", "--name", "m")
    assert r.code == 0 and r.out.strip() == "hello m", r.err
    assert r.engine.pools_whole()


def test_run_help_says_model_takes_a_name_a_gguf_or_a_hugging_face_folder(pie, capsys):
    with pytest.raises(SystemExit):
        pie("run", "--help")
    text = " ".join(capsys.readouterr().out.split())
    assert "a model name (see 'pie model list'), a .gguf file or a Hugging Face folder" in text


def test_the_same_gguf_by_other_paths_shares_one_cache_entry(pie, home, tiny_model, tmp_path):
    _load_on_cpu(pie, str(tiny_model))
    (entry,) = _entries()
    manifest = WeightsCache().entry(entry) / "manifest.json"
    written = manifest.stat().st_mtime_ns
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "model.gguf").symlink_to(tiny_model)
    shutil.copy(tiny_model, tmp_path / "copy.gguf")  # a new inode and mtime, the same bytes
    relative = os.path.relpath(tiny_model, tmp_path)
    for other in ("links/model.gguf", "./links/../links/model.gguf", relative, "copy.gguf", str(tmp_path / "copy.gguf")):
        _load_on_cpu(pie, other)
        assert _entries() == [entry], other
    assert manifest.stat().st_mtime_ns == written  # read back, never rebuilt


def test_different_weights_behind_the_same_header_get_their_own_entry(pie, home, tmp_path):
    a = write_tiny_qwen2(tmp_path / "a.gguf", seed=1)
    b = write_tiny_qwen2(tmp_path / "b.gguf", seed=2)
    assert a.stat().st_size == b.stat().st_size
    assert resolve_model(str(a)).cache_key != resolve_model(str(b)).cache_key


def test_rewriting_the_file_changes_its_key(home, tmp_path):
    path = write_tiny_qwen2(tmp_path / "m.gguf", seed=1)
    before = resolve_model(str(path)).cache_key
    write_tiny_qwen2(path, seed=2)
    os.utime(path, ns=(1, 1))  # a different mtime even on a coarse clock
    assert resolve_model(str(path)).cache_key != before


def test_the_digest_is_remembered_so_a_second_load_does_not_hash(home, tmp_path, monkeypatch: pytest.MonkeyPatch):
    path = write_tiny_qwen2(tmp_path / "m.gguf")
    first = content_id(path)
    (memo,) = (weights_cache.cache_dir() / "identities").iterdir()
    assert json.loads(memo.read_text())["sha256"] == first

    def no_hashing(*args, **kwargs):
        raise AssertionError("hashed again")

    monkeypatch.setattr(weights_cache.hashlib, "sha256", no_hashing)
    assert content_id(path) == first
    assert content_id(tmp_path / "." / "m.gguf") == first


def test_key_of_a_gguf_is_its_sha256(home, tiny_model):
    import hashlib

    digest = hashlib.sha256(tiny_model.read_bytes()).hexdigest()
    assert resolve_model(str(tiny_model)).cache_key == source_key(tiny_model, digest)


@pytest.mark.skipif(not stamp_ok(assembled_path(DEFAULT_MODEL), DEFAULT_MODEL),
                    reason="the default model is not assembled in the user's cache")
def test_the_default_model_by_its_file_path_has_the_default_models_key_without_hashing(monkeypatch, tmp_path):
    monkeypatch.setenv("PIE_HOME", str(tmp_path / "home"))  # the user's cache stays: it holds the assembled file
    file = assembled_path(DEFAULT_MODEL)
    (tmp_path / "link.gguf").symlink_to(file)

    def no_hashing(*args, **kwargs):
        raise AssertionError("hashed a verified built-in model")

    monkeypatch.setattr(registry, "content_id", no_hashing)
    by_name = resolve_model(DEFAULT_MODEL.name).cache_key
    assert resolve_model(str(file)).cache_key == by_name
    assert resolve_model(str(tmp_path / "link.gguf")).cache_key == by_name


def test_a_path_that_is_not_a_model_is_one_line(pie, tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    r = pie("run", "hello-world", "--dummy", "--model", "notes.txt")
    assert r.code == 1 and "notes.txt is not a GGUF file" in r.err
    r = pie("run", "hello-world", "--dummy", "--model", str(tmp_path))
    assert r.code == 1 and "is a folder without config.json and *.safetensors" in r.err
