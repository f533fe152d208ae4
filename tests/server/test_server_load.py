"""A bounded load test: many concurrent clients on loopback, the dummy backend, in-process runner."""

from __future__ import annotations

import asyncio
from pathlib import Path

from server_helpers import wait_until

from pie_core.client import connect

PROBE = Path(__file__).parent / "inferlets" / "probe"
CLIENTS = 30
STEPS = 8


async def _one(url: str, token: str, program: str, index: int) -> list[str]:
    """Connect, run the probe's generation to its return; the stdout texts it streamed."""
    async with await connect(url, token) as client:
        proc = await client.launch(program, {"mode": "generate", "max_tokens": STEPS})
        texts: list[str] = []
        async for event in proc.events():
            if event.kind == "stdout":
                texts.append(event.value)
            elif event.kind == "error":
                raise AssertionError(f"client {index}: {event.value}")
            elif event.kind == "return":
                assert event.value == STEPS, f"client {index} returned {event.value!r}"
                return texts
    raise AssertionError(f"client {index}: no terminal event")


def test_thirty_concurrent_clients_all_complete_and_leave_nothing_behind(served, dummy_engine):
    async def scenario(s):
        users = ["alice", "bob"]
        programs = {}
        for user in users:  # uploads are per user; each installs once, then 15 clients each launch it
            async with await connect(s.url, s.tokens[user]) as client:
                programs[user] = await client.install(PROBE)
        stats = dummy_engine.models[next(iter(dummy_engine.models))].batcher.stats
        batches, requests = stats.batches, stats.requests
        results = await asyncio.gather(
            *(_one(s.url, s.tokens[users[i % 2]], programs[users[i % 2]], i) for i in range(CLIENTS)),
            return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        assert not failures, failures[:3]
        assert all(texts == [f"step {n}" for n in range(1, STEPS + 1)] for texts in results)
        # The clients really overlapped: their steps shared batches.
        assert (stats.requests - requests) / (stats.batches - batches) > 2
        await wait_until(lambda: s.server.connection_count == 0 and len(s.server.processes) == 0)
        assert dummy_engine.pools_whole()

    served(scenario)
