"""Fixtures: a dummy engine (no weights, the default model's tokenizer) and a cpu engine on the
real default model, each loaded once per session, both checking that every page went back."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

import pytest

from pie_core.engine.engine import Engine
from pie_core.engine.events import Event
from pie_core.runtime.instance import run_main

Main = Callable[[Any], Awaitable[Any]]


class Harness:
    """Runs inferlet mains on one engine and returns their results."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def run_async(self, main: Main, payload: dict | None = None) -> Event:
        events: list[Event] = []
        return await run_main(self.engine, main, payload or {}, events.append)

    def run(self, main: Main, payload: dict | None = None) -> Event:
        """The final event of one inferlet (return or error)."""
        return asyncio.run(self.run_async(main, payload))

    def value(self, main: Main, payload: dict | None = None) -> Any:
        """One inferlet's return value (fails the test on an error event)."""
        final = self.run(main, payload)
        assert final.kind == "return", final.value
        return final.value

    def error(self, main: Main) -> str:
        """The error text of an inferlet expected to fail."""
        final = self.run(main)
        assert final.kind == "error", f"expected an error, got {final.kind}: {final.value}"
        return str(final.value)


@pytest.fixture(scope="session")
def dummy_engine() -> Engine:
    engine = Engine("dummy")
    engine.load(None)
    return engine


@pytest.fixture
def dummy(dummy_engine: Engine) -> Harness:
    harness = Harness(dummy_engine)
    yield harness
    assert dummy_engine.pools_whole(), "a test left KV pages allocated"


@pytest.fixture(scope="session")
def real_engine(real_cpu_engine: Engine) -> Engine:
    """The cpu backend on the real default model: the suite's one."""
    return real_cpu_engine


@pytest.fixture
def real(real_engine: Engine) -> Harness:
    harness = Harness(real_engine)
    yield harness
    assert real_engine.pools_whole(), "a test left KV pages allocated"
