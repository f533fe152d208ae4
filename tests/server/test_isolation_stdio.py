"""Class 6: an inferlet's print() and stderr reach its client as events, never the server's log."""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from test_isolation import _events, _launcher, served  # noqa: F401  # ``served`` is a fixture

from pie_core.client import connect
from pie_core.runtime.instance import run_main

NOISY = '''
import os, sys

async def main(input: dict):
    print("line one")
    print("\\x1b[31m2024-01-01 ERROR fake server line", flush=False)
    sys.stderr.write("to stderr")
    os.write(1, b"RAW-FD1-MARKER\\n")
    os.write(2, b"RAW-FD2-MARKER\\n")
    print("partial", end="")
    return "done"
'''


def _program() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="pie-noisy-"))
    (folder / "Pie.toml").write_text('[package]\nname = "noisy"\nversion = "1.0.0"\ndescription = "prints"\n')
    (folder / "main.py").write_text(NOISY)
    return folder


def test_worker_prints_become_line_events_and_raw_fds_stay_out_of_the_server_log(served, capfd):
    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as alice:
            return await _events(alice, await alice.install(_program()), {})

    events = served(scenario, launcher=_launcher())
    assert events == [("stdout", "line one\n"), ("stdout", "\x1b[31m2024-01-01 ERROR fake server line\n"),
                      ("stderr", "to stderr"), ("stdout", "partial"), ("return", "done")]
    out, err = capfd.readouterr()
    assert "MARKER" not in out + err and "fake server line" not in out + err


def test_in_process_prints_become_events_of_their_own_inferlet_only(dummy_engine, capsys):
    events = []

    async def inferlet(_input: dict) -> str:
        print("hello")
        print("a", end="")
        print("b", end="")
        sys.stdout.flush()
        print("tail", end="")
        return "ok"

    async def main() -> None:
        outside = asyncio.get_running_loop().create_task(asyncio.sleep(0))
        await run_main(dummy_engine, inferlet, {}, events.append)
        await outside
        print("not an inferlet's")

    asyncio.run(main())
    assert [(e.kind, e.value) for e in events] == [("stdout", "hello\n"), ("stdout", "ab"), ("stdout", "tail"),
                                                   ("return", "ok")]
    assert "not an inferlet's" in capsys.readouterr().out
