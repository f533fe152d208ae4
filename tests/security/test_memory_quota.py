"""A user's workers together stay under its memory quota (``server.quotas.memory_bytes``): past
it, the largest is killed with an error that says why, and the others, and alice, carry on."""

from __future__ import annotations

import asyncio
from pathlib import Path

from hostile import Served, victim_is_served, write_program
from pie_core.client import connect
from pie_core.server import memory
from pie_core.server.quotas import Quotas

HOARDER = '''
import time
from inferlet import session


def main(input):
    hoard = bytearray(input["mib"] * 2**20)
    hoard[::4096] = b"x" * len(hoard[::4096])  # resident, not just reserved
    session.send("holding")
    time.sleep(60)
'''

MiB = 2**20


async def _all(events):
    return [e async for e in events]


def test_a_user_over_its_memory_quota_loses_its_largest_worker(hostile, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(memory, "CHECK_S", 0.2)
    program = write_program(tmp_path / "hoarder", HOARDER, name="hoarder", parameters='mib = { type = "int" }')

    async def scenario(s: Served) -> None:
        await victim_is_served(s)
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            name = await mallory.install(program)
            small = [await mallory.launch(name, {"mib": 40}) for _ in range(2)]
            for proc in small:
                assert (await proc.events().__anext__()).value == "holding"
            big = await mallory.launch(name, {"mib": 300})
            seen = await asyncio.wait_for(_all(big.events()), 10)
            last = seen[-1]
            assert last.kind == "error" and "over its 400 MiB quota (server.quotas.memory_bytes)" in last.value, last
            assert await victim_is_served(s) < 0.5
            assert [p.user for p in s.server.processes.all() if not p.finished].count("mallory") == 2
            for proc in small:
                await proc.terminate()

    hostile(scenario, quotas=Quotas(memory_bytes=400 * MiB))
