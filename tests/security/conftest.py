"""A real ``pie serve`` on loopback for attack tests: auth on, two users, default isolation.

``hostile(scenario, **options)`` starts a :class:`PieServer` on a free port with users alice
(the victim) and mallory (the attacker), each inferlet in its own worker process (the
``pie serve`` default), runs ``await scenario(s)`` and closes the server. Afterwards every KV
page must be back in the pool. ``launcher=None`` keeps the process launcher with test limits;
pass ``launcher=InProcessLauncher()`` for attacks that do not involve workers.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Any, Awaitable, Callable

import pytest

from hostile import TOKENS, Served, limits_for_test
from pie_core.engine.engine import Engine
from pie_core.runtime.process import ProcessLauncher
from pie_core.server import Authenticator, PieServer, ServerOptions
from pie_core.server.auth import User, hash_token


@pytest.fixture(scope="session")
def security_engine() -> Engine:
    engine = Engine("dummy")
    engine.load(None)
    return engine


@pytest.fixture
def hostile(security_engine: Engine) -> Callable[..., Any]:
    def run(scenario: Callable[[Served], Awaitable[Any]], *, launcher: Any = "process", timeout: float = 90,
            **options: Any) -> Any:
        data_dir = Path(tempfile.mkdtemp(prefix="pie-sec-"))

        async def main() -> Any:
            users = [User(name, hash_token(tok)) for name, tok in TOKENS.items()]
            opts = ServerOptions(port=0, data_dir=data_dir, status_interval=0, **options)
            chosen = ProcessLauncher(limits_for_test()) if launcher == "process" else launcher
            server = PieServer(security_engine, opts, auth=Authenticator(users, enabled=True), launcher=chosen,
                               close_engine=False)
            await server.start()
            try:
                return await asyncio.wait_for(scenario(Served(server, server.url, f"http://127.0.0.1:{server.port}",
                                                              TOKENS, data_dir)), timeout)
            finally:
                await server.close()

        try:
            result = asyncio.run(main())
        finally:
            shutil.rmtree(data_dir, ignore_errors=True)
        assert security_engine.pools_whole(), "an attack left KV pages allocated"
        return result

    return run
