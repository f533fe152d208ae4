"""Per-batch bookkeeping shared by every layer: where tokens write, what each request attends.

Built once per forward from a :class:`~pie_core.backend_kit.ForwardBatch`: first the write
targets, then (after the slot positions are written) the masks, so the masks (the
sliding-window ones included) are computed once and reused by all layers.

Requests split in two groups:

- *decode rows*: one input token and no custom mask. Their attention is batched over the
  requests (keys padded to the longest request of a length bucket).
- *blocks*: everything else (prefill chunks, custom masks), attended one request at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pie_core.backend_kit import ForwardBatch, kv_lengths, write_slots

__all__ = ["DecodeGroup", "RequestBlock", "BatchLayout", "write_targets", "build_layout"]


@dataclass(frozen=True, slots=True)
class DecodeGroup:
    """Single-token requests attended together; keys padded to ``table.shape[1] * page_size``."""

    tokens: np.ndarray  # [G] index of each request's token in the batch
    table: np.ndarray  # [G, max_pages] physical pages (padding repeats a valid page)
    allowed: np.ndarray  # [G, L] bool, default mask (slot <= write slot, slot < kv_len)
    allowed_sliding: np.ndarray | None  # [G, L] bool, plus the sliding window


@dataclass(frozen=True, slots=True)
class RequestBlock:
    """One request attended on its own (several tokens or a custom mask)."""

    start: int  # first token in the batch
    stop: int
    pages: np.ndarray  # physical pages in sequence order
    kv_len: int
    allowed: np.ndarray  # [n, kv_len] bool
    allowed_sliding: np.ndarray | None


@dataclass(frozen=True, slots=True)
class BatchLayout:
    """Everything the layers need to know about the batch besides the activations."""

    write_pages: np.ndarray  # [N] physical page of each token's K/V
    write_offsets: np.ndarray  # [N] slot within that page
    decode_groups: tuple[DecodeGroup, ...]
    blocks: tuple[RequestBlock, ...]


def _sliding(
    allowed: np.ndarray, q_pos: np.ndarray, k_pos: np.ndarray, window: int | None
) -> np.ndarray | None:
    if window is None:
        return None
    return allowed & (k_pos > q_pos[..., None] - window)


def _decode_groups(
    batch: ForwardBatch,
    reqs: np.ndarray,
    kv_len: np.ndarray,
    pos: np.ndarray,
    page_size: int,
    window: int | None,
) -> tuple[DecodeGroup, ...]:
    """Bucket single-token requests by KV length so padding at most doubles the work."""
    if reqs.size == 0:
        return ()
    order = reqs[np.argsort(kv_len[reqs], kind="stable")]
    groups: list[np.ndarray] = []
    first = 0
    for i in range(1, len(order) + 1):
        if i == len(order) or kv_len[order[i]] > max(2 * kv_len[order[first]], 64):
            groups.append(order[first:i])
            first = i
    out = []
    for members in groups:
        counts = np.diff(batch.kv_page_indptr)[members]
        width = int(counts.max())
        col = np.arange(width)
        idx = batch.kv_page_indptr[members][:, None] + np.minimum(col[None, :], counts[:, None] - 1)
        table = batch.kv_page_indices[idx].astype(np.int64)
        tokens = batch.qo_indptr[members].astype(np.int64)
        slots = np.arange(width * page_size)
        write = batch.kv_write_slots[tokens]
        allowed = (slots[None, :] <= write[:, None]) & (slots[None, :] < kv_len[members][:, None])
        k_pos = pos[table].reshape(len(members), -1)
        q_pos = batch.positions[tokens].astype(np.int64)
        out.append(DecodeGroup(tokens, table, allowed, _sliding(allowed, q_pos, k_pos, window)))
    return tuple(out)


def write_targets(batch: ForwardBatch, page_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Physical ``(page, offset)`` of each input token's K/V slot.

    Raises:
        ValueError: A write slot lies outside its request's KV length.
    """
    slots = write_slots(batch, page_size)
    return slots // page_size, slots % page_size


def build_layout(
    batch: ForwardBatch,
    targets: tuple[np.ndarray, np.ndarray],
    pos: np.ndarray,
    page_size: int,
    window: int | None,
) -> BatchLayout:
    """Compute attention masks and decode groups for the batch.

    Args:
        batch: The forward batch (already checked with :func:`pie_core.backend_kit.check_batch`).
        targets: Its write targets, from :func:`write_targets`.
        pos: The device pool's slot positions ``[pages, page_size]``, after this pass's writes.
        page_size: Slots per page.
        window: The sliding window of sliding layers, or None when the model has none.

    Raises:
        ValueError: A custom mask has the wrong size.
    """
    n_tok = np.diff(batch.qo_indptr).astype(np.int64)
    kv_len = kv_lengths(batch, page_size)
    slots = batch.kv_write_slots.astype(np.int64)
    mask_sizes = np.diff(batch.mask_indptr)
    decode = np.flatnonzero((n_tok == 1) & (mask_sizes == 0))
    blocks = []
    for i in np.flatnonzero((n_tok != 1) | (mask_sizes != 0)):
        a, b = int(batch.qo_indptr[i]), int(batch.qo_indptr[i + 1])
        length = int(kv_len[i])
        pages = batch.kv_page_indices[batch.kv_page_indptr[i] : batch.kv_page_indptr[i + 1]].astype(np.int64)
        if mask_sizes[i]:
            if mask_sizes[i] != (b - a) * length:
                raise ValueError(
                    f"request {i}'s custom mask has {mask_sizes[i]} entries, expected {b - a} x {length}"
                )
            m0 = int(batch.mask_indptr[i])
            allowed = batch.mask_data[m0 : m0 + (b - a) * length].reshape(b - a, length).astype(bool)
        else:
            allowed = np.arange(length)[None, :] <= slots[a:b, None]
        k_pos = pos[pages].reshape(-1)[:length]
        q_pos = batch.positions[a:b].astype(np.int64)
        blocks.append(RequestBlock(a, b, pages, length, allowed, _sliding(allowed, q_pos, k_pos, window)))
    return BatchLayout(
        write_pages=targets[0],
        write_offsets=targets[1],
        decode_groups=_decode_groups(batch, decode, kv_len, pos, page_size, window),
        blocks=tuple(blocks),
    )
