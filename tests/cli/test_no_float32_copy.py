"""A backend that keeps its own layout of the weights (``BackendInfo.keeps_derived_weights``,
contract 1.4: torch, tensorrt) gets them dequantised once, and no float32 copy of the GGUF stays
in the cache; a backend that reads float32 weights on every load (cpu) still gets the cache."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from pie_backend_cpu import CpuBackend
from pie_core.backend_kit import BackendInfo, hookimpl
from pie_core.engine import engine as engine_module
from pie_core.engine.engine import Engine
from pie_core.models.registry import resolve_model
from pie_core.models.weights_cache import WeightsCache
from pie_core.plugins import bind_plugin


class KeepsItsOwnLayout(CpuBackend):
    """The cpu backend, declaring what torch declares; records the weights it was handed."""

    seen: dict[str, np.ndarray] = {}

    @hookimpl
    def pie_backend_info(self) -> BackendInfo:
        return dataclasses.replace(super().pie_backend_info(), keeps_derived_weights=True)

    @hookimpl
    def pie_backend_load_model(self, spec, weights, options):
        def record():
            for name, array in weights:
                KeepsItsOwnLayout.seen[name] = np.array(array)  # a copy: the map may go
                yield name, array
        return super().pie_backend_load_model(spec, record(), options)


def _leftovers(root: Path) -> list[Path]:
    return sorted(root.rglob("*")) if root.is_dir() else []


def test_a_backend_with_its_own_layout_leaves_no_float32_copy(home, tiny_model, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_module, "bind_backend", lambda name: bind_plugin(KeepsItsOwnLayout(), name))
    KeepsItsOwnLayout.seen.clear()
    engine = Engine("cpu")
    engine.load(str(tiny_model))
    source = resolve_model(str(tiny_model))
    assert not WeightsCache().has(source.cache_key)
    assert _leftovers(WeightsCache().root) == []  # no entry, no temporary folder
    reference = dict(source.weights(use_cache=False))
    assert set(KeepsItsOwnLayout.seen) == set(reference)
    for name, array in reference.items():
        np.testing.assert_array_equal(KeepsItsOwnLayout.seen[name], array)


def test_the_cpu_backend_still_gets_the_cache_and_a_kept_entry_serves_everyone(home, tiny_model, monkeypatch) -> None:
    Engine("cpu").load(str(tiny_model))
    key = resolve_model(str(tiny_model)).cache_key
    assert WeightsCache().has(key)
    monkeypatch.setattr(engine_module, "bind_backend", lambda name: bind_plugin(KeepsItsOwnLayout(), name))
    KeepsItsOwnLayout.seen.clear()
    Engine("cpu").load(str(tiny_model))
    assert WeightsCache().has(key) and KeepsItsOwnLayout.seen  # read from the entry, which stays


def test_torch_and_tensorrt_declare_it() -> None:
    from pie_core.plugins import available_backends, bind_backend

    for name in ("torch", "tensorrt"):
        if name in available_backends():
            assert bind_backend(name).hook.pie_backend_info().keeps_derived_weights, name
    assert not bind_backend("cpu").hook.pie_backend_info().keeps_derived_weights


def test_the_torch_backend_on_a_gguf_leaves_its_layout_and_no_float32_copy(pie, tiny_model, monkeypatch) -> None:
    from pie_core.plugins import available_backends

    if "torch" not in available_backends():
        pytest.skip("the torch backend is not installed")
    from pie_backend_torch import native

    monkeypatch.setenv("PIE_TORCH_NATIVE", "0")  # torch's own kernels: no compiler needed
    monkeypatch.setattr(native, "_state", {})  # and their absence is not remembered past this test
    for _ in range(2):  # the second load comes from the torch backend's store
        r = pie("run", "hello-world", "--backend", "torch", "--model", str(tiny_model), "--", "--name", "t")
        assert r.code == 0 and r.out.strip() == "hello t", r.err
        assert r.engine.pools_whole()
    root = WeightsCache().root.parent
    assert _leftovers(WeightsCache().root) == []
    assert len(list((root / "torch").glob("*.safetensors"))) == 1
