"""The chat page in a real headless Chromium against a real ``pie serve`` (dummy backend, auth on):
it asks for a token, keeps it in the browser, lists the models, streams a reply through
``/v1/chat/completions`` with token counts and speed, and its Stop button cancels a generation on
the server. A screenshot is kept as a test artifact (``$PIE_TEST_ARTIFACTS``, else
``test-artifacts/`` at the repository root).

Needs Chromium (Debian: ``apt-get install chromium-headless-shell``); skipped without one.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from chromium import Browser, find_chromium
from pie_core.engine.engine import Engine
from pie_core.hookspec import BackendOptions
from pie_core.server import Authenticator, PieServer, ServerOptions
from pie_core.server.auth import User, hash_token

CHROMIUM = find_chromium()
ARTIFACTS = Path(os.environ.get("PIE_TEST_ARTIFACTS") or Path(__file__).resolve().parents[2] / "test-artifacts")
TOKEN = "browser-token-789"

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (apt-get install chromium-headless-shell)")


@pytest.fixture(scope="module")
def slow_engine() -> Engine:
    """The dummy backend at 20 ms a step, so a reply streams visibly and can be stopped midway."""
    engine = Engine("dummy", options=BackendOptions(dtype="auto", extra={"step_ms": 20}))
    engine.load(None)
    return engine


def _serve(engine: Engine, scenario: Any) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="pie-chat-"))

    async def main() -> None:
        options = ServerOptions(port=0, data_dir=data_dir, status_interval=0)
        server = PieServer(engine, options, auth=Authenticator([User("carol", hash_token(TOKEN))]), close_engine=False)
        await server.start()
        try:
            async with Browser(CHROMIUM) as page:
                await asyncio.wait_for(scenario(server, page, f"http://127.0.0.1:{server.port}/"), 120)
                assert not [m for m in page.console if m.startswith("exception")], page.console
        finally:
            await server.close()

    try:
        asyncio.run(main())
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    assert engine.pools_whole(), "the page left KV pages allocated"


def _text(selector: str) -> str:
    return f"(document.querySelector({selector!r}) || {{}}).textContent || ''"


def test_the_page_streams_a_reply_with_counts_and_keeps_the_token(slow_engine: Engine) -> None:
    async def scenario(server: PieServer, page: Browser, url: str) -> None:
        await page.goto(url)
        await page.wait_for(f"{_text('#status')}.includes('needs a token')")
        await page.type("#token", TOKEN)
        await page.js("document.getElementById('token').blur()")  # a change event: the token is saved, models load
        await page.wait_for("document.querySelectorAll('#model option').length > 0")
        assert await page.js("document.getElementById('model').value") == "qwen2.5-coder-0.5b-instruct"
        assert await page.js("localStorage.getItem('pie.token')") == TOKEN
        await page.js("document.getElementById('max-tokens').value = '24'")
        await page.type("#input", "Write a haiku about pie.")
        await page.press("Enter", 13)
        await page.wait_for(f"{_text('.msg.assistant')}.length > 0")  # tokens arrive while it still generates
        assert await page.js("document.getElementById('stop').disabled") is False
        await page.wait_for("!document.getElementById('send').disabled")
        stats = await page.js(_text(".stats"))
        assert "prompt tokens" in stats and "24 tokens generated" in stats and "ms to first token" in stats
        assert "tokens/s" in stats and "length" in stats, stats
        assert await page.js(_text(".msg.user")) == "Write a haiku about pie."
        shot = await page.screenshot(ARTIFACTS / "chat-page.png")
        assert shot.stat().st_size > 10_000
        await page.goto(url)  # a new visit: the token is still in the browser
        await page.wait_for("document.querySelectorAll('#model option').length > 0")
        assert await page.js("document.getElementById('token').value") == TOKEN
        await page.click("#forget")
        await page.wait_for(f"{_text('#status')}.includes('needs a token')")
        assert await page.js("localStorage.getItem('pie.token')") is None

    _serve(slow_engine, scenario)


def test_stop_cancels_the_generation_on_the_server(slow_engine: Engine) -> None:
    async def scenario(server: PieServer, page: Browser, url: str) -> None:
        await page.goto(url)
        await page.js(f"localStorage.setItem('pie.token', {TOKEN!r})")
        await page.goto(url)
        await page.wait_for("document.querySelectorAll('#model option').length > 0")
        await page.js("document.getElementById('max-tokens').value = '2000'")  # ~40 s at 20 ms a step
        await page.type("#input", "Tell me everything.")
        await page.click("#send")
        await page.wait_for(f"{_text('.msg.assistant')}.length > 20")
        assert len(server.processes.all()) == 1
        await page.click("#stop")
        stats = await page.wait_for(f"{_text('.stats')}.includes('stopped') && {_text('.stats')}")
        assert "~" in stats  # no usage chunk came: the count is the chunks seen
        for _ in range(200):  # the server sees the client leave and cancels the generation
            if not server.processes.all():
                break
            await asyncio.sleep(0.05)
        assert not server.processes.all()
        await page.screenshot(ARTIFACTS / "chat-page-stopped.png")

    _serve(slow_engine, scenario)
