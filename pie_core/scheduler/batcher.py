"""The per-model batcher: merges all queued forward requests into one backend call at a time.

One batch is in flight per backend; the backend runs in its own worker thread so the event loop
keeps serving inferlets (and queueing the next batch) meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from pie_core.errors import BackendError
import numpy as np

from pie_core.hookspec import BatchOutput, Capabilities, CopyKind, ForwardBatch
from pie_core.scheduler.assemble import assemble, split_output
from pie_core.scheduler.request import ForwardRequest, RequestOutput

__all__ = ["Batcher", "BatchStats"]


class BatchStats:
    """Counters a test or ``/metrics`` reads: batches fired and their sizes."""

    def __init__(self) -> None:
        self.batches = 0
        self.requests = 0
        self.tokens = 0
        self.sampled = 0  # tokens the backend sampled (sum of draws over sample rows)
        self.sizes: Counter[int] = Counter()
        self.backend_seconds = 0.0

    @property
    def max_requests(self) -> int:
        return max(self.sizes, default=0)


class Batcher:
    """Queue of ForwardRequests for one model, fired as batches.

    Policy ``adaptive`` fires when the queue holds as many requests as the last batch did, when
    a limit would be exceeded, or when the oldest request has waited as long as the last batch
    took. ``greedy`` fires whatever is queued at once (for debugging).
    """

    def __init__(
        self,
        forward: Callable[[ForwardBatch], BatchOutput],
        caps: Capabilities,
        policy: str = "adaptive",
        copy_pages: Callable[[CopyKind, np.ndarray, np.ndarray], None] | None = None,
    ) -> None:
        if policy not in ("adaptive", "greedy"):
            raise ValueError(f"unknown batching policy {policy!r}; use 'adaptive' or 'greedy'")
        self._forward = forward
        self._copy_pages = copy_pages
        self._copies: list[tuple[CopyKind, list[int], list[int]]] = []
        self._ops: list[tuple[Callable[[], Any], asyncio.Future[Any]]] = []
        self._caps = caps
        self._policy = policy
        self._queue: list[ForwardRequest] = []
        self._queued_tokens = 0
        self._want = 1  # queue length at which a submit wakes the run loop
        self._wakeup = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pie-backend")
        self._task: asyncio.Task[None] | None = None
        self._last_size = 1
        self._last_duration = 0.0
        self.stats = BatchStats()

    async def submit(self, request: ForwardRequest) -> RequestOutput:
        """Queue one request and wait for its share of the batch output."""
        loop = asyncio.get_running_loop()
        self._adopt(loop)
        request.future = loop.create_future()
        self._queue.append(request)
        self._queued_tokens += request.num_tokens
        # Wake the run loop only when it would act: waking it per submit costs a timer each time.
        if len(self._queue) >= self._want or self._at_limit():
            self._wakeup.set()
        return await request.future

    def _adopt(self, loop: asyncio.AbstractEventLoop) -> None:
        if loop is not self._loop:  # an engine may outlive one event loop (tests, notebooks)
            self._loop, self._wakeup, self._task = loop, asyncio.Event(), None
            self._queue = [r for r in self._queue if r.future is not None and r.future.get_loop() is loop]
            self._queued_tokens = sum(r.num_tokens for r in self._queue)
            # Operations from a closed loop still run, in order (a released adapter must be freed
            # before its id is handed out again); nobody can await their old futures any more.
            self._ops = [(op, f if f.get_loop() is loop else loop.create_future()) for op, f in self._ops]
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name="pie-batcher")

    def enqueue_copy(self, kind: CopyKind, src: list[int], dst: list[int]) -> None:
        """Schedule a page copy to run on the backend thread before the next batch.

        Deferring keeps copies ordered with batches: a copy sees every write of earlier
        batches and none of later ones, and the caller never waits.
        """
        if len(src) != len(dst):
            raise ValueError(f"copy of {len(src)} pages into {len(dst)}")
        if src:
            self._copies.append((kind, list(src), list(dst)))

    def enqueue_op(self, op: Callable[[], Any]) -> asyncio.Future[Any]:
        """Schedule ``op()`` on the backend thread, after the batch in flight and before the next.

        Operations run in the order they were enqueued, also when no batch follows (the run loop
        wakes for them). Passes submitted after this call see the operation's effect.

        Returns:
            A future with ``op``'s result or exception (a failed op fails no batch).
        """
        loop = asyncio.get_running_loop()
        self._adopt(loop)
        done: asyncio.Future[Any] = loop.create_future()
        self._ops.append((op, done))
        self._wakeup.set()
        return done

    def _run_ops(self, ops: list[tuple[Callable[[], Any], asyncio.Future[Any]]]) -> list[tuple[bool, Any]]:
        results: list[tuple[bool, Any]] = []
        for op, _ in ops:
            try:
                results.append((True, op()))
            except Exception as exc:  # handed to the op's future
                results.append((False, exc))
        return results

    def _execute(self, batch: ForwardBatch, copies: list[tuple[CopyKind, list[int], list[int]]]) -> BatchOutput:
        for kind, src, dst in copies:
            if self._copy_pages is None:
                raise BackendError("this backend cannot copy pages")
            self._copy_pages(kind, np.asarray(src, dtype=np.int32), np.asarray(dst, dtype=np.int32))
        return self._forward(batch)

    @property
    def queued(self) -> int:
        return len(self._queue)

    async def close(self) -> None:
        """Stop the loop, fail what is queued, and stop the worker thread."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        for req in self._queue:
            if req.future is not None and not req.future.done():
                req.future.set_exception(BackendError("the engine shut down before this pass ran"))
        for _, done in self._ops:
            if not done.done():
                done.set_exception(BackendError("the engine shut down before this operation ran"))
        self._ops.clear()
        self._queue.clear()
        self._queued_tokens = 0
        self._executor.shutdown(wait=True)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._queue:
                if self._ops:
                    await self._flush_ops(loop)
                    continue
                self._wakeup.clear()
                await self._wakeup.wait()
            await self._gather()
            await self._flush_ops(loop)
            taken = self._take()
            if not taken:
                continue
            batch = assemble(taken, self._caps.vocab_size)
            started = time.perf_counter()
            copies, self._copies = self._copies, []
            try:
                output = await loop.run_in_executor(self._executor, self._execute, batch, copies)
                results = split_output(taken, batch, output)
            except Exception as exc:  # the backend failed: every request of the batch fails
                err = exc if isinstance(exc, BackendError) else BackendError(f"backend failed: {exc!r}")
                for req in taken:
                    if req.future is not None and not req.future.done():
                        req.future.set_exception(err)
                continue
            finally:
                self._last_duration = time.perf_counter() - started
                self.stats.backend_seconds += self._last_duration
            self._last_size = len(taken)
            self.stats.batches += 1
            self.stats.requests += len(taken)
            self.stats.tokens += batch.num_tokens
            self.stats.sampled += len(output.tokens)
            self.stats.sizes[len(taken)] += 1
            for req, res in zip(taken, results):
                if req.future is not None and not req.future.done():
                    req.future.set_result(res)

    async def _flush_ops(self, loop: asyncio.AbstractEventLoop) -> None:
        ops, self._ops = self._ops, []
        if not ops:
            return
        # Shielded: cancelling the run loop (its event loop closing) must not cancel operations
        # not yet started on the backend thread -- a released adapter's free would be lost.
        results = await asyncio.shield(asyncio.wrap_future(self._executor.submit(self._run_ops, ops), loop=loop))
        for (_, done), (ok, value) in zip(ops, results):
            if done.done():
                continue
            if ok:
                done.set_result(value)
            else:
                done.set_exception(value)

    async def _gather(self) -> None:
        """Adaptive firing: wait briefly for the queue to reach the last batch's size."""
        if self._policy == "greedy":
            return
        deadline = time.perf_counter() + self._last_duration
        self._want = self._last_size
        try:
            while len(self._queue) < self._last_size and not self._at_limit():
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    return
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), remaining)
                except TimeoutError:
                    return
        finally:
            self._want = 1

    def _at_limit(self) -> bool:
        caps = self._caps
        return (
            len(self._queue) >= caps.max_batch_requests
            or self._queued_tokens >= caps.max_batch_tokens
        )

    def _take(self) -> list[ForwardRequest]:
        """Pop the longest queue prefix within the capability limits (always at least one)."""
        caps = self._caps
        tokens = rows = 0
        count = 0
        for req in self._queue:
            tokens += req.num_tokens
            rows += len(req.samples) + len(req.probes)
            if count and (
                count + 1 > caps.max_batch_requests
                or tokens > caps.max_batch_tokens
                or rows > caps.max_sample_rows
            ):
                break
            count += 1
        taken, self._queue = self._queue[:count], self._queue[count:]
        self._queued_tokens -= sum(r.num_tokens for r in taken)
        return [r for r in taken if r.future is None or not r.future.cancelled()]
