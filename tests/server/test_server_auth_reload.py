"""`pie auth add` / `pie auth remove` take effect on a running server, without a restart."""

from __future__ import annotations

import asyncio
import logging
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Awaitable, Callable

import pytest
from server_helpers import raw_connect, raw_request

from pie_core.cli.main import main as pie_main
from pie_core.client import ServerError, connect
from pie_core.server import Authenticator, PieServer, ServerOptions
from pie_core.server.auth import User, hash_token


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PIE_HOME", str(tmp_path))
    return tmp_path


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run ``pie ARGV`` as a user would and return the last line it printed."""
    assert pie_main(list(argv)) == 0
    return capsys.readouterr().out.strip().splitlines()[-1]


def _serve(engine: Any, scenario: Callable[[PieServer], Awaitable[None]]) -> None:
    async def main() -> None:
        opts = ServerOptions(port=0, data_dir=Path(tempfile.mkdtemp(prefix="pie-srv-")), status_interval=0)
        server = PieServer(engine, opts, auth=Authenticator.from_config(), close_engine=False)
        await server.start()
        try:
            await asyncio.wait_for(scenario(server), 60)
            assert len(server.processes) == 0
        finally:
            await server.close()

    asyncio.run(main())
    assert engine.pools_whole(), "a test left KV pages allocated"


def _http_status(url: str, token: str) -> int:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


async def _refused(url: str, token: str) -> str:
    with pytest.raises(ServerError) as info:
        await connect(url, token)
    assert info.value.kind == "unauthorized"
    return info.value.message


def test_a_user_added_while_serving_can_connect_and_a_removed_one_cannot(home, capsys, dummy_engine):
    _cli(capsys, "auth", "add", "alice")  # the server refuses to start with no users

    async def scenario(server: PieServer) -> None:
        models = f"http://127.0.0.1:{server.port}/v1/models"
        token = _cli(capsys, "auth", "add", "dave")
        async with await connect(server.url, token) as client:
            assert await (await client.launch("hello-world")).wait() == "hello world"
            assert await asyncio.to_thread(_http_status, models, token) == 200

            assert _cli(capsys, "auth", "remove", "dave") == "removed user dave"
            assert "matches no user" in await _refused(server.url, token)
            assert await asyncio.to_thread(_http_status, models, token) == 401
            async with raw_connect(server.url) as ws:  # the in-band `auth` request is refused too
                reply = await raw_request(ws, {"type": "auth", "id": 1, "token": token})
                assert not reply["ok"] and reply["error"]["kind"] == "unauthorized"
            # A connection authenticated before the removal keeps its user until it closes.
            assert isinstance(await client.ping(), float)

    _serve(dummy_engine, scenario)


def test_a_replaced_token_stops_working_at_once(home, capsys, dummy_engine):
    old = _cli(capsys, "auth", "add", "erin")

    async def scenario(server: PieServer) -> None:
        async with await connect(server.url, old):
            pass
        new = _cli(capsys, "auth", "add", "erin")
        assert new != old
        await _refused(server.url, old)
        async with await connect(server.url, new) as client:
            assert await (await client.launch("hello-world")).wait() == "hello world"

    _serve(dummy_engine, scenario)


def test_a_config_file_that_stops_parsing_keeps_the_last_good_users(home, capsys, dummy_engine, caplog):
    token = _cli(capsys, "auth", "add", "frank")

    async def scenario(server: PieServer) -> None:
        config = home / "config.toml"
        good = config.read_text()
        config.write_text(good + "\n[auth.users.frank\n")  # a hand edit half done
        with caplog.at_level(logging.WARNING, logger="pie.server"):
            async with await connect(server.url, token):
                pass
        assert "could not reload" in caplog.text and "keeping the previous 1 users" in caplog.text
        config.unlink()  # no file: no users (the defaults have none)
        await _refused(server.url, token)
        config.write_text(good)
        async with await connect(server.url, token):
            pass

    _serve(dummy_engine, scenario)


def test_a_fixed_user_list_is_not_reloaded(tmp_path):
    path = tmp_path / "config.toml"
    auth = Authenticator([User("gina", hash_token("t-1"))], source=None)
    assert auth.check("t-1") == "gina" and auth.user_count == 1
    from pie_core.server.auth import add_user

    followed = Authenticator.from_config(path=path)
    assert followed.user_count == 0
    token = add_user("hal", path)
    assert followed.check(token) == "hal" and auth.user_count == 1
