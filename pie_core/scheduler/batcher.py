"""The per-model batcher: merges all queued forward requests into one backend call at a time.

One batch is in flight per backend; the backend runs on its worker's thread
(:class:`~pie_core.backend.BackendWorker`), and while it runs batch k the event loop keeps
serving inferlets and assembles batch k+1 (run-ahead). The batcher decides when to fire; the
worker is what calls the backend.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from pie_core.backend import BackendWorker, BatchOutcome
from pie_core.errors import BackendError
from pie_core.hookspec import Capabilities, ForwardBatch
from pie_core.scheduler.assemble import assemble, split_output
from pie_core.scheduler.request import ForwardRequest, RequestOutput
from pie_core.scheduler.step_cost import StepCost
from pie_core.scheduler.trace import BatchTrace

__all__ = ["Batcher", "BatchStats"]

_log = logging.getLogger(__name__)


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


@dataclass(slots=True)
class _Flight:
    """The batch on the backend thread; ``future`` gives (output or error, backend seconds)."""

    requests: list[ForwardRequest]
    batch: ForwardBatch
    future: asyncio.Future[BatchOutcome]
    fired: float  # time.time() when it went to the backend thread


DECODE_TOKENS = 16
"""A batch whose requests hold at most this many tokens each (a decode step, with its drafts) is
what the step-cost fit learns from: the drafter asks about such steps, and prompts' passes cost
per token as matrix products do."""


def _live(req: ForwardRequest) -> bool:
    return req.future is None or not req.future.done()


def _mask_size(req: ForwardRequest) -> int:
    return 0 if req.attention_mask is None else int(req.attention_mask.size)


class Batcher:
    """Queue of ForwardRequests for one model, fired as batches.

    Policy ``adaptive`` fires when the next batch holds as many requests as the last batch did,
    when a capability limit is reached, or when it has gathered for as long as the last batch
    took (the clock starts when the previous batch returned, or at the first request after an
    idle spell). ``greedy`` fires whatever is queued at once (for debugging). A batch stays
    within ``max_batch_requests``, ``max_batch_tokens``, ``max_sample_rows``,
    ``max_mask_bytes`` (custom-mask entries) and ``max_adapters`` distinct adapters (the backend
    holds no more at once; the worker pages them in), except a single request is always taken.

    The run loop guarantees:

    - A batch fires only when the backend thread is idle (no batch or operation running), so at
      most one batch is in flight and batches run in firing order.
    - While batch k (or an operation) runs, requests queued at its launch or arriving meanwhile
      are taken into batch k+1 and assembled, so k+1 fires as soon as k returns if it is ready
      by the rules above. Requests queued in callbacks of k's results (a decode loop run ahead)
      make it into k+1: the loop gets one turn between k's return and k+1's firing.
    - Operations enqueued before a batch fires run before it, and so do page copies (they are
      taken when the batch fires, not when it is assembled).
    - A request whose future is cancelled or done before its batch fires is not sent: the batch
      is re-assembled without it (its pages may already belong to someone else).
    - Each request's future gets its share of the output, or the batch's error if the backend
      failed; a failure touches only the requests of that batch.

    Args:
        worker: The backend's worker: it runs the batches, and the page copies and operations
            enqueued on it (it wakes the batcher for each operation). Closed by :meth:`close`.
        caps: The backend's limits.
        policy: ``"adaptive"`` or ``"greedy"``.
        on_batch: Called on the event loop after every batch returned, successful or not, and
            after its results reached the futures, with the batch's backend wall time in
            seconds. An exception from it is logged and ignored.
        trace: Gets every batch that returned (see :mod:`.trace`); closed by :meth:`close`.
    """

    def __init__(
        self,
        worker: BackendWorker,
        caps: Capabilities,
        policy: str = "adaptive",
        on_batch: Callable[[float], None] | None = None,
        trace: BatchTrace | None = None,
    ) -> None:
        if policy not in ("adaptive", "greedy"):
            raise ValueError(f"unknown batching policy {policy!r}; use 'adaptive' or 'greedy'")
        self.worker = worker
        """The backend's worker: batches, copies and operations all run on its thread."""
        self._on_batch = on_batch
        self._trace = trace
        self._caps = caps
        self._policy = policy
        self._queue: list[ForwardRequest] = []  # submitted, not yet taken
        self._ahead: list[ForwardRequest] = []  # taken into the next batch
        self._ahead_batch: ForwardBatch | None = None  # _ahead assembled; None when stale
        self._pending_tokens = 0  # over _queue and _ahead
        self._pending_mask = 0
        self._flight: _Flight | None = None
        self._ops_ran: asyncio.Future[Any] | None = None  # the last operations sent to the backend
        self._want = 1  # queue length at which a submit wakes the run loop
        self._wakeup = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._last_size = 1
        self.cost = StepCost()  # step seconds against batch tokens (the system drafter's budget)
        self.last_tokens = 0  # tokens of the last batch that landed
        self._last_duration = 0.0
        self.stats = BatchStats()
        self._dead: Exception | None = None  # set by stop(): every request fails with it
        self.on_failure: Callable[[Exception], None] | None = None
        """Called on the event loop with the error of every batch the backend failed (the
        engine marks the replica dead); an exception from it is logged and ignored."""
        worker.listen(self._op_enqueued)

    @property
    def last_requests(self) -> int:
        """Requests of the last batch that landed (1 before any)."""
        return self._last_size

    async def submit(self, request: ForwardRequest) -> RequestOutput:
        """Queue one request and wait for its share of the batch output."""
        return await self.enqueue(request)

    def enqueue(self, request: ForwardRequest) -> asyncio.Future[RequestOutput]:
        """Queue one request; the future gets its share of the batch output. Cancelling the
        future before its batch fires takes the request out of it."""
        loop = asyncio.get_running_loop()
        self._adopt(loop)
        request.future = loop.create_future()
        if self._dead is not None:  # its replica died: nothing more reaches its backend
            request.future.set_exception(self._dead)
            return request.future
        self._queue.append(request)
        self._pending_tokens += request.num_tokens
        self._pending_mask += _mask_size(request)
        # Wake the run loop only when it would act: waking it per submit costs a timer each time.
        if len(self._queue) >= self._want or self._at_limit():
            self._wakeup.set()
        return request.future

    def _adopt(self, loop: asyncio.AbstractEventLoop) -> None:
        if loop is not self._loop:  # an engine may outlive one event loop (tests, notebooks)
            self._loop, self._wakeup, self._task = loop, asyncio.Event(), None
            self._flight = self._ops_ran = None
            pending = self._ahead + self._queue
            self._queue = [r for r in pending if r.future is not None and r.future.get_loop() is loop]
            self._ahead, self._ahead_batch = [], None
            self._pending_tokens = sum(r.num_tokens for r in self._queue)
            self._pending_mask = sum(_mask_size(r) for r in self._queue)
            self.worker.adopt(loop)
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name="pie-batcher")

    def _op_enqueued(self, loop: asyncio.AbstractEventLoop) -> None:
        """The worker got an operation: wake the run loop (started if need be) to send it."""
        self._adopt(loop)
        self._wakeup.set()

    @property
    def queued(self) -> int:
        """Requests waiting for a batch (queued or taken into the next one)."""
        return len(self._queue) + len(self._ahead)

    @property
    def in_flight(self) -> int:
        """Requests of the batch the backend runs now (0 when none runs)."""
        return 0 if self._flight is None else len(self._flight.requests)

    def stop(self, error: Exception) -> None:
        """Take no more requests: every one that waits for a batch (queued or taken into the
        next) and every one enqueued from now on fails with ``error`` (a dead replica); the
        batch in flight, if any, lands as usual. Operations still run (page copies, adapter
        calls), so contexts can release their pages."""
        self._dead = error
        self.fail_waiting(error)

    def fail_waiting(self, error: Exception) -> None:
        """Fail every request that waits for a batch (queued or taken into the next) with
        ``error``; the batch in flight, if any, lands as usual."""
        for req in self._ahead + self._queue:
            if req.future is not None and not req.future.done():
                req.future.set_exception(error)
        self._queue.clear()
        self._ahead, self._ahead_batch = [], None
        self._pending_tokens = self._pending_mask = 0

    async def close(self) -> None:
        """Stop the loop, let the batch in flight finish, fail what waits, stop the worker thread."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        flight, self._flight = self._flight, None
        if flight is not None and flight.future.get_loop() is asyncio.get_running_loop():
            await asyncio.wait([flight.future])
            self._land(flight)
        self.fail_waiting(BackendError("the engine shut down before this pass ran"))
        self.worker.fail_pending(BackendError("the engine shut down before this operation ran"))
        self.worker.close()
        if self._trace is not None:
            self._trace.close()

    async def _run(self) -> None:
        opened: float | None = None  # when the next batch began gathering
        while True:
            if self._flight is not None and self._flight.future.done():
                self._land(self._flight)
                # One turn of the loop first: what the landed passes queue at once (a decode loop
                # run ahead, pie_core.host.ahead) joins the next batch instead of missing it.
                await asyncio.sleep(0)
            # After that turn: an operation enqueued during it set a wakeup the clear below drops.
            self._flush_ops()
            self._take()
            timeout = None
            busy = self._flight is not None or (self._ops_ran is not None and not self._ops_ran.done())
            if not busy and self._ahead:
                now = time.perf_counter()
                opened = now if opened is None else opened
                timeout = opened + self._last_duration - now
                full = bool(self._queue) or self._at_limit()  # _take stops only at a limit
                if self._policy == "greedy" or full or len(self._ahead) >= self._last_size or timeout <= 0:
                    self._fire()
                    opened = None
                    continue
            elif self._ahead and self._ahead_batch is None:  # run-ahead: assemble k+1 while k runs
                self._ahead_batch = assemble(self._ahead, self._caps.vocab_size)
            # While gathering, wake when the batch would be as large as the last one; else at once.
            self._want = self._last_size - len(self._ahead) if not busy and self._ahead else 1
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout)
            except TimeoutError:
                pass

    def _take(self) -> None:
        """Move the longest queue prefix that fits beside ``_ahead`` into it (always at least one
        request per batch); requests already cancelled are dropped."""
        caps = self._caps
        count = len(self._ahead)
        tokens = sum(r.num_tokens for r in self._ahead)
        rows = sum(len(r.samples) + len(r.probes) for r in self._ahead)
        mask = sum(_mask_size(r) for r in self._ahead)
        adapters = {r.adapter_id for r in self._ahead if r.adapter_id >= 0}
        n = 0
        for req in self._queue:
            if _live(req):
                tokens += req.num_tokens
                rows += len(req.samples) + len(req.probes)
                mask += _mask_size(req)
                new_adapter = req.adapter_id >= 0 and req.adapter_id not in adapters
                if count and (
                    count + 1 > caps.max_batch_requests
                    or tokens > caps.max_batch_tokens
                    or rows > caps.max_sample_rows
                    or mask > caps.max_mask_bytes
                    or (new_adapter and len(adapters) >= caps.max_adapters)  # the backend holds no more at once
                ):
                    break
                if new_adapter:
                    adapters.add(req.adapter_id)
                count += 1
            n += 1
        if not n:
            return
        taken, self._queue = self._queue[:n], self._queue[n:]
        live = [r for r in taken if _live(r)]
        self._forget([r for r in taken if not _live(r)])
        if live:
            self._ahead += live
            self._ahead_batch = None

    def _at_limit(self) -> bool:
        caps = self._caps
        return (
            len(self._queue) + len(self._ahead) >= caps.max_batch_requests
            or self._pending_tokens >= caps.max_batch_tokens
            or 0 < caps.max_mask_bytes <= self._pending_mask
        )

    def _forget(self, requests: Sequence[ForwardRequest]) -> None:
        self._pending_tokens -= sum(r.num_tokens for r in requests)
        self._pending_mask -= sum(_mask_size(r) for r in requests)

    def _fire(self) -> None:
        """Send ``_ahead`` (without requests cancelled meanwhile) to the idle backend thread, with
        the copies enqueued so far (the operations enqueued so far already ran)."""
        live = [r for r in self._ahead if _live(r)]
        batch = self._ahead_batch if len(live) == len(self._ahead) else None
        self._forget(self._ahead)
        self._ahead, self._ahead_batch = [], None
        if not live:
            return
        if batch is None:
            batch = assemble(live, self._caps.vocab_size)
        assert self._loop is not None  # set by _adopt before anything is queued
        future = self.worker.forward(batch, self._loop)
        future.add_done_callback(lambda _: self._wakeup.set())
        self._flight = _Flight(live, batch, future, time.time() if self._trace is not None else 0.0)

    def _land(self, flight: _Flight) -> None:
        """Hand a returned batch's results (or error) to its requests' futures."""
        self._flight = None
        outcome, seconds = flight.future.result()
        self._last_duration = seconds
        self.stats.backend_seconds += seconds
        if self._trace is not None:
            self._trace.write(flight.batch, flight.fired, seconds)
        taken = flight.requests
        try:
            if isinstance(outcome, Exception):
                raise outcome
            results = split_output(taken, flight.batch, outcome)
        except Exception as exc:  # the backend failed: every request of the batch fails
            err = exc if isinstance(exc, BackendError) else BackendError(f"backend failed: {exc!r}")
            for req in taken:
                if req.future is not None and not req.future.done():
                    req.future.set_exception(err)
            if self.on_failure is not None:
                try:
                    self.on_failure(err)
                except Exception:
                    _log.exception("the on_failure hook failed; the batcher goes on")
        else:
            self._last_size = len(taken)
            self.last_tokens = flight.batch.num_tokens
            if max(r.num_tokens for r in taken) <= DECODE_TOKENS:  # a prompt's pass costs per token otherwise
                self.cost.observe(flight.batch.num_tokens, seconds)
            self.stats.batches += 1
            self.stats.requests += len(taken)
            self.stats.tokens += flight.batch.num_tokens
            self.stats.sampled += len(outcome.tokens)
            self.stats.sizes[len(taken)] += 1
            for req, res in zip(taken, results):
                if req.future is not None and not req.future.done():
                    req.future.set_result(res)
        if self._on_batch is not None:
            try:
                self._on_batch(seconds)
            except Exception:
                _log.exception("the on_batch hook failed; the batcher goes on")

    def _flush_ops(self) -> None:
        """Send the worker's enqueued operations to its thread (they run after the batch in
        flight); their futures are settled when they ran, whether or not the run loop lives."""
        if not self.worker.pending_ops:
            return
        assert self._loop is not None  # set by _adopt before anything is queued
        ran = self.worker.flush_ops(self._loop)
        if ran is not None:
            ran.add_done_callback(lambda _: self._wakeup.set())
            self._ops_ran = ran
