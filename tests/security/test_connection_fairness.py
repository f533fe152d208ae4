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


@pytest.mark.parametrize("kind", ["ping", "list_programs"])
def test_thousands_of_pipelined_requests_do_not_stall_other_users(hostile, kind):
    async def scenario(s):
        await victim_is_served(s)  # warm: installs the probe
        baseline = min([await victim_is_served(s) for _ in range(3)])
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
            taken = max([await victim_is_served(s) for _ in range(3)])
        finally:
            stop.set()
            await asyncio.to_thread(attacker.join)
        assert taken < 4 * baseline + 0.3, f"alice took {taken:.2f} s under the flood, {baseline:.2f} s without"

    hostile(scenario, launcher=InProcessLauncher())
