"""The backend worker: the one caller of a loaded backend's hooks, on the one thread it owns."""

from __future__ import annotations

import asyncio
import functools
import re
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pie_core
from pie_core.backend import BackendCalls, BackendWorker, FunctionBackend
from pie_core.backend_kit.dummy import DummyBackend
from pie_core.engine.engine import Engine
from pie_core.hookspec import BackendOptions, BatchOutput, CopyKind, ForwardBatch
from pie_core.scheduler.assemble import assemble
from pie_core.scheduler.request import ForwardRequest, SampleSpec


def _batch(*tokens: int) -> ForwardBatch:
    n = len(tokens)
    req = ForwardRequest(
        token_ids=np.array(tokens, dtype=np.int32), positions=np.arange(n, dtype=np.int32),
        page_ids=np.zeros(1, dtype=np.int32), last_page_len=n, write_slots=np.arange(n, dtype=np.int32),
        samples=(SampleSpec(index=n - 1),),
    )
    return assemble([req], 100)


class Recorder:
    """A backend that logs each call with the thread it ran on; a forward over token 13 raises."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any, int]] = []

    def forward(self, batch: ForwardBatch) -> BatchOutput:
        self.log.append(("forward", batch.token_ids.tolist(), threading.get_ident()))
        if 13 in batch.token_ids:
            raise RuntimeError("device on fire")
        return BatchOutput(tokens=batch.token_ids[batch.sample_rows])

    def copy_pages(self, kind: CopyKind, src: np.ndarray, dst: np.ndarray) -> None:
        self.log.append(("copy", src.tolist(), threading.get_ident()))


def _worker(rec: Recorder) -> BackendWorker:
    return BackendWorker.of(FunctionBackend(rec.forward, rec.copy_pages))


def test_copies_ops_and_batches_run_in_order_on_the_workers_one_thread():
    rec = Recorder()
    worker = _worker(rec)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        worker.enqueue_copy(CopyKind.DEVICE_TO_DEVICE, [1], [2])
        first = worker.forward(_batch(5), loop)  # takes the copy before it
        op = worker.enqueue_op(lambda b: rec.log.append(("op", 1, threading.get_ident())) or "op ran")
        ran = worker.flush_ops(loop)
        worker.enqueue_copy(CopyKind.DEVICE_TO_HOST, [3], [0])
        second = worker.forward(_batch(6), loop)
        assert ran is not None and await op == "op ran"
        await asyncio.gather(first, second, ran)

    try:
        asyncio.run(main())
    finally:
        worker.close()
    assert [(what, arg) for what, arg, _ in rec.log] == [("copy", [1]), ("forward", [5]), ("op", 1), ("copy", [3]),
                                                        ("forward", [6])]
    assert {thread for _, _, thread in rec.log} == {worker.thread_id} != {threading.get_ident()}


def test_a_failing_hook_reaches_its_caller_and_the_worker_keeps_serving():
    rec = Recorder()
    worker = _worker(rec)

    def fail(_: BackendCalls) -> None:
        raise ValueError("refused")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        outcome, _ = await worker.forward(_batch(13), loop)
        assert isinstance(outcome, RuntimeError) and "device on fire" in str(outcome)
        failed, fine = worker.enqueue_op(fail), worker.enqueue_op(lambda b: "still here")
        ran = worker.flush_ops(loop)
        assert ran is not None
        await ran
        with pytest.raises(ValueError, match="refused"):
            await failed
        assert await fine == "still here"
        outcome, _ = await worker.forward(_batch(7), loop)
        assert isinstance(outcome, BatchOutput) and outcome.tokens.tolist() == [7]

    try:
        asyncio.run(main())
        with pytest.raises(ValueError, match="refused"):
            worker.call(fail)
        assert worker.call(lambda b: b.forward(_batch(8))).tokens.tolist() == [8]
    finally:
        worker.close()


def test_close_waits_for_the_work_sent_and_joins_the_thread():
    started, gate, finished = threading.Event(), threading.Event(), []

    def slow(batch: ForwardBatch) -> BatchOutput:
        started.set()
        gate.wait(5)
        finished.append(True)
        return BatchOutput(tokens=batch.token_ids[batch.sample_rows])

    worker = BackendWorker.of(FunctionBackend(slow))
    thread = next(t for t in threading.enumerate() if t.ident == worker.thread_id)
    assert thread.name.startswith("pie-backend")

    async def main() -> None:
        worker.forward(_batch(1), asyncio.get_running_loop())
        await asyncio.to_thread(started.wait, 5)
        threading.Timer(0.05, gate.set).start()
        worker.close()

    asyncio.run(main())
    assert finished == [True] and not thread.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        worker.call(lambda b: None)


def test_a_backend_call_off_the_workers_thread_is_refused():
    rec = Recorder()
    worker = _worker(rec)
    try:
        leaked = worker.call(lambda b: b)  # the calls object escaping its operation
        with pytest.raises(RuntimeError, match="only on its worker's thread"):
            leaked.forward(_batch(1))
        with pytest.raises(RuntimeError, match="only on its worker's thread"):
            leaked.adapter_destroy(0)
        assert rec.log == []  # the backend saw nothing
        assert not any(hasattr(worker, name) for name in ("pm", "hook", "_hook"))
    finally:
        worker.close()


def test_a_closed_workers_pending_operations_fail_with_the_error_given():
    worker = _worker(Recorder())

    async def main() -> None:
        op = worker.enqueue_op(lambda b: "never")
        worker.fail_pending(RuntimeError("shut down"))
        with pytest.raises(RuntimeError, match="shut down"):
            await op
        assert worker.pending_ops == 0

    try:
        asyncio.run(main())
    finally:
        worker.close()


def test_every_engine_hook_call_goes_through_the_worker(monkeypatch):
    """The engine's info, load and batches reach the backend on the worker's thread only."""
    seen: list[tuple[str, int]] = []
    for name in ("pie_backend_load_model", "pie_backend_forward", "pie_backend_info"):
        original = getattr(DummyBackend, name)

        @functools.wraps(original)  # keeps the hookimpl marker and the signature pluggy reads
        def hook(self: Any, *args: Any, _name: str = name, _original: Any = original, **kwargs: Any) -> Any:
            seen.append((_name, threading.get_ident()))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(DummyBackend, name, hook)
    engine = Engine("dummy", options=BackendOptions(page_size=4, kv_pages=16))
    model = engine.load(None)
    try:
        outcome = model.worker.call(lambda b: b.forward(_batch(3)))
        assert isinstance(outcome, BatchOutput)
    finally:
        asyncio.run(engine.close())
    # bind_backend checks the contract version of a plugin no worker owns yet; then only the worker calls
    assert seen[0] == ("pie_backend_info", threading.get_ident())
    assert [name for name, _ in seen[1:]] == ["pie_backend_info", "pie_backend_load_model", "pie_backend_forward"]
    assert {thread for _, thread in seen[1:]} == {model.worker.thread_id}


def test_only_the_backend_package_calls_hooks_in_the_engine():
    """No module of pie_core reaches pluggy's hook object except the worker's calls and the
    contract check of a freshly bound plugin."""
    root = Path(pie_core.__file__).parent
    allowed = {root / "backend" / "calls.py", root / "plugins.py"}
    callers = [str(p.relative_to(root)) for p in root.rglob("*.py")
               if p not in allowed and p.parent != root / "backend_kit"
               and re.search(r"\.hook\.pie_backend_|\bhook\.pie_backend_", p.read_text())]
    assert callers == []
