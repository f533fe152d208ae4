"""What an inferlet prints in the wasm sandbox reaches the client as in the other runners: all
of it however long a write, a flushed partial line in order with the inferlet's host calls, a
line past 64 KiB in 65536-character events, and never half a character."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from wasm_helpers import run_wasm

from pie_core.engine.engine import Engine
from pie_core.runtime.manifest import load_manifest

GUEST_STDIO = Path(__file__).resolve().parents[2] / "pie_core/runtime/wasm/guest/pie_guest/stdio.py"
CHUNK = 65536


def _run(engine: Engine, folder: Path, main_py: str) -> tuple[tuple[str, Any], list[tuple[str, Any]]]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "Pie.toml").write_text(f'[package]\nname = "{folder.name}"\nversion = "1.0.0"\ndescription = "prints"\n')
    (folder / "main.py").write_text(main_py)
    final, events = run_wasm(engine, load_manifest(folder), {})
    return (final.kind, final.value), [(e.kind, e.value) for e in events]


def _of(events: list[tuple[str, Any]], kind: str) -> list[str]:
    return [value for k, value in events if k == kind]


LONG_WRITES = '''
import sys

async def main(input):
    print("x" * 20000)
    sys.stderr.write("e" * 10000)
    print("\\u00e9" * 5000)
    return "done"
'''


def test_a_write_past_8192_bytes_arrives_whole(dummy_engine: Engine, tmp_path: Path) -> None:
    final, events = _run(dummy_engine, tmp_path / "long", LONG_WRITES)
    assert final == ("return", "done")
    assert _of(events, "stdout") == ["x" * 20000 + "\n", "\u00e9" * 5000 + "\n"]
    assert _of(events, "stderr") == ["e" * 10000]


PARTIAL = '''
import sys
from inferlet import session

async def main(input):
    sys.stdout.write("partial")
    sys.stdout.flush()
    session.send("sent between")
    print(" and the rest")
    sys.stderr.write("err one")
    sys.stderr.write("err two")
    print("unterminated", end="")
    return "done"
'''


def test_a_flushed_partial_line_goes_out_in_order_with_the_inferlets_host_calls(dummy_engine: Engine,
                                                                               tmp_path: Path) -> None:
    final, events = _run(dummy_engine, tmp_path / "partial", PARTIAL)
    assert final == ("return", "done")
    assert events == [("stdout", "partial"), ("stdout", "sent between"), ("stdout", " and the rest\n"),
                      ("stderr", "err one"), ("stderr", "err two"), ("stdout", "unterminated")]


LONG_LINES = '''
import sys

async def main(input):
    print("y" * 70000)
    sys.stdout.write("z" * 140000)
    sys.stdout.write("\\u20ac" * 70000 + "\\n")
    return "done"
'''


def test_a_line_past_64_kib_goes_out_in_65536_character_events(dummy_engine: Engine, tmp_path: Path) -> None:
    final, events = _run(dummy_engine, tmp_path / "lines", LONG_LINES)
    assert final == ("return", "done")
    euro = "\u20ac" * 70000 + "\n"  # three bytes per character: cut by characters, never mid-character
    assert _of(events, "stdout") == ["y" * CHUNK, "y" * (70000 - CHUNK), "\n",  # print writes the "\n" apart
                                     "z" * CHUNK, "z" * CHUNK, "z" * (140000 - 2 * CHUNK),
                                     euro[:CHUNK], euro[CHUNK:]]


RAW_WRITES = '''
import os

async def main(input):
    print("before")
    written = [os.write(1, b"RAW-FD1-MARKER\\n" * 1000), os.write(2, b"RAW-FD2-MARKER\\n")]
    print("after")
    return written
'''


def test_raw_writes_to_fds_1_and_2_reach_neither_the_client_nor_the_server_log(
        dummy_engine: Engine, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    final, events = _run(dummy_engine, tmp_path / "raw", RAW_WRITES)
    assert final == ("return", [15000, 15])  # taken whole, as a worker process's /dev/null takes them
    assert events == [("stdout", "before\n"), ("stdout", "after\n")]
    out, err = capfd.readouterr()
    assert "MARKER" not in out + err


def _guest_stdio() -> Any:
    spec = importlib.util.spec_from_file_location("pie_guest_stdio", GUEST_STDIO)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_WRITES = st.lists(st.one_of(st.none(), st.text(alphabet="ab\n\u00e9", max_size=9000),
                             st.builds(lambda n, c: c * n, st.integers(60000, 140000), st.sampled_from("c\n"))),
                   max_size=12)


@settings(max_examples=60, deadline=None)
@given(writes=_WRITES, stream=st.sampled_from(["stdout", "stderr"]))
def test_the_streams_send_every_character_once_in_order_in_bounded_events(writes: list[str | None],
                                                                           stream: str) -> None:
    # One class serves the worker and the guest (inferlet.host.entry.ClientStream).
    sent: list[str] = []
    out = _guest_stdio().ClientStream(sent.append, stream)
    for text in writes:  # None: a flush
        out.flush() if text is None else out.write(text)
        if stream == "stdout":
            assert "\n" not in out._buf and len(out._buf) < CHUNK  # a whole line never waits
    out.flush()
    assert "".join(sent) == "".join(t for t in writes if t is not None)
    assert all(0 < len(event) <= CHUNK for event in sent if event) and all(event for event in sent[:-1] if stream == "stderr")


def test_a_line_that_never_ends_is_held_in_at_most_64_kib() -> None:
    sent: list[str] = []
    out = _guest_stdio().ClientStream(sent.append, "stdout")
    for _ in range(20000):  # 1.4 MB, no newline
        out.write("w" * 69 + "\u00e9")
        assert len(out._buf) < CHUNK
    out.flush()
    assert all(len(text) <= CHUNK for text in sent) and "".join(sent) == ("w" * 69 + "\u00e9") * 20000
