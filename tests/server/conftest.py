"""A real server on loopback (dummy backend) per test, sharing one engine.

``served(scenario)`` starts a :class:`PieServer` on a free port with two users (alice, bob)
(``launcher=``: the runner its inferlets use, in-process by default), runs ``await
scenario(ctx)`` and closes the server; afterwards every KV page must be back in the pool and no
process may be left. ``isolated(name)`` is a launcher of each runner a server offers.
"""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

import pytest

from pie_core.engine.engine import Engine
from pie_core.server import Authenticator, PieServer, ServerOptions
from pie_core.server.auth import User, hash_token

PROBE = Path(__file__).parent / "inferlets" / "probe"
TOKENS = {"alice": "alice-token-123", "bob": "bob-token-456"}


@dataclass
class Served:
    server: PieServer
    url: str
    http: str
    tokens: dict[str, str]


@pytest.fixture(scope="session")
def dummy_engine() -> Engine:
    engine = Engine("dummy")
    engine.load(None)
    return engine


@pytest.fixture
def served(dummy_engine: Engine) -> Callable[..., Any]:
    def run(scenario: Callable[[Served], Awaitable[Any]], *, auth: bool = True, launcher: Any = None,
            **options: Any) -> Any:
        async def main() -> Any:
            users = [User(name, hash_token(tok)) for name, tok in TOKENS.items()]
            opts = ServerOptions(port=0, data_dir=Path(tempfile.mkdtemp(prefix="pie-srv-")), status_interval=0, **options)
            server = PieServer(dummy_engine, opts, auth=Authenticator(users, enabled=auth), launcher=launcher,
                               close_engine=False)
            await server.start()
            try:
                return await asyncio.wait_for(scenario(Served(server, server.url, f"http://127.0.0.1:{server.port}", TOKENS)), 60)
            finally:
                await server.close()

        result = asyncio.run(main())
        assert dummy_engine.pools_whole(), "a test left KV pages allocated"
        return result

    return run


def isolated(isolation: str) -> Any:
    """A launcher for ``pie serve --isolation <isolation>``: ``inprocess``, ``process`` (a worker
    per inferlet, with the server's default limits) or ``wasm`` (the session's shared sandbox)."""
    if isolation == "inprocess":
        return None
    if isolation == "process":
        from pie_core.runtime.process import ProcessLauncher, WorkerLimits

        return ProcessLauncher(WorkerLimits(wall_s=60.0, cpu_s=60, memory_mb=1024))
    from wasm_helpers import shared_launcher

    return shared_launcher()
