"""The checks every backend runs on a :class:`~pie_core.hookspec.ForwardBatch` before it writes.

The core builds valid batches; these checks catch a core bug (or a hand-made batch in a test)
before it turns into an out-of-range write on the device. They are cheap (numpy over the
batch's arrays, no Python loop per token) and are not a substitute for the core's validation of
what an inferlet sends.
"""

from __future__ import annotations

import numpy as np

from pie_core.hookspec import ForwardBatch

__all__ = ["check_batch", "kv_lengths", "write_slots"]


def _check_range(name: str, values: np.ndarray, low: int, high: int | None, bound: str) -> None:
    """Refuse ``values`` unless every entry is in ``[low, high)`` (``high`` None: no upper bound)."""
    outside = values < low if high is None else (values < low) | (values >= high)
    if outside.any():
        bad = int(np.argmax(outside))
        raise ValueError(f"{name} must be {bound}, got {int(values[bad])} at index {bad}")


def _check_lengths(batch: ForwardBatch) -> None:
    n, r = batch.num_tokens, batch.num_requests
    if r < 1 or n < 1:
        raise ValueError(f"a batch needs at least one request and one token, got {r} and {n}")
    for name in ("positions", "kv_write_slots"):
        if len(getattr(batch, name)) != n:
            raise ValueError(f"{name} has {len(getattr(batch, name))} entries for {n} tokens")
    for name in ("kv_page_indptr", "mask_indptr"):
        if len(getattr(batch, name)) != r + 1:
            raise ValueError(f"{name} has {len(getattr(batch, name))} entries for {r} requests")
    if len(batch.kv_last_page_len) != r:
        raise ValueError(f"kv_last_page_len has {len(batch.kv_last_page_len)} entries for {r} requests")


def _check_indptrs(batch: ForwardBatch) -> None:
    qo = batch.qo_indptr
    if int(qo[0]) != 0 or int(qo[-1]) != batch.num_tokens or (np.diff(qo) < 1).any():
        raise ValueError("qo_indptr must start at 0, end at the token count and give each request >= 1 token")
    pages = batch.kv_page_indptr
    if int(pages[0]) != 0 or int(pages[-1]) != len(batch.kv_page_indices):
        raise ValueError(
            f"kv_page_indptr must start at 0 and end at the {len(batch.kv_page_indices)} entries of kv_page_indices"
        )
    if (np.diff(pages) < 1).any():
        raise ValueError("every request needs at least one KV page (kv_page_indptr must increase)")
    masks = batch.mask_indptr
    if int(masks[0]) != 0 or int(masks[-1]) != len(batch.mask_data) or (np.diff(masks) < 0).any():
        raise ValueError(
            f"mask_indptr must start at 0, never decrease and end at the {len(batch.mask_data)} entries of mask_data"
        )


def check_batch(batch: ForwardBatch, vocab_size: int, num_pages: int, page_size: int) -> None:
    """Refuse a batch whose arrays disagree in length or hold ids out of range.

    Call it in ``pie_backend_forward`` after :meth:`Capabilities.check_limits` and before
    anything is written: a refused batch leaves the KV pools as they were. Write slots and custom
    mask sizes depend on the KV lengths and are checked where the layout is built.

    Args:
        batch: The batch the core built.
        vocab_size: Token ids must be in ``[0, vocab_size)``.
        num_pages: Pages of the device pool; page ids must be in ``[0, num_pages)``.
        page_size: Slots per page; ``kv_last_page_len`` must be in ``[1, page_size]``.

    Raises:
        ValueError: The batch is empty; an array's length disagrees with the token or request
            count; an indptr array does not start at 0, increase and end at the length of the
            array it indexes; or a token id, position, page id, last-page length or
            sample/probe row is out of range. The message names the array and the first bad
            entry.
    """
    _check_lengths(batch)
    _check_indptrs(batch)
    n = batch.num_tokens
    _check_range("token ids", batch.token_ids, 0, vocab_size, f">= 0 and < {vocab_size} (the vocabulary)")
    _check_range("positions", batch.positions, 0, None, ">= 0")
    _check_range("kv_page_indices", batch.kv_page_indices, 0, num_pages, f">= 0 and < {num_pages} (the device pool)")
    last = f">= 1 and <= {page_size} (the page size)"
    _check_range("kv_last_page_len", batch.kv_last_page_len, 1, page_size + 1, last)
    rows = f">= 0 and < {n} (the batch's input tokens)"
    _check_range("sample_rows", batch.sample_rows, 0, n, rows)
    _check_range("probe_rows", batch.probe_rows, 0, n, rows)


def kv_lengths(batch: ForwardBatch, page_size: int) -> np.ndarray:
    """int64 ``[R]``: each request's KV length after this pass's writes."""
    n_pages = np.diff(batch.kv_page_indptr).astype(np.int64)
    return (n_pages - 1) * page_size + batch.kv_last_page_len.astype(np.int64)


def write_slots(batch: ForwardBatch, page_size: int) -> np.ndarray:
    """int64 ``[N]``: the flat pool slot (``page * page_size + offset``) each token's K/V goes to.

    Raises:
        ValueError: A write slot lies outside its request's KV length.
    """
    kv_len = kv_lengths(batch, page_size)
    req = np.repeat(np.arange(batch.num_requests), np.diff(batch.qo_indptr))
    slots = batch.kv_write_slots.astype(np.int64)
    outside = (slots < 0) | (slots >= kv_len[req])
    if outside.any():
        bad = int(np.flatnonzero(outside)[0])
        raise ValueError(f"kv_write_slots[{bad}] = {slots[bad]} is outside its request's KV length {kv_len[req[bad]]}")
    pages = batch.kv_page_indices[batch.kv_page_indptr[req] + slots // page_size].astype(np.int64)
    return pages * page_size + slots % page_size
