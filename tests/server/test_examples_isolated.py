"""Every bundled example runs to its Return under ``pie serve``'s default isolation: each in a
worker forked from the zygote, every host call and every value (numpy masks, Pie's dataclasses,
handles) crossing the worker pipe, on the dummy backend, in one server."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from conftest import TOKENS
from mcp.server.mcpserver import MCPServer

from pie_core.client import connect
from pie_core.runtime.process import ProcessLauncher, WorkerLimits
from pie_core.server import Authenticator, PieServer, ServerOptions
from pie_core.server.auth import User, hash_token

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# Python examples: the TypeScript twins (package.json + index.ts) run in tests/js
ALL = sorted(p.name for p in EXAMPLES.iterdir() if (p / "Pie.toml").is_file() and (p / "main.py").is_file())

INPUTS: dict[str, dict[str, Any]] = {
    "agent-codeact": {"turns": 1, "retries": 1, "max_tokens": 3},
    "agent-react": {"turns": 2, "max_tokens": 4, "tool_delay_s": 0.01},
    "agent-swarm": {"agents": 2, "hops": 3, "max_tokens": 3},
    "beam-search": {"beam_width": 2, "max_tokens": 4},
    "best-of-n": {"n": 2, "max_tokens": 4},
    "es-finetune": {"generations": 1, "population": 2, "max_tokens": 2, "samples": 1},
    "hello-world": {"name": "isolation"},
    "interactive-chat": {"max_tokens": 4},
    "json-extraction": {"max_tokens": 96},
    "lora": {"max_tokens": 4},  # no adapter folder in the worker's scratch: the random stand-in
    "market-aware": {"max_tokens": 4, "tool_seconds": 0.01},
    "mcp-tools": {"server": "notes", "tool": "shout", "args": '{"text": "quiet"}'},
    "output-validation": {"candidates": "Paris,Berlin"},
    "parallel-generation": {"n": 2, "max_tokens": 4},
    "regex-extract": {"max_tokens": 6},
    "speculative-decoding": {"max_tokens": 6},
    "text-completion": {"prompt": "Hi.", "max_tokens": 4},
    "tool-agent": {"max_rounds": 1, "max_tokens": 6},
    "tree-of-thought": {"breadth": 2, "depth": 1, "thought_tokens": 3},
    "watermarking": {"max_tokens": 4, "top_k": 8},
    "windowed-attention": {"sink": 2, "window": 8, "max_tokens": 4},
}


def notes_server() -> MCPServer:
    server = MCPServer("notes", log_level="WARNING")

    @server.tool()
    def shout(text: str) -> str:
        """Upper-case ``text``."""
        return text.upper()

    return server


async def _run(client: Any, programs: dict[str, str], name: str, room: asyncio.Semaphore) -> tuple[str, Any, list[Any]]:
    async with room:  # a few at a time: grammar compiles share the two CI cores
        proc = await client.launch(programs[name], INPUTS[name])
        if name == "interactive-chat":  # a user turn, then the command that ends the chat
            await proc.send("Hello there.")
            await proc.send("/quit")
        events = [(e.kind, e.value) async for e in proc.events()]
    return name, events[-1], events[:-1]


def test_every_example_covers_an_input_set():
    assert sorted(INPUTS) == ALL


def run_all_examples(engine: Any, launcher: Any, *, at_once: int, limit_s: float) -> list[tuple[str, Any, list[Any]]]:
    """Every example through one server with ``launcher``, ``at_once`` at a time (in ``ALL``'s
    order), as alice: ``(name, final event, events before it)`` each."""

    async def main() -> list[tuple[str, Any, list[Any]]]:
        users = [User(n, hash_token(t)) for n, t in TOKENS.items()]
        opts = ServerOptions(port=0, data_dir=Path(tempfile.mkdtemp(prefix="pie-ex-")), status_interval=0)
        server = PieServer(engine, opts, auth=Authenticator(users), launcher=launcher, close_engine=False)
        await server.start()
        try:
            async with await connect(server.url, TOKENS["alice"]) as alice:
                await alice.register_mcp_server("notes", notes_server())
                programs = {name: await alice.install(EXAMPLES / name) for name in ALL}
                room = asyncio.Semaphore(at_once)
                return await asyncio.wait_for(asyncio.gather(*(_run(alice, programs, n, room) for n in ALL)), limit_s)
        finally:
            await server.close()

    return asyncio.run(main())


def test_every_example_returns_under_the_default_isolation(dummy_engine):
    launcher = ProcessLauncher(WorkerLimits(wall_s=45.0, cpu_s=45, memory_mb=1024))
    # a few at a time: grammar compiles share the two CI cores
    results = run_all_examples(dummy_engine, launcher, at_once=4, limit_s=55)
    failed = {name: final for name, final, _ in results if final[0] != "return"}
    assert not failed, failed
    assert dummy_engine.pools_whole(), "an example left KV pages allocated"
    by_name = {name: (final[1], events) for name, final, events in results}
    assert by_name["mcp-tools"][0]["tool"] == "shout" and "QUIET" in str(by_name["mcp-tools"][0]["result"])
    assert by_name["interactive-chat"][0]["turns"] == 1
    assert len(by_name["best-of-n"][0]["candidates"]) == 2
    assert by_name["hello-world"][0] == "hello isolation"
    assert by_name["agent-react"][0]["turns"] == 2 and by_name["agent-swarm"][0]["turns"] == [2, 1]
    market = by_name["market-aware"][0]
    assert market["notes_suspended_while_answering"] and market["notes_resumed"]
    assert market["market_before"]["balance"] - market["market_after"]["balance"] == market["credits_spent"] > 0
