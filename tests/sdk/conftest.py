import asyncio
from typing import Any, Awaitable, Callable

import pytest

from pie_core.engine.engine import Engine
from pie_core.engine.events import Event
from pie_core.runtime.instance import run_main


class Harness:
    """Runs inferlet mains on one engine and checks the page pools are whole afterwards."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.model = next(iter(engine.models))

    def run(self, main: Callable[[dict], Awaitable[Any]], payload: dict | None = None) -> tuple[Event, list[Event]]:
        return asyncio.run(self.run_async(main, payload))

    async def run_async(self, main, payload=None) -> tuple[Event, list[Event]]:
        events: list[Event] = []
        final = await run_main(self.engine, main, payload or {}, events.append)
        return final, events

    def value(self, main, payload=None) -> Any:
        final, _ = self.run(main, payload)
        assert final.kind == "return", final.value
        return final.value


@pytest.fixture(scope="session")
def dummy_engine() -> Engine:
    engine = Engine("dummy")
    engine.load(None)
    return engine


@pytest.fixture
def dummy(dummy_engine: Engine):
    harness = Harness(dummy_engine)
    yield harness
    assert dummy_engine.pools_whole(), "a test left KV pages allocated"
