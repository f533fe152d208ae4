"""Every bundled example returns the same value in the wasm sandbox as in-process: the same
server, the same inputs, one at a time, on the dummy backend (whose tokens follow from the
request, not from the batch it lands in). Timings in the values are left out."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from conftest import TOKENS
from test_examples_isolated import ALL, EXAMPLES, _run, notes_server
from wasm_helpers import shared_launcher

from pie_core.client import connect
from pie_core.runtime.launcher import InProcessLauncher
from pie_core.server import Authenticator, PieServer, ServerOptions
from pie_core.server.auth import User, hash_token

TIMINGS = {"latency_s", "seconds"}  # wall-clock readings inside example values


def _scrub(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items() if k not in TIMINGS}
    if isinstance(value, (list, tuple)):
        return [_scrub(v) for v in value]
    return value


def _results(engine: Any, launcher: Any) -> dict[str, tuple[Any, list[Any]]]:
    async def main() -> list[tuple[str, Any, list[Any]]]:
        users = [User(n, hash_token(t)) for n, t in TOKENS.items()]
        opts = ServerOptions(port=0, data_dir=Path(tempfile.mkdtemp(prefix="pie-wasm-ex-")), status_interval=0)
        server = PieServer(engine, opts, auth=Authenticator(users), launcher=launcher, close_engine=False)
        await server.start()
        try:
            async with await connect(server.url, TOKENS["alice"]) as alice:
                await alice.register_mcp_server("notes", notes_server())
                programs = {name: await alice.install(EXAMPLES / name) for name in ALL}
                room = asyncio.Semaphore(1)  # one at a time: the same batches both ways
                return [await asyncio.wait_for(_run(alice, programs, n, room), 60) for n in ALL]
        finally:
            await server.close()

    return {name: (final, events) for name, final, events in asyncio.run(main())}


def test_every_example_returns_the_same_value_in_wasm_as_in_process(dummy_engine):
    inproc = _results(dummy_engine, InProcessLauncher())
    wasm = _results(dummy_engine, shared_launcher())
    assert dummy_engine.pools_whole(), "an example left KV pages allocated"
    assert {n: f for n, (f, _) in wasm.items() if f[0] != "return"} == {}
    differ = {n: (_scrub(inproc[n][0][1]), _scrub(wasm[n][0][1])) for n in ALL
              if _scrub(inproc[n][0]) != _scrub(wasm[n][0])}
    assert differ == {}
    # what the examples print reaches the client the same way (Stdout events, line by line)
    assert [e for e in inproc["interactive-chat"][1] if e[0] == "stdout"] == \
        [e for e in wasm["interactive-chat"][1] if e[0] == "stdout"]
    assert wasm["mcp-tools"][0][1]["tool"] == "shout" and "QUIET" in str(wasm["mcp-tools"][0][1]["result"])
