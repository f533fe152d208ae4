"""Measuring a stall: how long the server's event loop keeps ``/health`` waiting while an
attack runs."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable


async def health_once(s: Any) -> float:
    """Seconds one ``GET /health`` on a fresh connection takes to be answered."""
    start = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", s.server.port)
    try:
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        await writer.drain()
        reply = await asyncio.wait_for(reader.read(), 30)
        assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
    finally:
        writer.close()
    return time.monotonic() - start


async def worst_health_during(s: Any, attack: Awaitable[Any], every_s: float = 0.05) -> tuple[float, Any]:
    """Run ``attack`` while probing ``/health`` every ``every_s`` seconds; the longest the
    event loop kept anyone waiting (a probe's answer, or a pause between probes that ran late)
    and the attack's result. The probes go on for as long as the attack runs."""
    task = asyncio.ensure_future(attack)
    worst = 0.0
    try:
        while True:
            worst = max(worst, await health_once(s))
            if task.done():
                break
            start = time.monotonic()
            await asyncio.sleep(every_s)
            worst = max(worst, time.monotonic() - start - every_s)  # the loop was held while we slept
        return worst, task.result()
    finally:
        task.cancel()
