"""Declared limits: a batch at every limit runs; one over a limit is refused cleanly.

"Cleanly" means ``pie_backend_forward`` raises, and the backend then runs the next batch exactly
as before. Batches are built directly as flat arrays (they can hold tens of thousands of rows)
on a model whose pool is sized to hold them.
"""

from __future__ import annotations

import numpy as np
import pytest

from pie_core.hookspec import ForwardBatch
from pie_core.scheduler.assemble import assemble

from conformance.batches import kv_request
from conformance.harness import Harness
from conformance.loaded import LoadedModel, not_supported

SURFACE = "limits"

_MAX_ROWS = 1 << 18  # larger declared limits are not exercised (the arrays alone would be huge)
_MAX_MASK_ENTRIES = 1 << 26


def _indptr(counts: np.ndarray, dtype: type = np.int32) -> np.ndarray:
    out: np.ndarray = np.zeros(len(counts) + 1, dtype=dtype)
    np.cumsum(counts, out=out[1:])
    return out


def _split(total: int, parts: int) -> np.ndarray:
    """``parts`` counts summing to ``total``, as even as possible."""
    return np.full(parts, total // parts, dtype=np.int64) + (np.arange(parts) < total % parts)


def _pages_for(counts: np.ndarray, page_size: int) -> int:
    return int((-(-counts // page_size)).sum())


def _plan(caps: object) -> dict[str, tuple[np.ndarray, int]]:
    """Per case, the tokens of each request and the sample-row count."""
    t, r, s = caps.max_batch_tokens, caps.max_batch_requests, caps.max_sample_rows  # type: ignore[attr-defined]
    at = min(r, t)
    return {
        "at": (_split(t, at), s),
        "tokens": (_split(t + 1, min(r, t + 1)), 1),
        "requests": (np.ones(r + 1, dtype=np.int64), 1),
        "rows": (np.ones(1, dtype=np.int64), s + 1),
    }


def _flat_batch(model: LoadedModel, counts: np.ndarray, rows: int, rng: np.random.Generator) -> ForwardBatch:
    p, n, r = model.page_size, int(counts.sum()), len(counts)
    pages_per = -(-counts // p)
    qo = _indptr(counts)
    slots = (np.arange(n) - np.repeat(qo[:-1], counts)).astype(np.int32)
    s_rows = (np.arange(rows, dtype=np.int64) * n // max(rows, 1)).astype(np.int32)
    i32 = np.int32
    return ForwardBatch(
        token_ids=rng.integers(0, model.vocab, n).astype(i32),
        positions=slots.copy(),
        qo_indptr=qo,
        kv_page_indices=np.asarray(model.pages(int(pages_per.sum())), dtype=i32),
        kv_page_indptr=_indptr(pages_per),
        kv_last_page_len=(counts - (pages_per - 1) * p).astype(i32),
        kv_write_slots=slots,
        mask_indptr=np.zeros(r + 1, dtype=np.int64),
        mask_data=np.zeros(0, dtype=bool),
        sample_rows=s_rows,
        sampler_kind=np.zeros(rows, dtype=np.int8),
        temperature=np.ones(rows, dtype=np.float32),
        top_k=np.zeros(rows, dtype=i32),
        top_p=np.ones(rows, dtype=np.float32),
        min_p=np.zeros(rows, dtype=np.float32),
        draws=np.ones(rows, dtype=i32),
        seeds=np.zeros(rows, dtype=np.uint64),
        logit_masks=None,
        probe_rows=np.zeros(0, dtype=i32),
        probe_kind=np.zeros(0, dtype=np.int8),
        probe_temperature=np.zeros(0, dtype=np.float32),
        probe_k=np.zeros(0, dtype=i32),
        probe_token_ids=np.zeros(0, dtype=i32),
        probe_token_indptr=np.zeros(1, dtype=i32),
        probe_masked=np.zeros(0, dtype=i32),
        adapter_ids=np.full(r, -1, dtype=i32),
        zo_seeds=np.zeros(r, dtype=np.int64),
    )


@pytest.fixture
def limits(pie_conformance: Harness) -> LoadedModel:
    """The primary model on a pool big enough for every batch of this surface."""
    caps = pie_conformance.model().caps
    plan = _plan(caps)
    if max(int(c.sum()) for c, _ in plan.values()) > _MAX_ROWS or caps.max_sample_rows > _MAX_ROWS:
        not_supported(f"declared limits above {_MAX_ROWS} tokens or rows are too large to exercise")
    need = max(_pages_for(c, caps.page_size) for c, _ in plan.values()) + 8
    return pie_conformance.load(pie_conformance.options.archs[0], kv_pages=need, reference=False)


def _assert_refused_cleanly(model: LoadedModel, batch: ForwardBatch, rng: np.random.Generator, what: str) -> None:
    prompt = rng.integers(0, model.vocab, 5)
    before = model.run([kv_request(prompt, model.pages_for(len(prompt)), model.page_size)])
    with pytest.raises(Exception) as err:
        model.forward_batch(batch)
    assert not isinstance(err.value, AssertionError), f"{what}: the backend did not refuse it ({err.value})"
    after = model.run([kv_request(prompt, model.pages_for(len(prompt)), model.page_size)])
    model.assert_close(after, before, f"the same request after refusing {what}")


def test_batch_at_the_declared_limits_runs(limits: LoadedModel, rng: np.random.Generator) -> None:
    counts, rows = _plan(limits.caps)["at"]
    batch = _flat_batch(limits, counts, rows, rng)
    out = limits.forward_batch(batch)
    assert np.asarray(out.tokens).shape == (rows,), (
        f"a batch of {int(counts.sum())} tokens, {len(counts)} requests and {rows} sample rows "
        f"(the declared limits) returned {np.asarray(out.tokens).shape[0]} tokens"
    )


def test_batch_over_max_batch_tokens_is_refused(limits: LoadedModel, rng: np.random.Generator) -> None:
    counts, rows = _plan(limits.caps)["tokens"]
    batch = _flat_batch(limits, counts, rows, rng)
    _assert_refused_cleanly(limits, batch, rng, f"{int(counts.sum())} tokens (max_batch_tokens + 1)")


def test_batch_over_max_batch_requests_is_refused(limits: LoadedModel, rng: np.random.Generator) -> None:
    counts, rows = _plan(limits.caps)["requests"]
    batch = _flat_batch(limits, counts, rows, rng)
    _assert_refused_cleanly(limits, batch, rng, f"{len(counts)} requests (max_batch_requests + 1)")


def test_batch_over_max_sample_rows_is_refused(limits: LoadedModel, rng: np.random.Generator) -> None:
    counts, rows = _plan(limits.caps)["rows"]
    batch = _flat_batch(limits, counts, rows, rng)
    _assert_refused_cleanly(limits, batch, rng, f"{rows} sample rows (max_sample_rows + 1)")


def test_masks_over_max_mask_bytes_are_refused(limits: LoadedModel, rng: np.random.Generator) -> None:
    limits.require("custom_mask")
    caps = limits.caps
    entries = caps.max_mask_bytes + 1
    if entries > _MAX_MASK_ENTRIES:
        not_supported(f"declared max_mask_bytes {caps.max_mask_bytes} is too large to exercise")
    n = min(caps.max_batch_tokens, max(1, int(np.ceil(np.sqrt(entries)))))
    kv_len = max(n, -(-entries // n))
    if -(-kv_len // caps.page_size) > caps.num_pages:
        not_supported(f"max_mask_bytes {caps.max_mask_bytes} cannot be exceeded within the page pool")
    pages = limits.pages(-(-kv_len // caps.page_size))
    mask = np.tril(np.ones((n, kv_len), dtype=bool), k=kv_len - n)
    req = kv_request(rng.integers(0, limits.vocab, n), pages, caps.page_size, start=kv_len - n, mask=mask)
    _assert_refused_cleanly(limits, assemble([req], limits.vocab), rng, f"a custom mask of {n * kv_len} entries")
