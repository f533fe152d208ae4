"""Alice's inferlet that keeps running during an attack: each message it gets runs two decode
passes on her context and comes back, so a test measures how long alice waits to be served."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hostile import Served, write_program
from pie_core.client import connect

STEPPER = """
from inferlet import Context, Model, Sampler, runtime, session

async def main(input):
    with Context(Model.load(runtime.models()[0])) as ctx:
        ctx.user("count")
        session.send("ready")
        while (msg := await session.receive()) != "stop":
            await ctx.generate(Sampler.argmax(), max_tokens=2, stop=[]).collect_tokens()
            session.send(msg)
    return "stopped"
"""


class Victim:
    """``async with Victim(s, folder) as alice: await alice.served_s()``: alice's stepper runs
    for the block; :meth:`served_s` is how long one round of two passes took."""

    def __init__(self, s: Served, folder: Path) -> None:
        self.s, self.folder = s, folder

    async def __aenter__(self) -> Victim:
        self._client = await (await connect(self.s.url, self.s.tokens["alice"])).__aenter__()
        program = await self._client.install(write_program(self.folder, STEPPER, name="stepper"))
        self.proc = await self._client.launch(program, {})
        self._events = self.proc.events()
        assert (await self._events.__anext__()).value == "ready"
        await self.served_s()  # the first pass warms what the others reuse
        return self

    async def served_s(self) -> float:
        start = time.monotonic()
        await self.proc.send("go")
        event = await self._events.__anext__()
        assert event.value == "go", event
        return time.monotonic() - start

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.proc.send("stop")
            assert await self.proc.wait() == "stopped"
        finally:
            await self._client.__aexit__(*exc)
