"""The escapes of the hardening issue, tried from inside the wasm sandbox: each fails without
harm, the engine keeps serving, and every page returns to the pool."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest
from wasm_helpers import run_wasm, shared_launcher

from pie_core.host.binding import HostInstance

from pie_core.runtime.manifest import load_manifest
from pie_core.runtime.wasm.host import GuestLimits
from pie_core.runtime.wasm.imports import KIND_IDS, Guest

ESCAPES = r'''
import json, os

def attempt(fn):
    try:
        return "ALLOWED: " + repr(fn())[:80]
    except BaseException as exc:
        return "refused: " + type(exc).__name__

def read(path):
    with open(path, "rb") as f:
        return f.read(64)

def sock():
    import socket
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.connect(("127.0.0.1", 22))
    return s

def run_ls():
    import subprocess
    return subprocess.run(["ls", "/"], capture_output=True)

def use_ctypes():
    import ctypes
    return ctypes.CDLL(None)

def own_scratch():
    with open("/scratch/mine.txt", "w") as f:
        f.write("ok")
    return read("/scratch/mine.txt")

async def main(input):
    secret = input["secret"]
    return {
        "etc_passwd": attempt(lambda: read("/etc/passwd")),
        "other_user_abs": attempt(lambda: read(secret)),
        "other_user_rel": attempt(lambda: read("/scratch/../bob/secret.txt")),
        "config": attempt(lambda: read(os.path.expanduser("~/.pie/config.toml"))),
        "proc": attempt(lambda: read("/proc/self/environ")),
        "root_listing": attempt(lambda: os.listdir("/")),
        "write_own_code": attempt(lambda: open("/inferlet/main.py", "w").write("pwned")),
        "socket": attempt(sock),
        "subprocess": attempt(run_ls),
        "fork": attempt(lambda: os.fork()),
        "ctypes": attempt(use_ctypes),
        "own_scratch": attempt(own_scratch),
    }
'''

BUSY = "async def main(input):\n    while True:\n        pass\n"
BOMB = """
async def main(input):
    hog = []
    try:
        while True:
            hog.append(bytearray(16 * 2**20))
    except MemoryError:
        got = len(hog) * 16
        hog.clear()
        return got
"""
HELLO = "async def main(input):\n    return 'still here'\n"


def _program(folder: Path, main_py: str, parameters: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "Pie.toml").write_text(f'[package]\nname = "{folder.name}"\nversion = "1.0.0"\ndescription = "attack"\n\n'
                                     f"[parameters]\n{parameters}\n")
    (folder / "main.py").write_text(main_py)
    return folder


def test_files_sockets_processes_and_ctypes_are_out_of_reach(dummy_engine, tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    (scratch / "bob").mkdir(parents=True)
    (scratch / "bob" / "secret.txt").write_text("bob's secret")
    code = tmp_path / "escapes"
    manifest = load_manifest(_program(code, ESCAPES, 'secret = { type = "string" }'))
    final, _ = run_wasm(dummy_engine, manifest, {"secret": str(scratch / "bob" / "secret.txt")}, scratch_root=scratch)
    assert final.kind == "return", final
    result = final.value
    assert result.pop("own_scratch") == "ALLOWED: b'ok'"  # the one door that is open
    assert {k: v for k, v in result.items() if not v.startswith("refused")} == {}, json.dumps(result, indent=1)
    assert (code / "main.py").read_text() == ESCAPES
    assert (scratch / "mallory" / "mine.txt").exists() is False and (scratch / "alice" / "mine.txt").read_text() == "ok"
    assert dummy_engine.pools_whole()


def test_a_busy_loop_is_stopped_at_its_wall_time_and_the_engine_serves_on(dummy_engine, tmp_path: Path) -> None:
    busy = load_manifest(_program(tmp_path / "busy", BUSY))
    final, _ = run_wasm(dummy_engine, busy, {}, limits=GuestLimits(wall_s=1.0, memory_mb=512), scratch_root=tmp_path)
    assert final.kind == "error" and "wall-time limit of 1s" in final.value
    hello = load_manifest(_program(tmp_path / "hello", HELLO))
    assert run_wasm(dummy_engine, hello, {}, scratch_root=tmp_path)[0].value == "still here"
    assert dummy_engine.pools_whole()


def test_a_memory_bomb_hits_the_store_limit_and_the_engine_serves_on(dummy_engine, tmp_path: Path) -> None:
    bomb = load_manifest(_program(tmp_path / "bomb", BOMB))
    final, _ = run_wasm(dummy_engine, bomb, {}, limits=GuestLimits(wall_s=30.0, memory_mb=128), scratch_root=tmp_path)
    assert final.kind == "return" and 0 < final.value < 128, final  # MiB it got before MemoryError, inside the cap
    hello = load_manifest(_program(tmp_path / "hello", HELLO))
    assert run_wasm(dummy_engine, hello, {}, scratch_root=tmp_path)[0].value == "still here"
    assert dummy_engine.pools_whole()


WAITER = '''
from inferlet import Context, Model, runtime, session

async def main(input):
    ctx = Context(Model.load(runtime.models()[0]))
    ctx.user("hold pages while waiting")
    await ctx.flush()
    return await session.receive()
'''


def test_a_cancelled_wasm_inferlet_ends_its_thread_and_frees_its_pages(dummy_engine, tmp_path: Path) -> None:
    waiter = load_manifest(_program(tmp_path / "waiter", WAITER))
    launcher = shared_launcher()
    events: list = []

    async def main() -> None:
        inst = HostInstance(engine=dummy_engine, emit=events.append, scratch_root=tmp_path)
        task = launcher.start(dummy_engine, waiter, {}, inst)
        await asyncio.sleep(0.5)
        assert not task.done() and not dummy_engine.pools_whole()  # it holds its pages while it waits
        task.cancel("operator stop")
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(50):  # the guest's blocked poll.wait notices within a tenth of a second
            if not any(t.name == f"pie-wasm-{inst.id}" for t in threading.enumerate()):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the guest thread still runs after cancellation")

    asyncio.run(main())
    assert events[-1].kind == "error" and "cancelled: operator stop" in events[-1].value
    assert dummy_engine.pools_whole()


FORGER = '''
from wit_world.imports import context, types

async def main(input):
    fake = types.Context.__new__(types.Context)
    fake.handle = 7  # a handle number the host never gave this instance
    return context.seq_len(fake)
'''


def test_a_forged_handle_ends_only_the_forger(dummy_engine, tmp_path: Path) -> None:
    final, _ = run_wasm(dummy_engine, load_manifest(_program(tmp_path / "forger", FORGER)), {}, scratch_root=tmp_path)
    assert final.kind == "error" and "trapped" in final.value, final
    hello = load_manifest(_program(tmp_path / "hello", HELLO))
    assert run_wasm(dummy_engine, hello, {}, scratch_root=tmp_path)[0].value == "still here"
    assert dummy_engine.pools_whole()


def test_the_host_refuses_a_handle_it_never_gave_or_of_another_kind(dummy_engine) -> None:
    """Behind the component model's own handle checks: the host's table."""
    inst = HostInstance(engine=dummy_engine, emit=lambda event: None)
    guest = Guest(inst, asyncio.new_event_loop(), None, threading.Event())
    engine_object = object()
    type_id, rep = guest.resource("context", engine_object)
    assert type_id == KIND_IDS["context"] and guest.resource("context", engine_object) == (type_id, rep)
    assert guest.handle("context", KIND_IDS["context"], rep) is engine_object
    with pytest.raises(PermissionError, match="not given to this inferlet"):
        guest.handle("context", KIND_IDS["context"], rep + 1)
    with pytest.raises(PermissionError, match="not given to this inferlet"):
        guest.handle("context", KIND_IDS["matcher"], rep)
