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
    """Static buffers of one bucket, and its captured replay."""

    ids: torch.Tensor  # int64 [B]
    plan: TritonPlan
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
        self.cache.write_positions(index, batch.positions)
        self._fill(step, batch, index)
        assert step.replay is not None and step.logits is not None
        step.replay()
        return step.logits.index_select(0, torch.from_numpy(rows).to(step.logits.device)), None

    def _buffers(self, bucket: int) -> _Step:
        dev = self.model.config.device
        ps = self.cache.page_size
        spec = self.model.spec

        def zeros(n: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(n, dtype=dtype, device=dev)

        arange = torch.arange(bucket, dtype=torch.int32, device=dev)
        plan = TritonPlan(
            write_index=torch.full((bucket,), self.scratch_page * ps, dtype=torch.int64, device=dev),
            positions=zeros(bucket, torch.int32),
            write_slots=zeros(bucket, torch.int32),
            qo_indptr=torch.arange(bucket + 1, dtype=torch.int32, device=dev),
            page_indptr=torch.arange(bucket + 1, dtype=torch.int32, device=dev),
            page_indices=torch.full((bucket * self.max_pages,), self.scratch_page, dtype=torch.int32, device=dev),
            kv_len=torch.ones(bucket, dtype=torch.int32, device=dev),
            mask_indptr=zeros(bucket + 1, torch.int64),
            mask_data=zeros(1, torch.uint8),
            tile_req=arange,
            tile_start=arange.clone(),
            block_m=tile_block_m(spec.num_heads // spec.num_kv_heads, 1),
            window=self.model.window,
        )
        return _Step(ids=zeros(bucket, torch.int64), plan=plan)

    def _capture(self, bucket: int) -> _Step:
        step = self._buffers(bucket)
        model = self.model
        all_rows = np.arange(bucket)

        def run() -> torch.Tensor:
            rot = {s: device_rotation(self.inv[s], step.plan.positions) for s in (False, True)}
            logits, _ = model.head(model.layers(step.ids, rot, step.plan), all_rows, None)
            return logits

        step.replay, step.logits = self.capture(run)
        self.steps[bucket] = step
        return step

    def _fill(self, step: _Step, batch: ForwardBatch, index: np.ndarray) -> None:
        """Copy the step into the static buffers; rows past the batch decode into the scratch page."""
        r, bucket = batch.num_requests, step.ids.shape[0]
        ps = self.cache.page_size
        counts = np.diff(batch.kv_page_indptr).astype(np.int64)
        pad = bucket - r
        kv_len = (counts - 1) * ps + batch.kv_last_page_len
        host = {
            "ids": np.concatenate([batch.token_ids, np.zeros(pad)]).astype(np.int64),
            "positions": np.concatenate([batch.positions, np.zeros(pad)]).astype(np.int32),
            "write_slots": np.concatenate([batch.kv_write_slots, np.zeros(pad)]).astype(np.int32),
            "write_index": np.concatenate([index, np.full(pad, self.scratch_page * ps)]).astype(np.int64),
            "kv_len": np.concatenate([kv_len, np.ones(pad)]).astype(np.int32),
            "page_indptr": np.concatenate([batch.kv_page_indptr, batch.kv_page_indptr[-1] + np.arange(1, pad + 1)]).astype(np.int32),
        }
        pages = np.concatenate([batch.kv_page_indices, np.full(pad, self.scratch_page)]).astype(np.int32)
        plan = step.plan
        step.ids.copy_(torch.from_numpy(host["ids"]))
        for name in ("positions", "write_slots", "write_index", "kv_len", "page_indptr"):
            getattr(plan, name).copy_(torch.from_numpy(host[name]))
        plan.page_indices[: len(pages)].copy_(torch.from_numpy(pages))
