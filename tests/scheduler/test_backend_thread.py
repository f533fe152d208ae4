"""The engine calls a backend from one thread: the model load runs on the thread that later runs
its batches (torch's OpenMP team is kept per calling thread; a second one makes every parallel
region of a step pay a worker wake-up, see ``pie_core.backend.worker.backend_thread``)."""

from __future__ import annotations

import asyncio
import functools
import threading

import pytest

from pie_core.backend_kit.dummy import DummyBackend
from pie_core.engine.engine import Engine
from pie_core.errors import InvalidInput
from pie_core.hookspec import BackendOptions
from pie_core.host import context as host_context
from pie_core.host.inference import forward
from pie_core.runtime.instance import run_main
from pie_core.values import SampleSpec


def _recording(monkeypatch: pytest.MonkeyPatch, name: str, seen: list[tuple[str, str]]) -> None:
    original = getattr(DummyBackend, name)

    @functools.wraps(original)  # keeps the hookimpl marker
    def hook(self, *args, **kwargs):
        seen.append((name, threading.current_thread().name))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(DummyBackend, name, hook)


def test_the_load_and_every_batch_run_on_the_same_backend_thread(monkeypatch):
    seen: list[tuple[str, str]] = []
    _recording(monkeypatch, "pie_backend_load_model", seen)
    _recording(monkeypatch, "pie_backend_forward", seen)
    engine = Engine("dummy", options=BackendOptions(page_size=4, kv_pages=16))
    model = engine.load(None)

    async def main(_) -> None:
        ctx = host_context.create(model.name)
        await forward(ctx, [1, 2, 3], samples=[SampleSpec(index=2)])
        await forward(ctx, [4], samples=[SampleSpec(index=0)])
        ctx.release()

    try:
        assert asyncio.run(run_main(engine, main, {}, lambda event: None)).kind == "return"
    finally:
        asyncio.run(engine.close())
    assert engine.pools_whole()
    assert [kind for kind, _ in seen] == ["pie_backend_load_model", "pie_backend_forward", "pie_backend_forward"]
    threads = {name for _, name in seen}
    assert len(threads) == 1 and threads != {threading.current_thread().name}, seen
    assert next(iter(threads)).startswith("pie-backend")


def test_a_refused_load_gives_its_thread_back(monkeypatch):
    def refuse(self, *args, **kwargs):
        raise ValueError("no such option")

    refuse.__dict__.update(DummyBackend.pie_backend_load_model.__dict__)
    monkeypatch.setattr(DummyBackend, "pie_backend_load_model", refuse)
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(InvalidInput, match="no such option"):
        Engine("dummy").load(None)
    assert {t.name for t in threading.enumerate() if t.name.startswith("pie-backend")} <= before
