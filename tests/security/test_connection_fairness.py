"""Class 5, stalls: one connection pipelining thousands of requests takes one turn per request,
so other users keep being served."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import msgpack
import pytest
from hostile import victim_is_served
from websockets.sync.client import connect as sync_connect

from pie_core.runtime.launcher import InProcessLauncher
from pie_core.server.connection import ClientSession


@pytest.mark.parametrize("kind", ["ping", "list_programs"])
def test_thousands_of_pipelined_requests_do_not_stall_other_users(hostile, kind):
    async def scenario(s):
        frames = [msgpack.packb({"type": kind, "id": i, "data": "x" * 64}) for i in range(5000)]
        started = threading.Event()
        stop = threading.Event()

        def flood() -> None:  # mallory, on her own thread as on her own machine; never reads a reply
            with sync_connect(s.url, additional_headers={"Authorization": f"Bearer {s.tokens['mallory']}"}) as ws:
                flood_on(ws)

        def flood_on(ws: Any) -> None:
            try:
                for i, frame in enumerate(frames):
                    if stop.is_set():
                        break
                    ws.send(frame)
                    if i == 500:
                        started.set()
                started.set()
                stop.wait(30)
            finally:
                ws.socket.shutdown(socket.SHUT_RDWR)  # leave without a closing handshake

        attacker = threading.Thread(target=flood)
        attacker.start()
        try:
            assert await asyncio.to_thread(started.wait, 10)
            for _ in range(3):
                await victim_is_served(s)  # fails if she is not answered within its bound
        finally:
            stop.set()
            await asyncio.to_thread(attacker.join)

    hostile(scenario, launcher=InProcessLauncher())


class _Pipelined:
    """A connection whose client sent every frame at once: each is ready when read, so reading
    never suspends, and replies are kept without suspending either."""

    def __init__(self, frames: list[bytes]) -> None:
        self._frames = iter(frames)
        self.sent: list[bytes] = []

    def __aiter__(self) -> "_Pipelined":
        return self

    async def __anext__(self) -> bytes:
        for frame in self._frames:
            return frame
        raise StopAsyncIteration

    async def send(self, data: bytes) -> None:
        self.sent.append(data)


@pytest.mark.parametrize("kind", ["ping", "list_programs"])
def test_a_pipelining_connection_answers_one_request_per_turn_of_the_event_loop(hostile, kind):
    """Alice's task looks at mallory's replies at every turn of the loop: between two of her
    turns mallory's connection answers at most one request, however many it has waiting."""
    count = 2000

    async def scenario(s):
        ws = _Pipelined([msgpack.packb({"type": kind, "id": i}) for i in range(count)])
        session = asyncio.create_task(ClientSession(s.server, ws, "mallory").run())
        seen = [0]
        while not session.done():
            await asyncio.sleep(0)  # one turn of the loop
            seen.append(len(ws.sent))
        await session
        replies = [msgpack.unpackb(r) for r in ws.sent]
        assert [(r["id"], r["ok"]) for r in replies] == [(i, True) for i in range(count)]
        steps = {b - a for a, b in zip(seen, seen[1:])}
        assert steps <= {0, 1}, f"mallory got up to {max(steps)} requests answered in one turn"

    hostile(scenario, launcher=InProcessLauncher())
