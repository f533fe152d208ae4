"""The backend worker: one loaded backend, the one thread that calls it, and its queues.

It is the only caller of the backend's hooks. Batches, page copies, adapter operations, the
model load and ``pie_backend_info`` all run on its thread, in the order they were handed to it:

- :meth:`BackendWorker.enqueue_copy` records a page copy; it runs right before the next batch.
- :meth:`BackendWorker.enqueue_op` records an operation; it runs when :meth:`flush_ops` sends the
  queue to the thread (the batcher does so before it fires a batch, and whenever it wakes).
- :meth:`BackendWorker.forward` sends the pending copies and one batch to the thread.
- :meth:`BackendWorker.call` runs one function there now and waits for it (load, info, tools).

When to fire a batch is the :class:`~pie_core.scheduler.batcher.Batcher`'s business, not this one's.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
import pluggy

from pie_core.backend.calls import BackendCalls
from pie_core.hookspec import BackendSpec, BatchOutput, CopyKind, ForwardBatch

__all__ = ["BackendWorker", "BatchOutcome", "backend_thread"]

T = TypeVar("T")

BatchOutcome = tuple[BatchOutput | Exception, float]
"""A batch's output, or the exception it raised, and its wall time on the backend in seconds."""

_Copy = tuple[CopyKind, list[int], list[int]]
_Op = tuple[Callable[[BackendCalls], Any], "asyncio.Future[Any]"]


def backend_thread() -> ThreadPoolExecutor:
    """A one-thread executor for one backend's work.

    A backend sees all its calls (load, batches, copies, adapter operations) on this one thread:
    thread pools keyed to the calling thread (OpenMP in torch) then keep one team of workers, which
    spin between a step's parallel regions. A second calling thread gives a second team, more
    workers than cores, and libgomp puts idle workers to sleep at once: every parallel region of a
    step then pays a wake-up (~75 µs measured on 2 cores, ~100 regions per decode step).
    """
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="pie-backend")


class BackendWorker:
    """Owns one bound backend, its thread, and its queues of page copies and operations.

    Args:
        pm: The bound backend (:func:`pie_core.plugins.bind_backend`). The worker is the only
            caller of its hooks from now on; hook wrappers may still be registered on it. None
            when ``calls`` reaches a backend elsewhere.
        calls: Makes the typed calls, given the identifier of the worker's thread (default:
            :class:`BackendCalls` over ``pm``): a proxy whose methods reach a backend in another
            process, e.g. a Ray actor (:mod:`pie_core.scaleout`). The worker runs it as it would
            the local calls, on its one thread, and closes it in :meth:`close`.
    """

    def __init__(self, pm: pluggy.PluginManager | None,
                 calls: Callable[[int], BackendCalls] | None = None) -> None:
        if calls is None:
            if pm is None:
                raise ValueError("a backend worker needs a bound backend (pm) or a calls factory")
            local = pm
            calls = lambda thread: BackendCalls(local, thread)  # noqa: E731
        self._pm = pm
        self._executor = backend_thread()
        ident: int = self._executor.submit(threading.get_ident).result()
        self._calls = calls(ident)
        self._copies: list[_Copy] = []
        self._ops: list[_Op] = []
        self._listener: Callable[[asyncio.AbstractEventLoop], None] | None = None
        self._closed = False

    @classmethod
    def of(cls, plugin: object, name: str = "backend") -> BackendWorker:
        """A worker over a plugin object registered as is, without the entry-point checks
        (tests, tools)."""
        pm = pluggy.PluginManager("pie")
        pm.add_hookspecs(BackendSpec)
        pm.register(plugin, name=name)
        return cls(pm)

    @property
    def thread_id(self) -> int:
        """The identifier (``threading.get_ident``) of the thread every hook call runs on."""
        return self._calls._thread

    def register(self, plugin: object) -> None:
        """Add a plugin beside the backend: a hook wrapper for metrics, tracing or fault injection.

        Raises:
            RuntimeError: The backend is in another process (its wrappers register there).
        """
        self._local_pm().register(plugin)

    def unregister(self, plugin: object) -> None:
        """Remove a plugin added by :meth:`register`."""
        self._local_pm().unregister(plugin)

    def plugins(self) -> list[object]:
        """The backend's plugin objects (the backend itself and any wrappers); none when the
        backend is in another process."""
        return list(self._pm.get_plugins()) if self._pm is not None else []

    def _local_pm(self) -> pluggy.PluginManager:
        if self._pm is None:
            raise RuntimeError("this worker's backend runs in another process: register hook wrappers there")
        return self._pm

    def call(self, fn: Callable[[BackendCalls], T]) -> T:
        """Run ``fn(calls)`` on the backend thread now (after whatever it runs) and wait for it.

        Returns:
            What ``fn`` returned.

        Raises:
            Whatever ``fn`` raised; RuntimeError once the worker is closed.
        """
        self._check_open()
        return self._executor.submit(fn, self._calls).result()

    def listen(self, listener: Callable[[asyncio.AbstractEventLoop], None]) -> None:
        """Have ``listener(loop)`` called on the event loop each time an operation is enqueued
        (the batcher wakes to send it to the thread)."""
        self._listener = listener

    def enqueue_copy(self, kind: CopyKind, src: list[int], dst: list[int]) -> None:
        """Schedule a page copy to run on the backend thread before the next batch.

        Deferring keeps copies ordered with batches: a copy sees every write of earlier
        batches and none of later ones, and the caller never waits.

        Raises:
            ValueError: ``src`` and ``dst`` differ in length.
        """
        if len(src) != len(dst):
            raise ValueError(f"copy of {len(src)} pages into {len(dst)}")
        if src:
            self._copies.append((kind, list(src), list(dst)))

    def enqueue_op(self, op: Callable[[BackendCalls], T]) -> asyncio.Future[T]:
        """Schedule ``op(calls)`` on the backend thread, after the batch in flight and before the next.

        Operations run in the order they were enqueued, also when no batch follows (the listener
        wakes whoever flushes them). Passes submitted after this call see the operation's effect.

        Returns:
            A future with ``op``'s result or exception (a failed op fails no batch).
        """
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()
        self._ops.append((op, done))
        if self._listener is not None:
            self._listener(loop)
        return done

    @property
    def pending_ops(self) -> int:
        """Operations enqueued and not yet sent to the thread."""
        return len(self._ops)

    def adopt(self, loop: asyncio.AbstractEventLoop) -> None:
        """Move the pending operations onto ``loop`` (an engine may outlive one event loop).

        Operations from a closed loop still run, in order (a released adapter must be freed
        before its id is handed out again); nobody can await their old futures any more.
        """
        self._ops = [(op, f if f.get_loop() is loop else loop.create_future()) for op, f in self._ops]

    def flush_ops(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[Any] | None:
        """Send the enqueued operations to the backend thread (they run after the batch in flight).

        Their futures are settled when they ran, on ``loop``. Returns a future done when they
        ran, or None when none was pending.
        """
        ops, self._ops = self._ops, []
        if not ops:
            return None
        self._check_open()
        ran = asyncio.wrap_future(self._executor.submit(self._run_ops, ops), loop=loop)
        ran.add_done_callback(lambda f: _settle(ops, f.result()))
        return ran

    def forward(self, batch: ForwardBatch, loop: asyncio.AbstractEventLoop) -> asyncio.Future[BatchOutcome]:
        """Send the pending page copies and then ``batch`` to the backend thread.

        Returns:
            A future on ``loop`` with the batch's :data:`BatchOutcome`; a failed copy or forward
            is its outcome, never the future's exception.
        """
        self._check_open()
        copies, self._copies = self._copies, []
        return asyncio.wrap_future(self._executor.submit(self._execute, batch, copies), loop=loop)

    def fail_pending(self, error: Exception) -> None:
        """Fail every operation not yet sent to the thread with ``error`` and forget it."""
        for _, done in self._ops:
            if not done.done():
                done.set_exception(error)
        self._ops.clear()

    def close(self, wait: bool = True) -> None:
        """Stop the thread once the work sent to it ran; with ``wait``, wait for that, then
        release what the calls reach (:meth:`BackendCalls.close`). Idempotent."""
        first = not self._closed
        self._closed = True
        self._executor.shutdown(wait=wait)
        if first:
            self._calls.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the backend worker is closed")

    def _execute(self, batch: ForwardBatch, copies: list[_Copy]) -> BatchOutcome:
        started = time.perf_counter()
        try:
            for kind, src, dst in copies:
                self._calls.copy_pages(kind, np.asarray(src, dtype=np.int32), np.asarray(dst, dtype=np.int32))
            outcome: BatchOutput | Exception = self._calls.forward(batch)
        except Exception as exc:  # handed to the batch's requests
            outcome = exc
        return outcome, time.perf_counter() - started

    def _run_ops(self, ops: list[_Op]) -> list[tuple[bool, Any]]:
        results: list[tuple[bool, Any]] = []
        for op, _ in ops:
            try:
                results.append((True, op(self._calls)))
            except Exception as exc:  # handed to the op's future
                results.append((False, exc))
        return results


def _settle(ops: list[_Op], results: list[tuple[bool, Any]]) -> None:
    for (_, done), (ok, value) in zip(ops, results):
        if done.done():
            continue
        if ok:
            done.set_result(value)
        else:
            done.set_exception(value)


