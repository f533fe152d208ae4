"""``pie cache list`` names what Pie keeps by kind and model with sizes; ``pie cache clean``
deletes by kind, age and model, never follows a link, and deletes nothing on ``--dry-run``."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from pie_core.models.weights_cache import cache_dir


@pytest.fixture
def filled(pie, home: Path, tiny_model: Path, tmp_path: Path) -> dict[str, Path]:
    """A cache after one real load of the tiny model on the cpu backend (its float32 weights,
    its tokenizer and its fingerprint), plus what the other kinds leave."""
    r = pie("run", "hello-world", "--backend", "cpu", "--model", str(tiny_model))
    assert r.code == 0, r.err
    root = cache_dir()
    (key,) = [p.name for p in (root / "weights").iterdir()]
    torch_file = root / "torch" / f"{key}-bfloat16-q4-none-g32-v4.safetensors"
    torch_file.parent.mkdir()
    torch_file.write_bytes(b"t" * 3000)
    kernels = root / "torch" / "ext" / "0123abcd"
    kernels.mkdir(parents=True)
    (kernels / "q4.so").write_bytes(b"k" * 100)
    (root / "wasm").mkdir()
    for name in ("abc.wasm", "abc.wasmtime-49.0.0.cwasm"):
        (root / "wasm" / name).write_bytes(b"w" * 500)
    (root / "wasm" / "abc.stdlib").mkdir()
    (root / "wasm" / "abc.stdlib" / "os.py").write_bytes(b"s" * 200)
    outside = tmp_path / "outside.gguf"
    outside.write_bytes(b"x" * 10)
    (root / "models").mkdir()
    (root / "models" / "linked.gguf").symlink_to(outside)
    return {"root": root, "key": Path(key), "torch": torch_file, "outside": outside}


def _listed(pie) -> list[dict]:
    r = pie("cache", "list", "--json")
    assert r.code == 0, r.err
    return json.loads(r.out)


def test_list_names_each_kind_and_the_model_it_came_from(pie, filled, tiny_model) -> None:
    by_kind: dict[str, list[dict]] = {}
    for e in _listed(pie):
        by_kind.setdefault(e["kind"], []).append(e)
    assert {"weights", "identities", "torch", "kernels", "wasm", "models"} <= set(by_kind)
    (weights,) = by_kind["weights"]
    assert weights["model"] == tiny_model.name and weights["size"] > 10_000  # float32 copy of the GGUF
    assert by_kind["torch"][0]["model"] == tiny_model.name  # named through the weights key
    for tokenizer in by_kind.get("tokenizers", []):  # written by the first load in this process only
        assert tokenizer["model"] == tiny_model.name
    (wasm,) = by_kind["wasm"]  # a component is its .wasm, its compiled form and its stdlib folder
    assert wasm["size"] == 1200 and len(wasm["paths"]) == 3
    text = pie("cache", "list").out
    for word in ("weights", "torch", "kernels", "wasm", tiny_model.name, "total"):
        assert word in text


def test_clean_by_kind_leaves_the_other_kinds(pie, filled) -> None:
    r = pie("cache", "clean", "--kind", "weights", "--kind", "torch")
    assert r.code == 0 and "freed" in r.out
    kinds = {e["kind"] for e in _listed(pie)}
    assert "weights" not in kinds and "torch" not in kinds and {"kernels", "wasm", "identities"} <= kinds


def test_clean_older_than_keeps_what_was_used_recently(pie, filled) -> None:
    old = time.time() - 40 * 86400
    os.utime(filled["torch"], (old, old))
    r = pie("cache", "clean", "--older-than", "30d")
    assert r.code == 0 and "deleted torch" in r.out
    kinds = {e["kind"] for e in _listed(pie)}
    assert "torch" not in kinds and "weights" in kinds


def test_clean_by_model_and_dry_run(pie, filled, tiny_model) -> None:
    before = _listed(pie)
    r = pie("cache", "clean", "--model", tiny_model.name, "--dry-run")
    assert r.code == 0 and "would free" in r.out
    assert _listed(pie) == before
    r = pie("cache", "clean", "--model", tiny_model.name)
    assert r.code == 0
    left = _listed(pie)
    assert not any(e["model"] == tiny_model.name for e in left) and {"kernels", "wasm"} <= {e["kind"] for e in left}


def test_clean_deletes_links_not_what_they_point_to(pie, filled) -> None:
    r = pie("cache", "clean", "--kind", "models")
    assert r.code == 0
    assert filled["outside"].read_bytes() == b"x" * 10
    assert not (filled["root"] / "models" / "linked.gguf").is_symlink()


def test_a_bad_age_is_one_line(pie, filled) -> None:
    r = pie("cache", "clean", "--older-than", "soon")
    assert r.code == 1 and len(r.err.strip().splitlines()) == 1 and "30d" in r.err


def test_an_empty_cache_says_so(pie, home) -> None:
    r = pie("cache", "list")
    assert r.code == 0 and "is empty" in r.out
