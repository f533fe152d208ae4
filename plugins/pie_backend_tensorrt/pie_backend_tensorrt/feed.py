"""One forward batch turned into the graph's inputs (see ``graph`` for their meaning).

Everything here is numpy over whole requests; the only Python loop is over requests that carry
a custom attention mask (each mask is a block of its own shape).
"""

from __future__ import annotations

import numpy as np

from pie_core.backend_kit import ForwardBatch, ModelSpec, kv_lengths

from pie_backend_tensorrt.graph import GROUPS, mask_value

__all__ = ["Rope", "build_feed"]


class Rope:
    """``cos``/``sin`` tables of the model's full and sliding layers, computed in float64."""

    def __init__(self, full: np.ndarray, sliding: np.ndarray, np_dtype: type) -> None:
        self.full, self.sliding, self.np_dtype = full, sliding, np_dtype

    def tables(self, positions: np.ndarray, sliding: bool) -> tuple[np.ndarray, np.ndarray]:
        angles = positions.astype(np.float64)[:, None] * (self.sliding if sliding else self.full)[None, :]
        return np.cos(angles).astype(self.np_dtype), np.sin(angles).astype(self.np_dtype)


def _group(
    batch: ForwardBatch,
    members: np.ndarray,
    kv_len: np.ndarray,
    slot_pos: np.ndarray,
    page_size: int,
    window: int | None,
    neg: float,
    np_dtype: type,
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Inputs of one attention group and the padded row of each of its tokens.

    Returns:
        The group's inputs (suffix-free names) and, for every member token in batch order, its
        row in the group's ``[R * M]`` output.
    """
    if members.size == 0:  # a masked dummy request keeps every shape non-empty
        zeros = np.zeros((1, 1), dtype=np.int64)
        bias = np.full((1, 1, 1), neg, dtype=np_dtype)
        return {"q_index": zeros, "kv_slots": zeros, "bias": bias, "bias_local": bias,
                "row_valid": np.zeros((1, 1, 1), dtype=np_dtype), "row_valid_local": np.zeros((1, 1, 1), dtype=np_dtype)}, np.zeros(0, dtype=np.int64)
    start = batch.qo_indptr[members].astype(np.int64)
    n_tok = batch.qo_indptr[members + 1].astype(np.int64) - start
    lengths = kv_len[members]
    m, t = int(n_tok.max()), int(lengths.max())
    row = np.arange(m)
    q_index = start[:, None] + np.minimum(row[None, :], n_tok[:, None] - 1)
    real = row[None, :] < n_tok[:, None]
    col = np.arange(t)
    key = np.minimum(col[None, :], lengths[:, None] - 1)
    page = batch.kv_page_indices[batch.kv_page_indptr[members][:, None] + key // page_size].astype(np.int64)
    kv_slots = page * page_size + key % page_size
    write = batch.kv_write_slots[q_index].astype(np.int64)
    allowed = (col[None, None, :] <= write[:, :, None]) & (col[None, None, :] < lengths[:, None, None])
    for i in np.flatnonzero(np.diff(batch.mask_indptr)[members]):
        r = int(members[i])
        n, length = int(n_tok[i]), int(lengths[i])
        size = int(batch.mask_indptr[r + 1] - batch.mask_indptr[r])
        if size != n * length:
            raise ValueError(f"request {r}'s custom mask has {size} entries, expected {n} x {length}")
        a = int(batch.mask_indptr[r])
        allowed[i] = False
        allowed[i, :n, :length] = batch.mask_data[a : a + size].reshape(n, length).astype(bool)
    allowed &= real[:, :, None]
    out = {"q_index": q_index, "kv_slots": kv_slots}
    out["bias"] = np.where(allowed, 0, neg).astype(np_dtype)
    out["row_valid"] = allowed.any(axis=2, keepdims=True).astype(np_dtype)
    if window is not None:
        q_pos = batch.positions[q_index].astype(np.int64)
        local = allowed & (slot_pos[kv_slots][:, None, :] > q_pos[:, :, None] - window)
        out["bias_local"] = np.where(local, 0, neg).astype(np_dtype)
        out["row_valid_local"] = local.any(axis=2, keepdims=True).astype(np_dtype)
    rows = (np.arange(len(members))[:, None] * m + row[None, :])[real]
    return out, rows


def build_feed(
    batch: ForwardBatch,
    spec: ModelSpec,
    rope: Rope,
    slot_pos: np.ndarray,
    slots: np.ndarray,
    page_size: int,
    dtype: str,
    logit_index: np.ndarray,
    hidden_index: np.ndarray,
) -> dict[str, np.ndarray]:
    """The graph inputs of one checked batch (the caches excepted).

    Args:
        batch: The batch.
        spec: The model.
        rope: Its RoPE tables.
        slot_pos: RoPE position of every cache slot, this pass's writes included.
        slots: :func:`~pie_core.backend_kit.write_slots` of the batch.
        page_size: Slots per page.
        dtype: The graph's float dtype.
        logit_index: Tokens whose logits are returned.
        hidden_index: Tokens whose final hidden state is returned.

    Raises:
        ValueError: A custom mask has the wrong size.
    """
    np_dtype = np.float16 if dtype == "float16" else np.float32
    neg = mask_value(dtype)
    sliding = spec.sliding_window is not None and any(spec.is_sliding(i) for i in range(spec.num_layers))
    window = spec.sliding_window if sliding else None
    kv_len = kv_lengths(batch, page_size)
    single = (np.diff(batch.qo_indptr) == 1) & (np.diff(batch.mask_indptr) == 0)
    feed: dict[str, np.ndarray] = {
        "input_ids": batch.token_ids.astype(np.int64),
        "write_slots": slots[:, None],
        "logit_index": logit_index.astype(np.int64),
        "hidden_index": hidden_index.astype(np.int64),
    }
    feed["cos"], feed["sin"] = rope.tables(batch.positions, False)
    if sliding:
        feed["cos_local"], feed["sin_local"] = rope.tables(batch.positions, True)
    out_index = np.empty(batch.num_tokens, dtype=np.int64)
    token_req = np.repeat(np.arange(batch.num_requests), np.diff(batch.qo_indptr))
    offset = 0
    for g, members in zip(GROUPS, (np.flatnonzero(single), np.flatnonzero(~single))):
        inputs, rows = _group(batch, members, kv_len, slot_pos, page_size, window, neg, np_dtype)
        out_index[np.isin(token_req, members)] = offset + rows
        offset += inputs["q_index"].size
        for name in ("q_index", "kv_slots", "bias", "row_valid") + (("bias_local", "row_valid_local") if sliding else ()):
            feed[f"{name}_{g}"] = inputs[name]
    feed["out_index"] = out_index
    return feed
