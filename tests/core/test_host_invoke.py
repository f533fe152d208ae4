"""``host_api.invoke``, the one path by which both sandboxes run a host call: a matcher a
``ready_first`` function needs is compiled off the event loop before the call, never in it."""

from __future__ import annotations

import asyncio

from pie_core.engine.engine import Engine
from pie_core.grammar.source import regex
from pie_core.host import grammar
from pie_core.host.binding import HostInstance, bind, unbind
from pie_core.runtime import host_api


def test_a_ready_first_call_awaits_the_compilation_instead_of_compiling_on_the_loop(monkeypatch):
    engine = Engine("dummy")
    model = engine.load(None)

    async def main() -> list[int]:
        token = bind(HostInstance(engine=engine, emit=lambda event: None))
        try:
            handle = grammar.matcher(model.name, regex("[0-9]{3}"))

            def on_the_loop(*args: object) -> None:
                raise AssertionError("the grammar was compiled on the event loop")

            monkeypatch.setattr(handle._compiler, "compile_blocking", on_the_loop)
            fn = host_api.host_function("grammar", "matcher_runs")
            return await host_api.invoke("grammar", "matcher_runs", fn, [handle], runner=None)
        finally:
            unbind(token)

    try:
        runs = asyncio.run(main())
    finally:
        asyncio.run(engine.close())
    assert runs and sum(runs) == model.spec.vocab_size  # a mask over the whole vocabulary
