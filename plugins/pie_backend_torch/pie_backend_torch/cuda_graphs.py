"""CUDA graphs for pure decode steps, one per batch-size bucket, captured on first use.

A decode step (every request one token, no custom mask, no embedding probe) of R requests runs
as the graph of the smallest bucket ``B >= R``: the step's token ids, positions, write slots and
page tables are copied into the graph's static buffers and the graph is replayed; logits of every
row come out and the needed rows are picked. The ``B - R`` padding rows decode a token into a
scratch page the core never hands out (the KV cache is allocated one page larger), so they touch
nothing real. Page tables are capped at ``max_pages`` per request; longer requests run eagerly.
Graphs are captured without LoRA deltas, so a step in which any request runs an adapter runs
eagerly too.

Capture is behind a small seam (:class:`Capture`): on CUDA it is ``torch.cuda.graph``; the tests
replace it with a plain call, to check the buffers, padding and row picking on a CPU with the
Triton interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np
import torch

from pie_core.backend_kit import ForwardBatch, write_slots

from pie_backend_torch.rope import device_rotation
from pie_backend_torch.triton_kernels.ops import TritonPlan, tile_block_m

__all__ = ["BUCKETS", "Capture", "CudaGraphCapture", "EagerCapture", "DecodeGraphs"]

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DEFAULT_MAX_PAGES = 256


class Capture(Protocol):
    """Turns a zero-argument function over static buffers into a replayable step."""

    def __call__(self, fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]: ...


class CudaGraphCapture:
    """``torch.cuda.graph`` capture after two warm-up runs on a side stream; graphs share a pool."""

    def __init__(self) -> None:
        self.pool: Any = None

    def __call__(self, fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = fn()
        self.pool = graph.pool()
        return graph.replay, out


class EagerCapture:
    """No graph: replay runs the function again (for checking the graph logic without CUDA)."""

    def __call__(self, fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
        out = fn()

        def replay() -> None:
            out.copy_(fn())

        return replay, out


@dataclass(slots=True)
class _Step:
    """Static buffers of one bucket, and its captured replay.

    The step's inputs live in two device blocks (int64: token ids and write slots; int32: positions,
    write slots within the request, KV lengths, page table pointers and page ids), of which the
    plan's tensors are views. A step fills the same layout in host staging blocks (pinned on CUDA)
    and copies each with one asynchronous copy: no host synchronisation before the replay."""

    ids: torch.Tensor  # int64 [B], a view of dev64
    plan: TritonPlan
    host64: torch.Tensor
    host32: torch.Tensor
    dev64: torch.Tensor
    dev32: torch.Tensor
    copied: Any = None  # CUDA event recorded after the last staging copy (None on a CPU)
    replay: Callable[[], None] | None = None
    logits: torch.Tensor | None = None


class DecodeGraphs:
    """Captured decode steps of one model (its Triton path)."""

    def __init__(self, model: Any, capture: Capture | None = None, max_pages: int = DEFAULT_MAX_PAGES) -> None:
        if model.triton is None:
            raise ValueError("decode graphs capture the Triton path; load with kernels='triton'")
        self.model = model
        self.cache = model.cache
        self.capture: Capture = capture or CudaGraphCapture()
        self.max_pages = max_pages
        self.scratch_page = model.cache.scratch_page
        if self.scratch_page is None:
            raise ValueError("decode graphs need a KV cache allocated with a scratch page")
        dev = model.config.device
        self.inv = {s: torch.from_numpy(model.rope.sliding if s else model.rope.full).to(dev) for s in (False, True)}
        self.steps: dict[int, _Step] = {}

    def accepts(self, batch: ForwardBatch, rows: np.ndarray, hidden_rows: np.ndarray) -> bool:
        """Whether this batch is a decode step a graph can run (without adapters: the graphs hold
        no LoRA deltas)."""
        r = batch.num_requests
        return (
            r <= BUCKETS[-1]
            and not (batch.adapter_ids >= 0).any()
            and batch.num_tokens == r
            and int(batch.mask_indptr[-1]) == 0
            and hidden_rows.size == 0
            and rows.size > 0
            and int(np.diff(batch.kv_page_indptr).max()) <= self.max_pages
        )

    def forward(self, batch: ForwardBatch, rows: np.ndarray) -> tuple[torch.Tensor, None]:
        """Run a decode step (see :meth:`accepts`) through its bucket's graph.

        Returns:
            float32 ``[len(rows), vocab]`` logits on the device, and no hidden states.
        """
        r = batch.num_requests
        bucket = next(b for b in BUCKETS if b >= r)
        step = self.steps.get(bucket) or self._capture(bucket)
        index = write_slots(batch, self.cache.page_size)
        self.cache.write_positions(index, batch.positions, device=False)  # the graph writes the device's
        self._fill(step, batch, index)
        assert step.replay is not None and step.logits is not None
        step.replay()
        if len(rows) == r:  # every row (rows are sorted token indices): no index to copy over
            return step.logits[:r], None
        return step.logits.index_select(0, torch.from_numpy(rows).to(step.logits.device)), None

    def _buffers(self, bucket: int) -> _Step:
        dev = self.model.config.device
        spec = self.model.spec
        b = bucket
        pinned = dev.type == "cuda"
        host64 = torch.empty(2 * b, dtype=torch.int64, pin_memory=pinned)
        host32 = torch.empty(4 * b + 1 + b * self.max_pages, dtype=torch.int32, pin_memory=pinned)
        h64, h32 = host64.numpy(), host32.numpy()
        h64[:b], h64[b:] = 0, self.scratch_page * self.cache.page_size  # ids, write index
        h32[: 2 * b] = 0  # positions, write slots
        h32[2 * b : 3 * b] = 1  # kv lengths
        h32[3 * b : 4 * b + 1] = np.arange(b + 1)  # page table pointers
        h32[4 * b + 1 :] = self.scratch_page  # page ids
        dev64, dev32 = host64.to(dev), host32.to(dev)
        arange = torch.arange(b, dtype=torch.int32, device=dev)
        plan = TritonPlan(
            write_index=dev64[b:],
            positions=dev32[:b],
            write_slots=dev32[b : 2 * b],
            qo_indptr=torch.arange(b + 1, dtype=torch.int32, device=dev),
            page_indptr=dev32[3 * b : 4 * b + 1],
            page_indices=dev32[4 * b + 1 :],
            kv_len=dev32[2 * b : 3 * b],
            mask_indptr=torch.zeros(b + 1, dtype=torch.int64, device=dev),
            mask_data=torch.zeros(1, dtype=torch.uint8, device=dev),
            tile_req=arange,
            tile_start=arange.clone(),
            block_m=tile_block_m(spec.num_heads // spec.num_kv_heads, 1),
            window=self.model.window,
        )
        return _Step(ids=dev64[:b], plan=plan, host64=host64, host32=host32, dev64=dev64, dev32=dev32)

    def _capture(self, bucket: int) -> _Step:
        step = self._buffers(bucket)
        model = self.model
        all_rows = np.arange(bucket)

        def run() -> torch.Tensor:
            plan = step.plan
            self.cache.device.pos.view(-1).index_copy_(0, plan.write_index, plan.positions)  # padding: scratch page
            rot = {s: device_rotation(self.inv[s], plan.positions) for s in (False, True)}
            logits, _ = model.head(model.layers(step.ids, rot, step.plan), all_rows, None)
            return logits

        step.replay, step.logits = self.capture(run)
        self.steps[bucket] = step
        return step

    def _fill(self, step: _Step, batch: ForwardBatch, index: np.ndarray) -> None:
        """Stage the step in the host blocks and copy them over; rows past the batch decode into the
        scratch page."""
        r, b = batch.num_requests, step.ids.shape[0]
        if step.copied is not None:
            step.copied.synchronize()  # the last step's copy has left the staging blocks (long since, in practice)
        h64, h32 = step.host64.numpy(), step.host32.numpy()
        h64[:r], h64[r:b] = batch.token_ids, 0
        h64[b : b + r], h64[b + r :] = index, self.scratch_page * self.cache.page_size
        h32[:r], h32[r:b] = batch.positions, 0
        h32[b : b + r], h32[b + r : 2 * b] = batch.kv_write_slots, 0
        counts = np.diff(batch.kv_page_indptr)
        h32[2 * b : 2 * b + r] = (counts - 1) * self.cache.page_size + batch.kv_last_page_len
        h32[2 * b + r : 3 * b] = 1
        indptr = batch.kv_page_indptr
        h32[3 * b : 3 * b + r + 1] = indptr
        h32[3 * b + r + 1 : 4 * b + 1] = indptr[-1] + np.arange(1, b - r + 1)
        start = 4 * b + 1
        n = len(batch.kv_page_indices)
        h32[start : start + n] = batch.kv_page_indices
        h32[start + n : start + n + b - r] = self.scratch_page
        used = start + n + b - r
        step.dev64.copy_(step.host64, non_blocking=True)
        step.dev32[:used].copy_(step.host32[:used], non_blocking=True)
        if step.host32.is_pinned():
            step.copied = step.copied or torch.cuda.Event()
            step.copied.record()
