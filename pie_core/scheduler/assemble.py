"""Batch assembly and output splitting: many ForwardRequests <-> one flat ForwardBatch.

A loop over requests is fine here; nothing loops over tokens: token arrays are concatenated
and index arithmetic is done with numpy over the whole batch.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from pie_core.hookspec import BatchOutput, ForwardBatch
from pie_core.scheduler.request import ForwardRequest, RequestOutput

__all__ = ["assemble", "split_output"]

_I32 = np.int32


def _indptr(counts: Sequence[int], dtype: type = _I32) -> np.ndarray:
    out: np.ndarray = np.zeros(len(counts) + 1, dtype=dtype)
    np.cumsum(counts, out=out[1:])
    return out


def _cat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype=dtype)


def assemble(requests: Sequence[ForwardRequest], vocab_size: int) -> ForwardBatch:
    """Flatten requests (in order) into one batch.

    Args:
        requests: Validated requests; each has at least one input token.
        vocab_size: Vocabulary size, for the packed logit-mask width.

    Returns:
        The batch; sample and probe rows are in request order, then in each request's order.
    """
    n_tok = [r.num_tokens for r in requests]
    qo_indptr = _indptr(n_tok)
    starts = qo_indptr[:-1]

    samples = [(i, s) for i, r in enumerate(requests) for s in r.samples]
    probes = [(i, p) for i, r in enumerate(requests) for p in r.probes]
    sample_base = _indptr([len(r.samples) for r in requests])

    masks = [r.attention_mask for r in requests]
    mask_sizes = [0 if m is None else m.size for m in masks]
    mask_data = _cat([m.reshape(-1) for m in masks if m is not None], np.bool_)

    mask_width = (vocab_size + 7) // 8
    logit_masks = None
    if any(s.logit_mask is not None for _, s in samples):
        logit_masks = np.full((len(samples), mask_width), 0xFF, dtype=np.uint8)
        for row, (_, s) in enumerate(samples):
            if s.logit_mask is not None:
                logit_masks[row] = s.logit_mask

    probe_ids = [np.asarray(p.token_ids, dtype=_I32) for _, p in probes]
    return ForwardBatch(
        token_ids=_cat([r.token_ids for r in requests], _I32),
        positions=_cat([r.positions for r in requests], _I32),
        qo_indptr=qo_indptr,
        kv_page_indices=_cat([r.page_ids for r in requests], _I32),
        kv_page_indptr=_indptr([len(r.page_ids) for r in requests]),
        kv_last_page_len=np.array([r.last_page_len for r in requests], dtype=_I32),
        kv_write_slots=_cat([r.write_slots for r in requests], _I32),
        mask_indptr=_indptr(mask_sizes, np.int64),
        mask_data=mask_data,
        sample_rows=np.array([starts[i] + s.index for i, s in samples], dtype=_I32),
        sampler_kind=np.array([s.kind for _, s in samples], dtype=np.int8),
        temperature=np.array([s.temperature for _, s in samples], dtype=np.float32),
        top_k=np.array([s.top_k for _, s in samples], dtype=_I32),
        top_p=np.array([s.top_p for _, s in samples], dtype=np.float32),
        min_p=np.array([s.min_p for _, s in samples], dtype=np.float32),
        draws=np.array([s.draws for _, s in samples], dtype=_I32),
        seeds=np.array([s.seed for _, s in samples], dtype=np.uint64),
        logit_masks=logit_masks,
        probe_rows=np.array([starts[i] + p.index for i, p in probes], dtype=_I32),
        probe_kind=np.array([p.kind for _, p in probes], dtype=np.int8),
        probe_temperature=np.array([p.temperature for _, p in probes], dtype=np.float32),
        probe_k=np.array([p.k for _, p in probes], dtype=_I32),
        probe_token_ids=_cat(probe_ids, _I32),
        probe_token_indptr=_indptr([len(t) for t in probe_ids]),
        probe_masked=np.array(
            [-1 if p.masked_by < 0 else sample_base[i] + p.masked_by for i, p in probes], dtype=_I32
        ),
        adapter_ids=np.array([r.adapter_id for r in requests], dtype=_I32),
        zo_seeds=np.array([r.zo_seed for r in requests], dtype=np.int64),
    )


def split_output(
    requests: Sequence[ForwardRequest], batch: ForwardBatch, output: BatchOutput
) -> list[RequestOutput]:
    """Cut a batch's output back into one RequestOutput per request, in request order."""
    token_indptr = _indptr(batch.draws.tolist())
    expected = int(token_indptr[-1])
    if len(output.tokens) != expected or len(output.probes) != len(batch.probe_rows):
        raise ValueError(
            f"backend returned {len(output.tokens)} tokens and {len(output.probes)} probe values; "
            f"the batch asked for {expected} tokens and {len(batch.probe_rows)} probes"
        )
    flat = np.asarray(output.tokens).tolist()
    per_row = [tuple(flat[a:b]) for a, b in zip(token_indptr[:-1], token_indptr[1:])]
    results = []
    s = q = 0
    for r in requests:
        ns, nq = len(r.samples), len(r.probes)
        results.append(RequestOutput(tokens=tuple(per_row[s : s + ns]), probes=output.probes[q : q + nq]))
        s += ns
        q += nq
    return results
