"""Shared fixtures: one cpu engine on the real default model, and transformers as the reference.

Both are session-scoped (loading each takes seconds to a minute on a small machine); every test
that runs inferlets goes through ``pie`` (a :class:`Harness`), which checks afterwards that
every KV page went back to its pool.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Awaitable, Callable

import pytest

from pie_core.engine.engine import Engine
from pie_core.engine.events import Event
from pie_core.runtime.instance import run_main

Main = Callable[[Any], Awaitable[Any]]


class Harness:
    """Runs inferlet mains on one engine, as separate instances, and returns their results."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.model = next(iter(engine.models))

    async def run_async(self, main: Main, payload: dict | None = None) -> tuple[Event, list[Event]]:
        events: list[Event] = []
        final = await run_main(self.engine, main, payload or {}, events.append)
        return final, events

    def value(self, main: Main, payload: dict | None = None) -> Any:
        """Run one inferlet alone; its return value (fails the test on an error event)."""
        final, _ = asyncio.run(self.run_async(main, payload))
        assert final.kind == "return", final.value
        return final.value

    def values_together(self, mains: list[Main]) -> list[Any]:
        """Start every inferlet at once (one event loop, ``asyncio.gather``); their return values."""

        async def together() -> list[tuple[Event, list[Event]]]:
            return await asyncio.gather(*(self.run_async(m) for m in mains))

        results = asyncio.run(together())
        for final, _ in results:
            assert final.kind == "return", final.value
        return [final.value for final, _ in results]


@pytest.fixture(scope="session")
def default_gguf() -> Path:
    """The assembled default GGUF (cached under ``$PIE_CACHE_DIR`` or ``~/.cache/pie``)."""
    from pie_core.models.default_model import DEFAULT_MODEL, ensure_gguf

    return ensure_gguf(DEFAULT_MODEL)


@pytest.fixture(scope="session")
def cpu_engine(real_cpu_engine: Engine) -> Engine:
    """The NumPy backend serving the default model (fp32, 16-token pages): the suite's one."""
    return real_cpu_engine


@pytest.fixture
def pie(cpu_engine: Engine) -> Harness:
    harness = Harness(cpu_engine)
    yield harness
    assert cpu_engine.pools_whole(), "a test left KV pages allocated"


@pytest.fixture(scope="session")
def hf_model(default_gguf: Path) -> Any:
    """transformers' own fp32 model of the same GGUF (``from_pretrained(gguf_file=...)``)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        default_gguf.parent, gguf_file=default_gguf.name, dtype=torch.float32
    )
    return model.eval()


@pytest.fixture(scope="module")
def torch_pie() -> Any:
    """The default torch backend (quant fit) on the real model, for the tests of one module."""
    from pie_core.hookspec import BackendOptions

    engine = Engine("torch", options=BackendOptions(dtype="auto", kv_pages=1024))
    engine.load(None)
    caps = next(iter(engine.models.values())).caps
    if caps.dtype != "float32":
        pytest.skip(f"the torch default here is {caps.dtype}, not quant fit (no native kernels)")
    harness = Harness(engine)
    yield harness
    assert engine.pools_whole(), "a test left KV pages allocated"
    asyncio.run(engine.close())
