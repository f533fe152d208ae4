"""Runs the suite's inferlet programs through a real server with one chosen launcher.

Every program folder under ``programs/`` is installed; each :class:`Scenario` then launches one
program as alice, sends it the scenario's messages and files through the client (as a user's
client would), and collects every event up to the terminal one. Programs run one at a time, in
the scenarios' order: a program may rely on what an earlier one left (a saved snapshot), and
the market's readings are not disturbed by other inferlets' pages.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from pie_core.client import ServerError, connect
from pie_core.engine.engine import Engine
from pie_core.server import Authenticator, PieServer, ServerOptions
from pie_core.server.auth import User, hash_token

PROGRAMS = Path(__file__).parent / "programs"
USER, TOKEN = "alice", "alice-runner-token"
PROGRAM_LIMIT_S = 30.0  # one program's run (they take seconds): a hung one is terminated after this


@dataclass(frozen=True)
class Scenario:
    """One run of one program.

    Attributes:
        program: The folder name under ``programs/``.
        input: ``main``'s input; a string value ``"@name"`` becomes the installed
            ``name@version`` of program ``name`` (for ``runtime.spawn``), and ``{runner}`` in a
            string value the runner's name.
        messages: Sent with ``proc.send`` right after the launch (``session.receive``).
        files: Sent with ``proc.transfer_file`` right after the messages (``session.receive_file``).
        label: Tells apart runs of one program with different inputs (``program[label]``).
    """

    program: str
    input: dict[str, Any] = field(default_factory=dict)
    messages: tuple[str, ...] = ()
    files: tuple[bytes, ...] = ()
    label: str = ""

    @property
    def id(self) -> str:
        return f"{self.program}[{self.label}]" if self.label else self.program


@dataclass(frozen=True)
class Outcome:
    """What a run gave: the terminal event and the events before it, as ``(kind, value)``."""

    final: tuple[str, Any]
    events: tuple[tuple[str, Any], ...]

    def of_kind(self, *kinds: str) -> list[tuple[str, Any]]:
        """The events (terminal one excluded) whose kind is one of ``kinds``, in order."""
        return [e for e in self.events if e[0] in kinds]


def notes_server() -> MCPServer:
    """The MCP server the client registers: tools, a resource and a prompt."""
    server = MCPServer("runner-notes", log_level="WARNING")

    @server.tool()
    def shout(text: str) -> str:
        """Upper-case ``text``."""
        return text.upper()

    @server.tool()
    def add(a: int, b: int) -> int:
        """The sum of two integers."""
        return a + b

    @server.tool()
    def boom(reason: str) -> str:
        """Always fails."""
        raise ToolError(reason)

    @server.resource("notes://today", mime_type="text/plain")
    def today() -> str:
        """Today's note."""
        return "buy milk"

    @server.prompt()
    def greet(name: str) -> str:
        """A greeting prompt."""
        return f"Say hello to {name}."

    return server


def program_folders() -> list[str]:
    return sorted(p.name for p in PROGRAMS.iterdir() if (p / "Pie.toml").is_file())


def run_scenarios(engine: Engine, runner: str, launcher: Any, scenarios: list[Scenario], data_dir: Path) -> dict[str, Outcome]:
    """Run ``scenarios`` in order on one server with ``launcher`` (the runner named ``runner``);
    their outcomes by id."""

    async def main() -> dict[str, Outcome]:
        opts = ServerOptions(port=0, data_dir=data_dir, status_interval=0)
        server = PieServer(engine, opts, auth=Authenticator([User(USER, hash_token(TOKEN))]), launcher=launcher,
                           close_engine=False)
        await server.start()
        try:
            async with await connect(server.url, TOKEN) as client:
                await client.register_mcp_server("notes", notes_server())
                installed = {name: await client.install(PROGRAMS / name) for name in program_folders()}
                return {sc.id: await _run(client, installed, sc, runner) for sc in scenarios}
        finally:
            await server.close()

    return asyncio.run(main())


def _arg(value: Any, installed: dict[str, str], runner: str) -> Any:
    if not isinstance(value, str):
        return value
    return installed[value[1:]] if value.startswith("@") else value.replace("{runner}", runner)


async def _run(client: Any, installed: dict[str, str], sc: Scenario, runner: str) -> Outcome:
    args = {k: _arg(v, installed, runner) for k, v in sc.input.items()}
    proc = await client.launch(installed[sc.program], args)
    try:
        for message in sc.messages:
            await proc.send(message)
        for data in sc.files:
            await proc.transfer_file(data)
    except ServerError:  # the program already ended (e.g. refused at load): its events say how
        pass

    async def drain() -> list[tuple[str, Any]]:
        return [(e.kind, e.value) async for e in proc.events()]

    try:
        events = await asyncio.wait_for(drain(), PROGRAM_LIMIT_S)
    except asyncio.TimeoutError:
        await proc.terminate()
        events = [("timeout", f"no terminal event within {PROGRAM_LIMIT_S}s")]
    return Outcome(events[-1], tuple(events[:-1]))
