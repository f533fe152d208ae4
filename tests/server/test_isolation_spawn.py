"""``runtime.spawn`` from a worker: the child runs in a worker of its own."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import PROBE
from server_helpers import wait_until
from test_isolation import _events, _launcher, served  # noqa: F401  # ``served`` is a fixture

from pie_core.client import connect

INFERLETS = Path(__file__).parent / "inferlets"
PARENT, CHILD = INFERLETS / "iso_parent", INFERLETS / "iso_child"  # the server spawns by name: install both


def test_spawned_child_runs_in_its_own_worker_as_the_same_user_with_the_same_limits(served):
    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as alice:
            child = await alice.install(CHILD)
            kind, value = (await _events(alice, await alice.install(PARENT), {"child": child, "mode": "pids"}))[-1]
            assert kind == "return", value
            child = value["child"]
            assert len({os.getpid(), value["parent"], child["pid"]}) == 3
            assert child["sid"] == child["pid"] and child["user"] == "alice"
            assert 20 <= child["cpu_limit"] <= 25  # base CPU seconds + cpu_s=20
            assert child["cwd"] == child["scratch"]

    served(scenario, launcher=_launcher())


def test_a_crashing_child_gives_its_parent_an_error_and_the_server_keeps_serving(served):
    launcher = _launcher()

    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as alice:
            child = await alice.install(CHILD)
            kind, value = (await _events(alice, await alice.install(PARENT), {"child": child, "mode": "crash"}))[-1]
            assert kind == "return", value
            assert value.startswith("PieError: spawned inferlet") and "worker exited with code 7" in value, value
            assert s.server.engine.pools_whole()
            await wait_until(lambda: not launcher.workers)
            assert await (await alice.launch(await alice.install(PROBE), {"mode": "user"})).wait() == "alice"

    served(scenario, launcher=launcher)


def test_terminating_the_parent_kills_the_child_worker_and_frees_its_pages(served):
    launcher = _launcher()

    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as alice:
            child = await alice.install(CHILD)
            proc = await alice.launch(await alice.install(PARENT), {"child": child, "mode": "hold"})
            events = proc.events()
            parent_pid = int((await events.__anext__()).value.split()[1])
            child_msg = (await events.__anext__()).value
            assert child_msg.endswith("holding"), child_msg
            child_pid = int(child_msg.split()[1])
            assert len(launcher.workers) == 2 and not s.server.engine.pools_whole()
            await proc.terminate()
            last = await events.__anext__()
            assert (last.kind, last.value) == ("error", "cancelled: terminated by client")
            assert s.server.engine.pools_whole()
            await wait_until(lambda: not launcher.workers)
            for pid in (parent_pid, child_pid):
                await wait_until(lambda: not _alive(pid))

    served(scenario, launcher=launcher)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
