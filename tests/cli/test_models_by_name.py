"""Models by Hugging Face repo id, from a pre-filled Hugging Face cache (the layout
huggingface_hub writes: blobs named by their sha256, snapshots of links, refs/main), with
``HF_HUB_OFFLINE=1`` so that nothing here can reach the network: ``--model OWNER/NAME``
(safetensors or GGUF, ``:FILE`` or ``:TAG`` for one GGUF of several), ``pie model pull``
offline, ``pie model rm``, ``pie model list`` with sizes, and a missing path that says so."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from pie_core.models import registry
from pie_core.models.registry import resolve_model
from tiny_gguf import write_tiny_hf_folder, write_tiny_qwen2

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hf_cache(home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """``put(repo_id, {name: source file})`` fills a private Hugging Face cache as the Hub would."""
    root = tmp_path / "hf-hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def put(repo_id: str, files: dict[str, Path]) -> Path:
        repo = root / f"models--{repo_id.replace('/', '--')}"
        snapshot = repo / "snapshots" / COMMIT
        (repo / "blobs").mkdir(parents=True, exist_ok=True)
        snapshot.mkdir(parents=True, exist_ok=True)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(COMMIT)
        for name, source in files.items():
            data = source.read_bytes()
            blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
            blob.write_bytes(data)
            (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
        return snapshot

    return put


@pytest.fixture
def two_ggufs(tmp_path: Path) -> dict[str, Path]:
    return {"tiny-q4_k_m.gguf": write_tiny_qwen2(tmp_path / "a.gguf", seed=1),
            "tiny-q8_0.gguf": write_tiny_qwen2(tmp_path / "b.gguf", seed=2)}


def test_a_cached_gguf_repo_runs_by_its_id_without_hashing_the_file(pie, hf_cache, tiny_model, monkeypatch) -> None:
    snapshot = hf_cache("someone/Tiny-GGUF", {"tiny-q4_k_m.gguf": tiny_model})
    monkeypatch.setattr(registry, "content_id", lambda *a, **k: pytest.fail("hashed a file the cache names by its sha256"))
    source = resolve_model("someone/Tiny-GGUF")
    assert source.format == "gguf" and source.path == (snapshot / "tiny-q4_k_m.gguf").resolve()
    r = pie("run", "hello-world", "--backend", "cpu", "--model", "someone/Tiny-GGUF", "--", "--name", "hub")
    assert r.code == 0 and r.out.strip() == "hello hub", r.err
    assert r.engine.pools_whole()


def test_a_cached_safetensors_repo_runs_as_a_hugging_face_folder(pie, hf_cache, tmp_path) -> None:
    folder = write_tiny_hf_folder(tmp_path / "tiny-hf")
    snapshot = hf_cache("someone/Tiny", {f.name: f for f in folder.iterdir()})
    source = resolve_model("someone/Tiny")
    assert source.format == "hf" and source.path == snapshot.resolve() and source.spec.arch == "qwen2"
    r = pie("run", "hello-world", "--backend", "cpu", "--model", "someone/Tiny")
    assert r.code == 0 and r.out.strip() == "hello world", r.err


def test_one_gguf_of_several_is_named_by_file_or_by_quantisation_tag(pie, hf_cache, two_ggufs) -> None:
    snapshot = hf_cache("someone/Tiny-GGUF", two_ggufs)
    q4, q8 = (snapshot / "tiny-q4_k_m.gguf").resolve(), (snapshot / "tiny-q8_0.gguf").resolve()
    assert resolve_model("someone/Tiny-GGUF:q8_0").path == q8
    assert resolve_model("someone/Tiny-GGUF:tiny-q4_k_m.gguf").path == q4
    assert resolve_model("someone/tiny-gguf:Q8_0").path == q8  # the Hub ignores case
    r = pie("run", "hello-world", "--dummy", "--model", "someone/Tiny-GGUF")
    assert r.code == 1 and len(r.err.strip().splitlines()) == 1
    assert "has 2 cached GGUF files (tiny-q4_k_m.gguf, tiny-q8_0.gguf); name one" in r.err


def test_a_repo_that_is_not_cached_says_how_to_pull_it(pie, hf_cache) -> None:
    r = pie("run", "hello-world", "--dummy", "--model", "someone/Missing")
    assert r.code == 1 and len(r.err.strip().splitlines()) == 1
    assert "someone/Missing is not in the Hugging Face cache" in r.err
    assert "pie model pull someone/Missing" in r.err and "unknown model" not in r.err


@pytest.mark.parametrize("path", ["./missing.gguf", "missing.gguf", "/nowhere/model.gguf", "~/nowhere.gguf"])
def test_a_missing_path_says_no_such_file(pie, hf_cache, path) -> None:
    r = pie("run", "hello-world", "--dummy", "--model", path)
    assert r.code == 1 and r.err.strip() == f"error: no such file: {path}"


def test_pull_offline_finds_a_cached_model_and_fails_in_one_line_otherwise(pie, hf_cache, two_ggufs) -> None:
    hf_cache("someone/Tiny-GGUF", two_ggufs)
    r = pie("model", "pull", "someone/Tiny-GGUF", "--file", "tiny-q8_0.gguf")
    assert r.code == 0, r.err
    assert "someone/Tiny-GGUF:tiny-q8_0.gguf" in r.out and "--model someone/Tiny-GGUF:tiny-q8_0.gguf" in r.out
    r = pie("model", "pull", "someone/Elsewhere")
    assert r.code == 1 and len(r.err.strip().splitlines()) == 1
    assert "someone/Elsewhere is not in the Hugging Face cache" in r.err and "HF_HUB_OFFLINE=1" in r.err


def test_pull_refuses_a_file_in_the_repo_id(pie, hf_cache) -> None:
    r = pie("model", "pull", "someone/Tiny-GGUF:q8_0")
    assert r.code == 1 and "a file goes in --file" in r.err


def test_pull_without_the_hub_reachable_is_one_line(pie, hf_cache, monkeypatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    r = pie("model", "pull", "someone/Elsewhere")
    assert r.code == 1 and len(r.err.strip().splitlines()) == 1, r.err
    assert "cannot reach the Hugging Face Hub" in r.err


def test_list_shows_cached_repos_with_their_sizes_and_rm_deletes_them(pie, hf_cache, two_ggufs, tmp_path) -> None:
    hf_cache("someone/Tiny-GGUF", two_ggufs)
    hf_cache("someone/Tiny", {f.name: f for f in write_tiny_hf_folder(tmp_path / "hf").iterdir()})
    rows = {r["name"]: r for r in json.loads(pie("model", "list", "--json").out)}
    q8 = rows["someone/Tiny-GGUF:tiny-q8_0.gguf"]
    assert q8["size"] == two_ggufs["tiny-q8_0.gguf"].stat().st_size and q8["origin"] == "hugging face cache"
    assert q8["arch"] == "qwen2" and q8["available"]
    assert rows["someone/Tiny"]["format"] == "hf" and rows["someone/Tiny"]["size"] > 0
    text = pie("model", "list").out
    assert "someone/Tiny-GGUF:tiny-q4_k_m.gguf" in text and "hugging face cache" in text
    r = pie("model", "rm", "someone/Tiny-GGUF")
    assert r.code == 0 and "removed someone/Tiny-GGUF" in r.out
    rows = {r["name"] for r in json.loads(pie("model", "list", "--json").out)}
    assert "someone/Tiny" in rows and not any(n.startswith("someone/Tiny-GGUF") for n in rows)
    r = pie("model", "rm", "someone/Tiny-GGUF")
    assert r.code == 1 and "not in the Hugging Face cache" in r.err


def test_rm_also_deletes_what_pie_derived_from_the_model(pie, hf_cache, tmp_path) -> None:
    model = write_tiny_qwen2(tmp_path / "c.gguf", seed=3)  # weights no other test of this process loaded
    hf_cache("someone/Tiny-GGUF", {"tiny-f32.gguf": model})
    assert pie("run", "hello-world", "--backend", "cpu", "--model", "someone/Tiny-GGUF").code == 0
    derived = [e for e in json.loads(pie("cache", "list", "--json").out) if e["model"] == "someone/Tiny-GGUF"]
    assert any(e["kind"] == "weights" for e in derived)
    r = pie("model", "rm", "someone/Tiny-GGUF")
    assert r.code == 0 and "what Pie derived from it" in r.out
    assert not any(e["model"] == "someone/Tiny-GGUF" for e in json.loads(pie("cache", "list", "--json").out))
