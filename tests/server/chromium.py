"""A real headless Chromium driven over the DevTools protocol (CDP) with ``websockets``: enough to
load a page, type, press keys, read the DOM and take a screenshot. Debian's
``chromium-headless-shell`` (or ``chromium``) provides the browser; :func:`find_chromium` says
where it is, or None."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from websockets.asyncio.client import connect

__all__ = ["find_chromium", "Browser"]

_NAMES = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome", "headless_shell")


def find_chromium() -> str | None:
    """``$PIE_CHROMIUM``, else the first Chromium on ``PATH``."""
    if env := os.environ.get("PIE_CHROMIUM"):
        return env
    return next((path for name in _NAMES if (path := shutil.which(name))), None)


class Browser:
    """One headless Chromium with one page. ``async with Browser(binary) as page: ...``."""

    def __init__(self, binary: str, width: int = 1100, height: int = 760) -> None:
        self.binary, self.size = binary, (width, height)
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self.console: list[str] = []  # console messages and uncaught exceptions of the page

    async def __aenter__(self) -> Browser:
        self._profile = tempfile.mkdtemp(prefix="pie-chromium-")
        self._proc = subprocess.Popen(
            [self.binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
             "--remote-debugging-port=0", f"--user-data-dir={self._profile}",
             f"--window-size={self.size[0]},{self.size[1]}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self._profile) / "DevToolsActivePort"
        for _ in range(300):
            if port_file.is_file() and port_file.read_text().strip():
                break
            await asyncio.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        targets = await asyncio.to_thread(lambda: json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list")))
        page = next(t for t in targets if t["type"] == "page")
        self._ws = await connect(page["webSocketDebuggerUrl"], max_size=64 * 2**20)
        self._reader = asyncio.create_task(self._read())
        for domain in ("Page", "Runtime"):
            await self.call(f"{domain}.enable")
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._reader.cancel()
        await self._ws.close()
        self._proc.kill()
        self._proc.wait(10)
        shutil.rmtree(self._profile, ignore_errors=True)

    async def _read(self) -> None:
        async for raw in self._ws:
            msg = json.loads(raw)
            if "id" in msg and msg["id"] in self._waiting:
                self._waiting.pop(msg["id"]).set_result(msg)
            elif msg.get("method") == "Runtime.consoleAPICalled":
                self.console.append(" ".join(str(a.get("value", a.get("description", ""))) for a in msg["params"]["args"]))
            elif msg.get("method") == "Runtime.exceptionThrown":
                self.console.append("exception: " + json.dumps(msg["params"]["exceptionDetails"])[:500])

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One CDP command; its result.

        Raises:
            RuntimeError: The browser answered with an error.
        """
        ident = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[ident] = future
        await self._ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        reply = await asyncio.wait_for(future, 30)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply["result"]

    async def goto(self, url: str) -> None:
        await self.call("Page.navigate", url=url)
        await self.wait_for("document.readyState === 'complete'")

    async def js(self, expression: str) -> Any:
        """The value of ``expression`` in the page (promises awaited)."""
        result = await self.call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = 20.0) -> Any:
        """Poll until ``expression`` is truthy; its value.

        Raises:
            AssertionError: Not within ``timeout`` seconds (with the page's console).
        """
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while True:
            value = await self.js(expression)
            if value:
                return value
            if loop.time() > end:
                raise AssertionError(f"the page never satisfied {expression!r}; console: {self.console}")
            await asyncio.sleep(0.05)

    async def type(self, selector: str, text: str) -> None:
        """Focus the element and type ``text`` as keyboard input (input events fire)."""
        await self.js(f"document.querySelector({json.dumps(selector)}).focus()")
        await self.call("Input.insertText", text=text)

    async def press(self, key: str, code: int) -> None:
        for kind in ("keyDown", "keyUp"):
            await self.call("Input.dispatchKeyEvent", type=kind, key=key, code=key, windowsVirtualKeyCode=code,
                            text="\r" if key == "Enter" and kind == "keyDown" else "")

    async def click(self, selector: str) -> None:
        """A real mouse click at the element's centre."""
        box = await self.js(f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
                            " return [r.x + r.width / 2, r.y + r.height / 2]; })()")
        for kind in ("mousePressed", "mouseReleased"):
            await self.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)

    async def screenshot(self, path: Path) -> Path:
        data = await self.call("Page.captureScreenshot", format="png")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data["data"]))
        return path
