"""Users are kept apart: processes, programs and runtime.username()."""

from __future__ import annotations

import pytest
from conftest import PROBE

from pie_core.client import ServerError, connect


def test_two_users_cannot_see_or_touch_each_others_processes(served):
    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as alice, await connect(s.url, s.tokens["bob"]) as bob:
            proc = await alice.launch(await alice.install(PROBE), {"mode": "echo"})
            assert [p["process"] for p in await alice.list_processes()] == [proc.id]
            assert await bob.list_processes() == []
            for kind, extra in [("attach", {}), ("detach", {}), ("send", {"message": "hi"}), ("signal", {"signal": "stop"}),
                                ("transfer_file", {"data": b"x"}), ("terminate", {})]:
                with pytest.raises(ServerError, match=f"not_found: no process '{proc.id}' of user 'bob'"):
                    await bob.request(kind, process=proc.id, **extra)
            await proc.send("still mine")
            await proc.signal("stop")
            assert [e.value async for e in proc.events()] == ["echo:still mine", "stopped"]

    served(scenario)


def test_username_is_the_authenticated_user_and_uploads_are_per_user(served):
    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as alice, await connect(s.url, s.tokens["bob"]) as bob:
            program = await alice.install(PROBE)
            assert await (await alice.launch(program, {"mode": "user"})).wait() == "alice"
            with pytest.raises(ServerError, match="no program 'probe@1.0.0'"):
                await bob.launch(program, {"mode": "user"})
            assert "probe@1.0.0" not in await bob.list_programs()
            await bob.install(PROBE)
            assert await (await bob.launch(program, {"mode": "user"})).wait() == "bob"

    served(scenario)


def test_without_auth_everyone_is_local(served):
    async def scenario(s):
        async with await connect(s.url) as client:
            assert await (await client.launch(await client.install(PROBE), {"mode": "user"})).wait() == "local"

    served(scenario, auth=False)
