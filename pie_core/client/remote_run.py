"""``pie run --server URL``: run an inferlet on a server through the client SDK."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from pie_core.client.client import connect
from pie_core.engine.events import Event
from pie_core.errors import NotFound
from pie_core.runtime.library import find_inferlet
from pie_core.runtime.manifest import Manifest, load_manifest, parse_cli_args

__all__ = ["run_remote"]


def run_remote(url: str, target: str, trailing: list[str], files: list[bytes], printer: Callable[[Event], None],
               token: str | None = None) -> Event:
    """Install ``target`` when it is a local folder (else launch it by name), stream its events
    to ``printer``, forward stdin lines as messages; returns the terminal event."""
    return asyncio.run(_run(url, target, trailing, files, printer, token or os.environ.get("PIE_TOKEN")))


async def _run(url: str, target: str, trailing: list[str], files: list[bytes], printer: Callable[[Event], None],
               token: str | None) -> Event:
    folder, manifest = _local(target)
    given = parse_cli_args(trailing, manifest) if manifest is not None else parse_cli_args(trailing, _bare(target))
    async with await connect(url, token) as client:
        program = await client.install(folder) if folder is not None else target
        proc = await client.launch(program, given)
        for data in files:
            await proc.transfer_file(data)
        _feed_stdin(proc, asyncio.get_running_loop())
        final = Event("error", "no terminal event")
        async for ev in proc.events():
            final = Event(ev.kind, ev.value)
            printer(final)
        return final


def _local(target: str) -> tuple[Path | None, Manifest | None]:
    """(folder to upload, manifest) for a local folder; (None, manifest) for a known example."""
    if (Path(target) / "Pie.toml").is_file():
        return Path(target), load_manifest(target)
    try:
        return None, load_manifest(find_inferlet(target.partition("@")[0]))
    except NotFound:
        return None, None


def _bare(target: str) -> Manifest:
    return Manifest(name=target, version="", description="", entry="", root=Path("."))


def _feed_stdin(proc: Any, loop: asyncio.AbstractEventLoop) -> None:
    def pump() -> None:
        try:
            for line in sys.stdin:
                asyncio.run_coroutine_threadsafe(proc.send(line.rstrip("\n")), loop)
        except (OSError, ValueError):  # stdin closed or not readable: nothing to forward
            return

    if sys.stdin is not None and not sys.stdin.closed:
        threading.Thread(target=pump, name="pie-stdin", daemon=True).start()
