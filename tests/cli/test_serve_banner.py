"""``pie serve``'s banner says where the chat page is, and that it wants a token when auth is on."""

from __future__ import annotations

import pytest

from pie_core.server import PieServer


@pytest.fixture(autouse=True)
def stop_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    async def serving(self: PieServer) -> None:
        await self.close()

    monkeypatch.setattr(PieServer, "serve_until_signalled", serving)


def test_the_banner_names_the_chat_page(pie, tiny_model) -> None:
    r = pie("serve", "--dummy", "--no-auth", "--isolation", "inprocess", "--model", str(tiny_model), "--port", "0")
    assert r.code == 0, r.err
    line = next(line for line in r.err.splitlines() if line.startswith("chat in a browser: "))
    assert line.startswith("chat in a browser: http://127.0.0.1:") and line.endswith("/") and "token" not in line


def test_with_auth_on_it_says_to_paste_a_token(pie, tiny_model) -> None:
    assert pie("auth", "add", "dora").code == 0
    r = pie("serve", "--dummy", "--isolation", "inprocess", "--model", str(tiny_model), "--port", "0")
    assert r.code == 0, r.err
    assert "(paste a token from 'pie auth add NAME')" in r.err
