"""Per-batch bookkeeping shared by every layer: where tokens write, and what each request reads.

Built once per forward from a :class:`~pie_core.backend_kit.ForwardBatch` (numpy on the host, then
moved to the device), and reused by all layers. Requests split in two kinds:

- *decode rows*: one input token and no custom mask, attended together (each row's keys padded
  to its own length rounded up to a power of two, masked by an additive bias; rows of the same
  padded length share a group).
- *blocks*: everything else (prefill chunks, custom masks), attended one request at a time.

A request whose pages are consecutive ids is read in place (a slice of the pool); others are
gathered page by page, so a step reads only the pages of the batch, never the whole pool.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pie_core.backend_kit import ForwardBatch, kv_lengths

__all__ = ["DecodeGroup", "Block", "BatchPlan", "plan_batch"]

_BUCKET_MIN = 64
"""The shortest key span of a decode row (see :func:`_padded`)."""


@dataclass(frozen=True, slots=True)
class DecodeGroup:
    """Single-token requests attended together over ``length`` padded key slots."""

    tokens: torch.Tensor | None  # [G] token index of each member; None = tokens 0..G-1
    slots: torch.Tensor | None  # [G, length] flat slot ids to gather; None = read in place
    first_slot: int  # in place (one member, consecutive pages): its keys are slots first..first+length
    length: int
    bias: torch.Tensor  # [G, length] float32: 0 where the key is visible, -inf elsewhere
    bias_sliding: torch.Tensor | None


@dataclass(frozen=True, slots=True)
class Block:
    """One request attended on its own (several tokens or a custom mask)."""

    start: int  # first token in the batch
    stop: int
    slots: torch.Tensor | None  # [kv_len] flat slot ids to gather; None = read in place
    first_slot: int
    kv_len: int
    mask: torch.Tensor  # [n, kv_len] bool, true = attend
    mask_sliding: torch.Tensor | None
    blind: torch.Tensor | None  # [n] bool: rows that see no key under ``mask`` (None: there are none)
    blind_sliding: torch.Tensor | None  # the same under ``mask_sliding``


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """Everything the layers need besides the activations."""

    num_tokens: int
    write_index: torch.Tensor  # [N] int64 flat slot (page * page_size + offset) of each token's K/V
    positions: torch.Tensor  # [N] int32 RoPE positions (also recorded per slot)
    decode: tuple[DecodeGroup, ...]
    blocks: tuple[Block, ...]


def _bias(allowed: np.ndarray) -> np.ndarray:
    return np.where(allowed, np.float32(0), np.float32(-np.inf))


def _sliding(allowed: np.ndarray, q_pos: np.ndarray, k_pos: np.ndarray, window: int | None) -> np.ndarray | None:
    return None if window is None else allowed & (k_pos > q_pos[..., None] - window)


def _in_place(pages: np.ndarray) -> bool:
    return bool(len(pages) == 1 or (np.diff(pages) == 1).all())


class _Planner:
    """Builds one batch's plan; ``pos`` is the pool's slot positions after this pass's writes."""

    def __init__(self, batch: ForwardBatch, pos: np.ndarray, page_size: int, window: int | None, device: torch.device):
        self.batch = batch
        self.pos = pos.reshape(-1)
        self.ps = page_size
        self.window = window
        self.device = device
        self.kv_len = kv_lengths(batch, page_size)

    def tensor(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(self.device)

    def pages(self, r: int) -> np.ndarray:
        b = self.batch
        return b.kv_page_indices[b.kv_page_indptr[r] : b.kv_page_indptr[r + 1]].astype(np.int64)

    def block(self, r: int) -> Block:
        b = self.batch
        a, z = int(b.qo_indptr[r]), int(b.qo_indptr[r + 1])
        length = int(self.kv_len[r])
        pages = self.pages(r)
        slots = (pages[:, None] * self.ps + np.arange(self.ps)).reshape(-1)[:length]
        m0, m1 = int(b.mask_indptr[r]), int(b.mask_indptr[r + 1])
        if m1 > m0:
            if m1 - m0 != (z - a) * length:
                raise ValueError(f"request {r}'s custom mask has {m1 - m0} entries, expected {z - a} x {length}")
            allowed = b.mask_data[m0:m1].reshape(z - a, length).astype(bool)
        else:
            allowed = np.arange(length)[None, :] <= b.kv_write_slots[a:z, None].astype(np.int64)
        sliding = _sliding(allowed, b.positions[a:z].astype(np.int64), self.pos[slots], self.window)
        return Block(
            start=a,
            stop=z,
            slots=None if _in_place(pages) else self.tensor(slots),
            first_slot=int(slots[0]),
            kv_len=length,
            mask=self.tensor(allowed),
            mask_sliding=None if sliding is None else self.tensor(sliding),
            blind=self.blind(allowed),
            blind_sliding=None if sliding is None else self.blind(sliding),
        )

    def blind(self, allowed: np.ndarray) -> torch.Tensor | None:
        rows: np.ndarray = np.asarray(~allowed.any(axis=1))
        return self.tensor(rows) if rows.any() else None

    def decode_group(self, members: np.ndarray, whole_batch: bool, span: int) -> DecodeGroup:
        """``members`` attended over ``span`` key slots each (their own padded length, see
        :func:`_padded`): a row's keys, bias and product shapes never depend on the other rows."""
        b = self.batch
        counts = np.diff(b.kv_page_indptr)[members].astype(np.int64)
        width = -(-span // self.ps)
        col = np.arange(width)
        idx = b.kv_page_indptr[members][:, None] + np.minimum(col[None, :], counts[:, None] - 1)
        table = b.kv_page_indices[idx].astype(np.int64)
        slots = (table[:, :, None] * self.ps + np.arange(self.ps)).reshape(len(members), -1)[:, :span]
        tokens = b.qo_indptr[members].astype(np.int64)
        keys = np.arange(span)
        kv_len = self.kv_len[members]
        allowed = (keys[None, :] <= b.kv_write_slots[tokens][:, None]) & (keys[None, :] < kv_len[:, None])
        sliding = _sliding(allowed, b.positions[tokens].astype(np.int64), self.pos[slots], self.window)
        return DecodeGroup(
            tokens=None if whole_batch else self.tensor(tokens),
            slots=self.tensor(slots),
            first_slot=int(slots[0, 0]),
            length=span,
            bias=self.tensor(_bias(allowed)),
            bias_sliding=None if sliding is None else self.tensor(_bias(sliding)),
        )

    def decode_groups(self, reqs: np.ndarray) -> tuple[DecodeGroup, ...]:
        """Single-token requests grouped by their padded KV length (padding at most doubles the work)."""
        if reqs.size == 0:
            return ()
        spans = _padded(self.kv_len[reqs])
        groups = [(reqs[spans == s], int(s)) for s in np.unique(spans)]
        whole = len(groups) == 1 and len(reqs) == self.batch.num_tokens
        return tuple(self.decode_group(g, whole, s) for g, s in groups)


def _padded(kv_len: np.ndarray) -> np.ndarray:
    """Each decode row's key span: its KV length rounded up to a power of two, at least
    :data:`_BUCKET_MIN`. A function of the row alone, so that the row is attended by the same
    arithmetic whatever else the batch holds (batch invariance)."""
    return np.maximum(_BUCKET_MIN, 1 << np.ceil(np.log2(np.maximum(kv_len, 1))).astype(np.int64))


def plan_batch(
    batch: ForwardBatch,
    write_index: np.ndarray,
    pos: np.ndarray,
    page_size: int,
    window: int | None,
    device: torch.device,
) -> BatchPlan:
    """Masks, gather indices and decode groups of one batch.

    Args:
        batch: The forward batch (already checked with :func:`pie_core.backend_kit.check_batch`).
        write_index: Its flat write slots, from :func:`write_slots`.
        pos: The pool's slot positions ``[pages, page_size]`` (host copy) after this pass's writes.
        page_size: Slots per page.
        window: The sliding window of sliding layers, or None when the model has none.
        device: Where the plan's tensors live.

    Raises:
        ValueError: A custom mask has the wrong size.
    """
    planner = _Planner(batch, pos, page_size, window, device)
    n_tok = np.diff(batch.qo_indptr)
    has_mask = np.diff(batch.mask_indptr) > 0
    decode = np.flatnonzero((n_tok == 1) & ~has_mask)
    blocks = tuple(planner.block(int(r)) for r in np.flatnonzero((n_tok != 1) | has_mask))
    return BatchPlan(
        num_tokens=batch.num_tokens,
        write_index=planner.tensor(write_index),
        positions=planner.tensor(batch.positions.astype(np.int32)),
        decode=planner.decode_groups(decode),
        blocks=blocks,
    )
