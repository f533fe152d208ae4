"""One JSON line per batch, for profiling what batches cost.

``PIE_TRACE_BATCHES=FILE`` in the environment of ``pie serve`` (or any engine) appends a line for
every batch the backend ran: when it fired, its backend seconds, and its shape: requests, input
tokens, decode rows (requests with one input token), the sizes of the rest (prefill chunks), KV
lengths, sampled and probed rows, custom-mask entries, adapter rows. ``benchmarks/agents.py
--trace DIR`` sets it per side and summarises the lines.
"""

from __future__ import annotations

import json
import os
from typing import IO, Any

import numpy as np

from pie_core.hookspec import ForwardBatch

__all__ = ["BatchTrace", "batch_shape", "from_env"]

ENV = "PIE_TRACE_BATCHES"


def batch_shape(batch: ForwardBatch, page_size: int) -> dict[str, Any]:
    """What a batch asks of the backend, as plain numbers."""
    inputs = np.diff(batch.qo_indptr)
    pages = np.diff(batch.kv_page_indptr)
    kv = (pages - 1) * page_size + batch.kv_last_page_len
    return {
        "requests": int(len(inputs)),
        "tokens": int(inputs.sum()),
        "decode_rows": int((inputs == 1).sum()),
        "prefill": sorted((int(n) for n in inputs[inputs > 1]), reverse=True),
        "kv_total": int(kv.sum()),
        "kv_max": int(kv.max(initial=0)),
        "samples": int(len(batch.sample_rows)),
        "probes": int(len(batch.probe_rows)),
        "mask_entries": int(batch.mask_indptr[-1]) if len(batch.mask_indptr) else 0,
        "adapter_rows": int((np.asarray(batch.adapter_ids) >= 0).sum()),
    }


class BatchTrace:
    """Appends one line per batch to a file (line-buffered; a few hundred bytes a batch)."""

    def __init__(self, path: str, page_size: int) -> None:
        self._file: IO[str] = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - closed by close()
        self._page_size = page_size

    def write(self, batch: ForwardBatch, fired: float, seconds: float) -> None:
        """``fired``: ``time.time()`` when the batch went to the backend thread."""
        line = {"t": round(fired, 6), "seconds": round(seconds, 6), **batch_shape(batch, self._page_size)}
        self._file.write(json.dumps(line) + "\n")

    def close(self) -> None:
        self._file.close()


def from_env(page_size: int) -> BatchTrace | None:
    """The trace ``PIE_TRACE_BATCHES`` asks for, or None."""
    path = os.environ.get(ENV)
    return BatchTrace(path, page_size) if path else None
