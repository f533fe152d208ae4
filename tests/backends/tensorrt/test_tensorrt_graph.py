"""Edges of the ONNX graph that the conformance suite's cases do not reach, checked against the
cpu backend on the same tiny random model."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.batches import kv_request, probe_logits
from conformance.models import random_weights, tiny_spec
from pie_backend_cpu import CpuBackend
from pie_backend_tensorrt import TensorrtBackend
from pie_core.backend_kit import BackendOptions
from pie_core.scheduler.assemble import assemble

PAGE = 16


@pytest.fixture(scope="module")
def gemma_pair():
    spec = tiny_spec("gemma3")
    cpu, ort = CpuBackend(), TensorrtBackend()
    cpu.pie_backend_load_model(spec, random_weights(spec), BackendOptions(kv_pages=8))
    ort.pie_backend_load_model(spec, random_weights(spec), BackendOptions(kv_pages=8, extra={"provider": "cpu"}))
    return spec, cpu, ort


def _both(pair, reqs):
    spec, cpu, ort = pair
    batch = assemble(reqs, spec.vocab_size)
    outputs = cpu.pie_backend_forward(batch), ort.pie_backend_forward(batch)
    return tuple(probe_logits(out, reqs) if len(out.probes) else None for out in outputs)


def test_a_masked_row_with_nothing_inside_the_sliding_window_matches_the_reference(gemma_pair):
    spec = gemma_pair[0]
    tokens = np.random.default_rng(3).integers(0, spec.vocab_size, 13)
    _both(gemma_pair, [kv_request(tokens[:12], [2], PAGE)])
    mask = np.zeros((1, 13), dtype=bool)
    mask[0, 0] = True  # only position 0: outside the window of 5 at position 12, inside full attention
    ref, ours = _both(gemma_pair, [kv_request(tokens[12:], [2], PAGE, start=12, mask=mask, probe_all=True)])
    assert spec.sliding_window is not None and 12 - spec.sliding_window >= 0
    np.testing.assert_allclose(ours[0], ref[0], atol=1e-4, rtol=1e-4)


def test_a_batch_naming_an_adapter_is_refused_before_it_writes(gemma_pair):
    spec, _, ort = gemma_pair
    batch = assemble([kv_request([1, 2], [5], PAGE)], spec.vocab_size)
    before = ort._session.take(0, 0, np.arange(5 * PAGE, 5 * PAGE + 2)).copy()
    bad = type(batch)(**{f: getattr(batch, f) for f in batch.__dataclass_fields__} | {"adapter_ids": np.array([0], np.int32)})
    with pytest.raises(ValueError, match="no adapters"):
        ort.pie_backend_forward(bad)
    np.testing.assert_array_equal(ort._session.take(0, 0, np.arange(5 * PAGE, 5 * PAGE + 2)), before)


def test_an_unnamed_graph_too_big_for_memory_goes_through_a_folder_that_is_removed(monkeypatch, tmp_path):
    import tempfile

    from pie_backend_tensorrt import export

    monkeypatch.setattr(export, "_IN_MEMORY_BYTES", 0)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    spec = tiny_spec("qwen2")
    backend = TensorrtBackend()
    backend.pie_backend_load_model(spec, random_weights(spec), BackendOptions(kv_pages=4, extra={"provider": "cpu"}))
    out = backend.pie_backend_forward(assemble([kv_request([1, 2, 3], [0], PAGE, probe_all=True)], spec.vocab_size))
    assert len(out.probes) == 3
    assert list(tmp_path.iterdir()) == [], "the temporary export was left behind"
