"""The batcher: capability budgets, run-ahead, ordering of copies and ops, cancellation, hooks."""

from __future__ import annotations

import asyncio
import logging
import threading
import types
from typing import Any, Awaitable, Callable

import numpy as np
import pytest

import pie_core.backend.worker as worker_module
import pie_core.scheduler.batcher as batcher_module
from pie_core.backend import BackendWorker, FunctionBackend
from pie_core.errors import BackendError
from pie_core.hookspec import BatchOutput, Capabilities, CopyKind, ForwardBatch
from pie_core.scheduler.batcher import Batcher
from pie_core.scheduler.request import ForwardRequest, SampleSpec


def caps(**limits: int) -> Capabilities:
    base = dict(max_batch_tokens=1024, max_batch_requests=64, max_sample_rows=64, max_mask_bytes=1 << 20)
    return Capabilities(
        page_size=16, num_pages=64, num_host_pages=0, vocab_size=100, dtype="float32", device="cpu",
        **{**base, **limits},
    )


def request(*tokens: int, mask: bool = False) -> ForwardRequest:
    """A pass over ``tokens`` sampling its last row; with ``mask``, a full square custom mask."""
    n = len(tokens)
    return ForwardRequest(
        token_ids=np.array(tokens, dtype=np.int32),
        positions=np.arange(n, dtype=np.int32),
        page_ids=np.zeros(1, dtype=np.int32),
        last_page_len=n,
        write_slots=np.arange(n, dtype=np.int32),
        attention_mask=np.ones((n, n), dtype=bool) if mask else None,
        samples=(SampleSpec(index=n - 1),),
    )


class FakeBackend:
    """Samples each sample row's own input token; records what ran, in order, on which thread.

    ``hold()`` makes the next forwards block until ``release()``.
    """

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.running = 0
        self.max_running = 0
        self.fail_on: int | None = None  # a token id whose batch raises

    def hold(self) -> None:
        self.gate.clear()
        self.entered.clear()

    def release(self) -> None:
        self.gate.set()

    def forward(self, batch: ForwardBatch) -> BatchOutput:
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        self.log.append(("forward", batch.token_ids.tolist()))
        self.entered.set()
        self.gate.wait(5)
        self.running -= 1
        if self.fail_on is not None and self.fail_on in batch.token_ids:
            raise RuntimeError("device on fire")
        return BatchOutput(tokens=np.repeat(batch.token_ids[batch.sample_rows], batch.draws))

    def copy_pages(self, kind: CopyKind, src: np.ndarray, dst: np.ndarray) -> None:
        self.log.append(("copy", src.tolist()))

    @property
    def batches(self) -> list[list[int]]:
        return [tokens for what, tokens in self.log if what == "forward"]


def make(backend: FakeBackend, **kwargs: Any) -> Batcher:
    limits = kwargs.pop("limits", {})
    return Batcher(BackendWorker.of(FunctionBackend(backend.forward, backend.copy_pages)), caps(**limits), **kwargs)


async def until(condition: Callable[[], bool], what: str) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting until {what}")


async def entered(backend: FakeBackend) -> None:
    await asyncio.to_thread(backend.entered.wait, 5)


def run(main: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(main())


def first_token(out) -> int:
    return out.tokens[0][0]


def test_masked_requests_within_the_mask_budget_share_a_batch():
    backend = FakeBackend()
    batcher = make(backend, limits=dict(max_mask_bytes=100))

    async def main():
        outs = await asyncio.gather(*(batcher.submit(request(*range(t, t + 6), mask=True)) for t in (10, 20)))
        await batcher.close()
        return outs

    outs = run(main)
    assert [first_token(o) for o in outs] == [15, 25]
    assert len(backend.batches) == 1  # 36 + 36 mask entries <= 100


def test_masked_requests_over_the_mask_budget_run_in_separate_batches():
    backend = FakeBackend()
    batcher = make(backend, limits=dict(max_mask_bytes=100))

    async def main():
        outs = await asyncio.gather(*(batcher.submit(request(*range(t, t + 8), mask=True)) for t in (10, 20)))
        await batcher.close()
        return outs

    outs = run(main)
    assert [first_token(o) for o in outs] == [17, 27]
    assert backend.batches == [list(range(10, 18)), list(range(20, 28))]  # 64 + 64 > 100


def test_unmasked_requests_cost_no_mask_budget():
    backend = FakeBackend()
    batcher = make(backend, limits=dict(max_mask_bytes=10))

    async def main():
        await asyncio.gather(batcher.submit(request(1, 2, 3, mask=True)), batcher.submit(request(4, 5, 6)))
        await batcher.close()

    run(main)
    assert backend.batches == [[1, 2, 3, 4, 5, 6]]


def test_next_batch_is_assembled_while_the_current_one_runs(monkeypatch):
    backend = FakeBackend()
    assembled: list[tuple[list[int], bool]] = []  # (token ids, was batch 1 still running)

    def recording_assemble(requests, vocab_size):
        assembled.append(([int(t) for r in requests for t in r.token_ids], backend.running > 0))
        return real_assemble(requests, vocab_size)

    real_assemble = batcher_module.assemble
    monkeypatch.setattr(batcher_module, "assemble", recording_assemble)
    batcher = make(backend)

    async def main():
        backend.hold()
        first = asyncio.create_task(batcher.submit(request(1)))
        await entered(backend)
        later = [asyncio.create_task(batcher.submit(request(t))) for t in (2, 3)]
        await until(lambda: ([2, 3], True) in assembled, "batch 2 is assembled")
        backend.release()
        outs = await asyncio.gather(first, *later)
        await batcher.close()
        return outs

    outs = run(main)
    assert [first_token(o) for o in outs] == [1, 2, 3]
    assert backend.batches == [[1], [2, 3]]
    assert assembled[-1] == ([2, 3], True), "batch 2 was re-assembled after batch 1 returned"


def test_batches_never_overlap_and_run_in_submission_order():
    backend = FakeBackend()
    batcher = make(backend, limits=dict(max_batch_requests=3))
    arrival: list[int] = []

    async def main():
        async def client(t: int) -> int:
            await asyncio.sleep(0.001 * (t % 5))
            arrival.append(t)  # submit queues the request before its first await
            return first_token(await batcher.submit(request(t)))

        outs = await asyncio.gather(*(client(t) for t in range(40)))
        await batcher.close()
        return outs

    assert run(main) == list(range(40))
    assert backend.max_running == 1
    assert all(len(b) <= 3 for b in backend.batches)
    assert [t for b in backend.batches for t in b] == arrival, "requests ran out of their queue order"


def test_copy_and_op_enqueued_while_a_batch_runs_precede_the_next_forward():
    backend = FakeBackend()
    batcher = make(backend)

    async def main():
        backend.hold()
        first = asyncio.create_task(batcher.submit(request(1)))
        await entered(backend)
        second = asyncio.create_task(batcher.submit(request(2)))
        await asyncio.sleep(0.05)  # batch 2 is taken and assembled meanwhile
        batcher.worker.enqueue_copy(CopyKind.DEVICE_TO_DEVICE, [7], [8])
        op = batcher.worker.enqueue_op(lambda _: backend.log.append(("op", None)) or "done")
        backend.release()
        await asyncio.gather(first, second)
        assert await op == "done"
        await batcher.close()

    run(main)
    assert backend.log == [("forward", [1]), ("op", None), ("copy", [7]), ("forward", [2])]


def test_passes_submitted_while_an_operation_runs_fire_together_after_it():
    backend = FakeBackend()
    batcher = make(backend)
    op_gate = threading.Event()

    def slow_op(_: object) -> None:
        backend.log.append(("op", None))
        op_gate.wait(5)

    async def main():
        batcher.worker.enqueue_op(slow_op)
        await until(lambda: ("op", None) in backend.log, "the operation runs")
        passes = []
        for t in (1, 2, 3):
            passes.append(asyncio.create_task(batcher.submit(request(t))))
            await asyncio.sleep(0.01)
        op_gate.set()
        outs = await asyncio.gather(*passes)
        await batcher.close()
        return outs

    assert [first_token(o) for o in run(main)] == [1, 2, 3]
    assert backend.log == [("op", None), ("forward", [1, 2, 3])]


def test_a_request_cancelled_after_pre_assembly_never_reaches_the_backend(monkeypatch):
    backend = FakeBackend()
    assembled: list[list[int]] = []

    def recording_assemble(requests, vocab_size):
        assembled.append([int(r.token_ids[0]) for r in requests])
        return real_assemble(requests, vocab_size)

    real_assemble = batcher_module.assemble
    monkeypatch.setattr(batcher_module, "assemble", recording_assemble)
    batcher = make(backend)

    async def main():
        backend.hold()
        first = asyncio.create_task(batcher.submit(request(1)))
        await entered(backend)
        doomed = asyncio.create_task(batcher.submit(request(2)))
        kept = asyncio.create_task(batcher.submit(request(3)))
        await until(lambda: [2, 3] in assembled, "batch 2 is assembled")
        doomed.cancel()
        backend.release()
        outs = await asyncio.gather(first, kept)
        with pytest.raises(asyncio.CancelledError):
            await doomed
        await batcher.close()
        return outs

    assert [first_token(o) for o in run(main)] == [1, 3]
    assert backend.batches == [[1], [3]]


def test_on_batch_is_called_once_per_batch_after_its_results_with_the_backend_seconds(monkeypatch):
    clock = [100.0]  # the batcher's and worker's clock: it moves only while the backend works, t seconds for token t
    fake = types.SimpleNamespace(perf_counter=lambda: clock[0])
    monkeypatch.setattr(batcher_module, "time", fake)
    monkeypatch.setattr(worker_module, "time", fake)
    backend = FakeBackend()
    fast = backend.forward

    def slow(batch: ForwardBatch) -> BatchOutput:
        clock[0] += float(batch.token_ids[0])
        return fast(batch)

    backend.forward = slow
    calls: list[tuple[float, bool]] = []
    futures: list[asyncio.Future] = []
    batcher = make(backend, on_batch=lambda s: calls.append((s, all(f.done() for f in futures))))

    async def main():
        for t in (1, 2, 3):
            req = request(t)
            task = asyncio.create_task(batcher.submit(req))
            await asyncio.sleep(0)
            futures[:] = [req.future]
            await task
        await batcher.close()

    run(main)
    assert len(backend.batches) == 3
    assert calls == [(1.0, True), (2.0, True), (3.0, True)]


def test_a_failing_on_batch_is_logged_and_batching_goes_on(caplog):
    backend = FakeBackend()

    def broken(seconds: float) -> None:
        raise RuntimeError("market bug")

    batcher = make(backend, on_batch=broken)

    async def main():
        outs = [await batcher.submit(request(t)) for t in (1, 2)]
        await batcher.close()
        return outs

    with caplog.at_level(logging.ERROR, logger="pie_core.scheduler.batcher"):
        outs = run(main)
    assert [first_token(o) for o in outs] == [1, 2]
    assert sum("on_batch" in r.getMessage() for r in caplog.records) == 2


def test_a_backend_failure_fails_only_its_batch_and_on_batch_still_runs():
    backend = FakeBackend()
    backend.fail_on = 2
    seconds: list[float] = []
    batcher = make(backend, on_batch=seconds.append)

    async def main():
        backend.hold()
        first = asyncio.create_task(batcher.submit(request(1)))
        await entered(backend)
        doomed = asyncio.create_task(batcher.submit(request(2)))
        await asyncio.sleep(0.02)
        backend.release()
        assert first_token(await first) == 1
        with pytest.raises(BackendError, match="device on fire"):
            await doomed
        assert first_token(await batcher.submit(request(3))) == 3
        await batcher.close()

    run(main)
    assert backend.batches == [[1], [2], [3]] and len(seconds) == 3


def test_close_finishes_the_batch_in_flight_and_fails_what_waits():
    backend = FakeBackend()
    batcher = make(backend)

    async def main():
        backend.hold()
        first = asyncio.create_task(batcher.submit(request(1)))
        await entered(backend)
        waiting = asyncio.create_task(batcher.submit(request(2)))
        op = batcher.worker.enqueue_op(lambda _: "ran")
        await asyncio.sleep(0.02)  # request 2 is pre-assembled, the op handed to the backend thread
        asyncio.get_running_loop().call_later(0.05, backend.release)
        await batcher.close()
        assert first_token(await first) == 1
        with pytest.raises(BackendError, match="shut down"):
            await waiting
        assert await op == "ran"

    run(main)
    assert backend.batches == [[1]]


def test_a_batcher_outliving_its_event_loop_serves_the_next_one():
    backend = FakeBackend()
    batcher = make(backend)

    async def once(t: int) -> int:
        return first_token(await batcher.submit(request(t)))

    assert asyncio.run(once(1)) == 1
    assert asyncio.run(once(2)) == 2

    async def close():
        await batcher.close()

    asyncio.run(close())
    assert backend.batches == [[1], [2]]


def test_requests_arriving_within_the_last_batch_time_fire_together():
    backend = FakeBackend()
    batcher = make(backend)

    async def main():
        backend.hold()
        asyncio.get_running_loop().call_later(0.3, backend.release)
        outs = await asyncio.gather(*(batcher.submit(request(t)) for t in range(4)))  # 4 requests, ~0.3 s

        async def client(t: int):
            await asyncio.sleep(0.02 * (t - 4))
            return await batcher.submit(request(t))

        outs += await asyncio.gather(*(client(t) for t in range(4, 8)))
        await batcher.close()
        return outs

    assert [first_token(o) for o in run(main)] == list(range(8))
    assert backend.batches == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_an_op_enqueued_as_a_pass_lands_runs_without_another_wakeup():
    # The batcher gives the loop one turn after landing a batch; an op enqueued in that turn
    # (an adapter initialised right after a generation) must still run, with nothing else queued.
    backend = FakeBackend()
    batcher = make(backend)

    async def main():
        ran: list[asyncio.Future[Any]] = []
        landed = batcher.enqueue(request(1))
        landed.add_done_callback(lambda _: ran.append(batcher.worker.enqueue_op(lambda _: "ran")))
        await landed
        await asyncio.sleep(0)
        assert await asyncio.wait_for(ran[0], 2) == "ran"
        await batcher.close()

    run(main)
