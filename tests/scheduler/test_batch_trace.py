"""``PIE_TRACE_BATCHES``: one JSON line per batch the backend ran, with the batch's shape."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from test_batch_roundtrip import PS, VOCAB, _tagged_output, _three_requests

from pie_core.backend import BackendWorker, FunctionBackend
from pie_core.hookspec import Capabilities
from pie_core.scheduler.batcher import Batcher

from pie_core.scheduler.assemble import assemble
from pie_core.scheduler.trace import ENV, BatchTrace, batch_shape, from_env


def test_a_batch_shape_counts_decode_rows_prefill_chunks_and_kv() -> None:
    shape = batch_shape(assemble(_three_requests(), VOCAB), PS)
    # inputs 3, 3, 2 tokens over KV 3, 9, 6; request 1 samples twice, request 0 and 2 once
    assert shape == {"requests": 3, "tokens": 8, "decode_rows": 0, "prefill": [3, 3, 2], "kv_total": 18,
                     "kv_max": 9, "samples": 4, "probes": 4, "mask_entries": 3 * 9 + 2 * 6, "adapter_rows": 1}


def test_the_trace_appends_one_line_per_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert from_env(PS) is None
    path = tmp_path / "trace.jsonl"
    monkeypatch.setenv(ENV, str(path))
    trace = from_env(PS)
    assert isinstance(trace, BatchTrace)
    batch = assemble(_three_requests()[:1], VOCAB)
    trace.write(batch, 100.5, 0.25)
    trace.write(batch, 101.0, 0.5)
    trace.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(d["t"], d["seconds"], d["tokens"], d["prefill"]) for d in lines] == [(100.5, 0.25, 3, [3]), (101.0, 0.5, 3, [3])]


def test_the_batcher_traces_every_batch_it_ran(tmp_path: Path) -> None:
    caps = Capabilities(page_size=PS, num_pages=16, num_host_pages=0, vocab_size=VOCAB, dtype="float32",
                        device="cpu", max_batch_tokens=64, max_batch_requests=8, max_sample_rows=16,
                        max_mask_bytes=1 << 16)
    path = tmp_path / "trace.jsonl"

    async def go() -> None:
        batcher = Batcher(BackendWorker.of(FunctionBackend(_tagged_output)), caps, policy="greedy", trace=BatchTrace(str(path), PS))
        try:
            for req in _three_requests():  # one at a time: three batches of one request
                await batcher.submit(req)
        finally:
            await batcher.close()

    asyncio.run(go())
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [d["tokens"] for d in lines] == [3, 3, 2] and all(d["seconds"] >= 0 for d in lines)
    assert lines[0]["t"] <= lines[1]["t"] <= lines[2]["t"]
