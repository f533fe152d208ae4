"""Workers are forked from a pre-started zygote; the exec'd worker stays as the fallback."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from test_isolation import _launcher, served  # noqa: F401  # ``served`` is a fixture

from pie_core.client import connect
from pie_core.runtime.process import spawner

CHILD = Path(__file__).parent / "inferlets" / "iso_child"


async def _facts(client) -> dict:
    return await (await client.launch(await client.install(CHILD), {"mode": "facts"})).wait()


def test_workers_are_forked_from_one_zygote_each_in_its_own_session(served, monkeypatch):
    # The imports happen once, in the zygote: count zygote starts and exec'd workers (each of
    # which would import Python and Pie anew) instead of timing launches.
    starts, execs = [], []
    real_start, real_exec = spawner.Zygote.start, spawner.exec_worker

    async def counted_start(self):
        starts.append(self)
        await real_start(self)

    async def counted_exec():
        execs.append(1)
        return await real_exec()

    monkeypatch.setattr(spawner.Zygote, "start", counted_start)
    monkeypatch.setattr(spawner, "exec_worker", counted_exec)
    launcher = _launcher()

    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as alice:
            pids = set()
            for _ in range(3):
                facts = await _facts(alice)
                assert facts["ppid"] == launcher.spawner.zygote.pid != os.getpid()
                assert facts["sid"] == facts["pid"]
                pids.add(facts["pid"])
            assert len(pids) == 3  # three workers, one zygote started once, nothing exec'd
            assert len(starts) == 1 and execs == []

    served(scenario, launcher=launcher)


def test_the_exec_fallback_runs_workers_as_children_of_the_server(served):
    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as alice:
            facts = await _facts(alice)
            assert facts["ppid"] == os.getpid() and facts["sid"] == facts["pid"]

    served(scenario, launcher=_launcher(zygote=False))


def test_a_zygote_that_cannot_start_falls_back_to_exec(served, monkeypatch):
    monkeypatch.setattr(spawner, "_ZYGOTE_MAIN", "import sys; sys.exit(3)")
    launcher = _launcher()

    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as alice:
            assert (await _facts(alice))["ppid"] == os.getpid()
            assert not launcher.spawner.use_zygote
            assert (await _facts(alice))["ppid"] == os.getpid()

    served(scenario, launcher=launcher)


def test_a_killed_zygote_is_replaced_on_the_next_launch(served):
    launcher = _launcher()

    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as alice:
            first = (await _facts(alice))["ppid"]
            os.kill(first, signal.SIGKILL)
            second = (await _facts(alice))["ppid"]
            assert second == launcher.spawner.zygote.pid and second not in (first, os.getpid())

    served(scenario, launcher=launcher)


def test_workers_do_not_inherit_the_servers_secrets_and_write_to_scratch(served, monkeypatch):
    monkeypatch.setenv("PIE_TEST_SECRET_TOKEN", "hunter2")

    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as alice:
            facts = await _facts(alice)
            assert "PIE_TEST_SECRET_TOKEN" not in facts["env"] and "PATH" in facts["env"]
            assert facts["cwd"] == facts["tmpdir"] == facts["scratch"]
            assert Path(facts["scratch"]).parent == s.server.options.data_dir / "scratch"

    served(scenario, launcher=_launcher())


def test_warm_up_starts_the_zygote_before_the_first_launch(served):
    launcher = _launcher()

    async def scenario(s):
        launcher.warm_up()
        zygote = launcher.spawner.zygote
        await asyncio.wait_for(asyncio.shield(zygote.ready), 60)
        async with await connect(s.url, s.tokens["alice"]) as alice:
            assert (await _facts(alice))["ppid"] == zygote.pid

    served(scenario, launcher=launcher)
