"""A wasm guest that waits instead of running still ends at its wall-time limit and when
terminated, and leaves nothing behind: WASI's clock waits block in wasmtime's native code,
where epochs cannot reach them, so the guest's sleeps wait in the host (``pie_guest/clock.py``)
and its store's epoch callback traps it at the next tick once it must stop."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))

from hostile import Served, victim_is_served, write_program  # noqa: E402
from pie_core.client import connect  # noqa: E402
from pie_core.host.binding import HostInstance  # noqa: E402
from pie_core.runtime.manifest import load_manifest  # noqa: E402
from pie_core.runtime.wasm.build import toolchain_missing  # noqa: E402
from pie_core.runtime.wasm.host import GuestLimits, live_stores  # noqa: E402
from pie_core.runtime.wasm.launcher import WasmLauncher  # noqa: E402

pytestmark = pytest.mark.skipif(toolchain_missing() is not None, reason="the wasm toolchain is missing")

WAITERS = {
    "time.sleep": "import time\n\ndef main(input):\n    time.sleep(1e6)\n",
    "asyncio.sleep": "import asyncio\n\nasync def main(input):\n    await asyncio.sleep(1e9)\n",
    "select": "import select\n\ndef main(input):\n    select.select([], [], [], 1e6)\n",
    "select.poll": "import select\n\ndef main(input):\n    select.poll().poll(1e9)\n",
    "selectors": "import selectors\n\ndef main(input):\n    selectors.DefaultSelector().select(1e6)\n",
    "busy": "def main(input):\n    while True:\n        pass\n",
}

HOARDER = '''
import time

def main(input):
    hoard = bytearray(input["mib"] * 2**20)
    hoard[::4096] = b"x" * len(hoard[::4096])
    print("holding", flush=True)
    time.sleep(1e6)
'''


def _launcher(wall_s: float) -> WasmLauncher:
    from wasm_helpers import shared_launcher

    return WasmLauncher(GuestLimits(wall_s=wall_s, memory_mb=512), host=asyncio.run(shared_launcher().host()))


def _guest_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("pie-wasm-") and t.name != "pie-wasm-epochs"]


def _guests_gone(within_s: float = 3.0) -> bool:
    """Whether every guest thread and store is gone within ``within_s``: a guest's thread leaves
    right after its final event, on a loaded machine not at once; a leak stays."""
    deadline = time.monotonic() + within_s
    while _guest_threads() or live_stores():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("kind", sorted(WAITERS))
def test_a_waiting_guest_ends_at_its_wall_time_limit(security_engine, tmp_path: Path, kind: str) -> None:
    launcher = _launcher(wall_s=1.0)
    manifest = load_manifest(write_program(tmp_path / "waiter", WAITERS[kind]))
    events = []
    inst = HostInstance(engine=security_engine, emit=events.append, username="mallory", scratch_root=tmp_path)

    async def main():
        start = time.monotonic()
        final = await asyncio.wait_for(launcher.start(security_engine, manifest, {}, inst), 10)
        return final, time.monotonic() - start

    final, took = asyncio.run(main())
    assert final.kind == "error" and "wall-time limit of 1s" in str(final.value), final
    assert took < 3.0, f"the {kind} guest ended {took:.1f}s after starting, its limit is 1s"
    assert _guests_gone(), (_guest_threads(), live_stores())


def test_terminated_guests_free_their_thread_and_store(security_engine, tmp_path: Path) -> None:
    launcher = _launcher(wall_s=60.0)
    manifest = load_manifest(write_program(tmp_path / "hoarder", HOARDER, parameters='mib = { type = "int" }'))

    async def once() -> float:
        events = []
        inst = HostInstance(engine=security_engine, emit=events.append, username="mallory", scratch_root=tmp_path)
        task = launcher.start(security_engine, manifest, {"mib": 64}, inst)
        while not any(e.kind == "stdout" for e in events):
            assert not task.done(), events
            await asyncio.sleep(0.02)
        start = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - start

    for _ in range(3):  # terminate and relaunch: nothing accumulates
        took = asyncio.run(once())
        assert took < 2.0, f"the terminated guest took {took:.1f}s to end"
        assert _guests_gone(), f"a terminated guest's thread {_guest_threads()} or store ({live_stores()}, 64 MiB each) is still alive"


def test_a_sleeping_guest_is_terminated_through_the_server(hostile, tmp_path: Path) -> None:
    sleeper = write_program(tmp_path / "sleeper", WAITERS["time.sleep"])

    async def scenario(s: Served) -> None:
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            proc = await mallory.launch(await mallory.install(sleeper), {})
            await asyncio.sleep(0.3)
            assert await victim_is_served(s, within_s=0.5) < 0.5
            start = time.monotonic()
            await proc.terminate()
            with pytest.raises(Exception):
                await asyncio.wait_for(proc.wait(), 3)
            assert time.monotonic() - start < 3
            assert await asyncio.to_thread(_guests_gone), (_guest_threads(), live_stores())
            assert s.server.processes.running_of("mallory") == 0

    hostile(scenario, launcher=_launcher(wall_s=60.0))
