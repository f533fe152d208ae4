"""The shared pieces of ``pie_core.backend_kit``: batch checks, RoPE tables and pool sizes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import pie_core.backend_kit as kit
from conformance.batches import kv_request
from conformance.models import tiny_spec
from pie_core.backend_kit import (
    DEFAULT_HOST_PAGES,
    MAX_BUDGET_PAGES,
    BackendOptions,
    RopeConfig,
    check_batch,
    device_pool_pages,
    host_pool_pages,
    inverse_frequencies,
    layer_frequencies,
)
from pie_core.scheduler.assemble import assemble

VOCAB, PAGES, PAGE_SIZE = 32, 8, 4


def _batch():
    """Two requests: five tokens over pages 0-1, one token on page 2; every row probed."""
    requests = [kv_request([1, 2, 3, 4, 6], [0, 1], PAGE_SIZE, probe_all=True),
                kv_request([5], [2], PAGE_SIZE, probe_all=True)]
    return assemble(requests, VOCAB)


def _with(**changes):
    return dataclasses.replace(_batch(), **changes)


def _i32(*values):
    return np.array(values, dtype=np.int32)


def test_the_kit_exports_what_its_all_names():
    assert [name for name in kit.__all__ if not hasattr(kit, name)] == []
    assert kit.lora.TARGETS and kit.DummyBackend.PIE_CONTRACT_VERSION == kit.CONTRACT_VERSION


def test_a_batch_the_core_built_passes():
    check_batch(_batch(), VOCAB, PAGES, PAGE_SIZE)


def test_negative_positions_are_refused_naming_the_index():
    with pytest.raises(ValueError, match=r"positions must be >= 0, got -1 at index 4"):
        check_batch(_with(positions=_i32(0, 1, 2, 3, -1, 0)), VOCAB, PAGES, PAGE_SIZE)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"token_ids": _i32(), "positions": _i32(), "kv_write_slots": _i32(), "qo_indptr": _i32(0, 0, 0)},
         "at least one request and one token"),
        ({"positions": _i32(0, 1, 2, 3, 4)}, "positions has 5 entries for 6 tokens"),
        ({"kv_write_slots": _i32(0, 1, 2, 3, 4, 0, 0)}, "kv_write_slots has 7 entries for 6 tokens"),
        ({"kv_page_indptr": _i32(0, 3)}, "kv_page_indptr has 2 entries for 2 requests"),
        ({"mask_indptr": np.zeros(2, dtype=np.int64)}, "mask_indptr has 2 entries for 2 requests"),
        ({"kv_last_page_len": _i32(1)}, "kv_last_page_len has 1 entries for 2 requests"),
        ({"qo_indptr": _i32(0, 6, 6)}, "give each request >= 1 token"),
        ({"qo_indptr": _i32(1, 5, 6)}, "qo_indptr must start at 0"),
        ({"token_ids": _i32(1, 2, VOCAB, 4, 6, 5)}, rf"token ids must be >= 0 and < {VOCAB} .*got {VOCAB} at index 2"),
        ({"token_ids": _i32(1, -2, 3, 4, 6, 5)}, "token ids must be >= 0"),
        ({"kv_page_indices": _i32(0, PAGES, 2)}, rf"kv_page_indices must be >= 0 and < {PAGES} .*at index 1"),
        ({"kv_page_indices": _i32(0, -1, 2)}, "kv_page_indices must be >= 0"),
        ({"kv_page_indptr": _i32(0, 2, 2)}, "kv_page_indptr must start at 0 and end at the 3 entries"),
        ({"kv_page_indices": _i32(0, 1), "kv_page_indptr": _i32(0, 2, 2)}, "at least one KV page"),
        ({"mask_indptr": np.array([0, 0, 5], dtype=np.int64)}, "mask_indptr must start at 0, never decrease"),
        ({"kv_last_page_len": _i32(0, 1)}, rf"kv_last_page_len must be >= 1 and <= {PAGE_SIZE}"),
        ({"kv_last_page_len": _i32(1, PAGE_SIZE + 1)}, rf"kv_last_page_len must be >= 1 and <= {PAGE_SIZE}"),
        ({"probe_rows": _i32(0, 1, 2, 3, 4, 6)}, "probe_rows must be >= 0 and < 6 .*got 6 at index 5"),
        ({"probe_rows": _i32(0, -1, 2, 3, 4, 5)}, "probe_rows must be >= 0"),
    ],
)
def test_an_inconsistent_batch_is_refused_naming_the_array(changes, message):
    with pytest.raises(ValueError, match=message):
        check_batch(_with(**changes), VOCAB, PAGES, PAGE_SIZE)


def test_sample_rows_outside_the_batch_are_refused():
    with pytest.raises(ValueError, match="sample_rows must be >= 0 and < 6 .*got 7 at index 0"):
        check_batch(_with(sample_rows=_i32(7)), VOCAB, PAGES, PAGE_SIZE)


def test_sliding_layers_share_the_full_table_without_a_local_base():
    spec = tiny_spec("llama")
    full, sliding = layer_frequencies(spec)
    assert sliding is full and full.dtype == np.float64 and full.shape == (spec.head_dim // 2,)
    np.testing.assert_array_equal(full, inverse_frequencies(spec.head_dim, spec.rope.theta, spec.rope))


def test_sliding_layers_use_plain_rope_at_the_local_base():
    spec = tiny_spec("llama")
    spec = dataclasses.replace(spec, rope=dataclasses.replace(spec.rope, local_theta=10000.0))
    full, sliding = layer_frequencies(spec)
    np.testing.assert_array_equal(sliding, inverse_frequencies(spec.head_dim, 10000.0, None))
    assert not np.array_equal(full, sliding)  # llama3 scaling applies to full layers only


def test_rope_scaling_kinds():
    plain = inverse_frequencies(8, 10000.0, None)
    np.testing.assert_allclose(plain, 1.0 / 10000.0 ** (np.arange(0, 8, 2) / 8))
    np.testing.assert_allclose(inverse_frequencies(8, 10000.0, RopeConfig(scaling="linear", factor=4.0)), plain / 4)
    with pytest.raises(ValueError, match="unsupported RoPE scaling 'yarn'"):
        inverse_frequencies(8, 10000.0, RopeConfig(scaling="yarn"))


def test_the_device_pool_is_kv_pages_or_what_fits_in_memory():
    assert device_pool_pages(BackendOptions(kv_pages=12, kv_memory_bytes=0), page_bytes=1000) == 12
    assert device_pool_pages(BackendOptions(kv_memory_bytes=1000 * 37 + 5), page_bytes=1000) == 37
    assert device_pool_pages(BackendOptions(kv_memory_bytes=1 << 40), page_bytes=1) == MAX_BUDGET_PAGES
    assert device_pool_pages(BackendOptions(kv_memory_bytes=1 << 40), page_bytes=1, max_pages=5) == 5


def test_a_device_pool_with_no_page_is_refused():
    with pytest.raises(ValueError, match="kv_memory_bytes=999 holds no page of 1000 bytes"):
        device_pool_pages(BackendOptions(kv_memory_bytes=999), page_bytes=1000)
    with pytest.raises(ValueError, match="kv_pages must be >= 0"):
        device_pool_pages(BackendOptions(kv_pages=-1), page_bytes=1000)


def test_the_host_pool_is_host_pages_or_the_default():
    assert host_pool_pages(BackendOptions()) == DEFAULT_HOST_PAGES == 64
    assert host_pool_pages(BackendOptions(host_pages=3)) == 3
    with pytest.raises(ValueError, match="host_pages must be >= 0"):
        host_pool_pages(BackendOptions(host_pages=-1))
