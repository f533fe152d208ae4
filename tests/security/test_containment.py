"""A worker stays one process: it cannot fork, spawn or exec, so its kill and its memory limit
cover everything the inferlet runs, while threads keep working."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import pytest

from hostile import Served, victim_is_served, write_program
from pie_core.client import connect
from pie_core.runtime.process import seccomp

pytestmark = pytest.mark.skipif(not seccomp.available(), reason="the kernel has no seccomp")

SPAWNERS = '''
import multiprocessing, os, subprocess, sys, threading
from concurrent.futures import ThreadPoolExecutor


def attempt(fn):
    try:
        fn()
        return "started"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


async def main(input):
    result = {
        "fork": attempt(os.fork),
        "subprocess": attempt(lambda: subprocess.run(["sleep", "60"])),
        "posix_spawn": attempt(lambda: os.posix_spawn("/bin/sleep", ["sleep", "60"], {})),
        "multiprocessing": attempt(lambda: multiprocessing.get_context("fork").Process(target=print).start()),
        "exec": attempt(lambda: os.execv(sys.executable, [sys.executable, "-c", "pass"])),
    }
    box = []
    thread = threading.Thread(target=lambda: box.append(sum(range(1000))))
    thread.start()
    thread.join()
    with ThreadPoolExecutor(4) as pool:
        squares = list(pool.map(lambda x: x * x, range(8)))
    result["threads"] = [box, squares]
    return result
'''

ESCAPER = '''
import os, subprocess, sys
from inferlet import session

MARKER = {marker!r}
SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)", MARKER]


def fork_and_leave():
    if os.fork() == 0:  # a grandchild in a session of its own escapes the worker's process group
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, SLEEPER)
        os._exit(0)


async def main(input):
    for escape in (fork_and_leave, lambda: subprocess.Popen(SLEEPER, start_new_session=True)):
        try:
            escape()
        except OSError as exc:
            session.send(f"refused: {{exc}}")
    session.send("waiting")
    return await session.receive()
'''

MEMORY = '''
import threading


async def main(input):
    mib, held, errors = input["mib"], [], []

    def grab():
        try:
            held.append(bytearray(mib * 2**20))
        except MemoryError:
            errors.append("MemoryError")

    threads = [threading.Thread(target=grab) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"held": len(held), "errors": errors}
'''


def _marked(marker: str) -> list[int]:
    """Pids of live processes whose command line carries ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def test_inferlet_cannot_fork_spawn_or_exec_but_threads_work(hostile, tmp_path: Path) -> None:
    async def scenario(s: Served) -> None:
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            program = await mallory.install(write_program(tmp_path / "spawners", SPAWNERS))
            result = await (await mallory.launch(program, {})).wait()
        for how in ("fork", "subprocess", "posix_spawn", "multiprocessing", "exec"):
            assert result[how].startswith("PermissionError"), (how, result[how])
        assert result["threads"] == [[499500], [x * x for x in range(8)]]
        await victim_is_served(s)

    hostile(scenario)


def test_no_process_an_inferlet_started_outlives_its_worker(hostile, tmp_path: Path) -> None:
    marker = f"pie-escape-{uuid.uuid4().hex}"

    async def scenario(s: Served) -> None:
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            program = await mallory.install(write_program(tmp_path / "escaper", ESCAPER.format(marker=marker)))
            proc = await mallory.launch(program, {})
            said = []
            async for event in proc.events():
                said.append(event.value)
                if event.value == "waiting":
                    break
            await proc.terminate()
            async for event in proc.events():
                pass
        assert [line for line in said if line.startswith("refused: [Errno 1]")] == said[:2], said
        await victim_is_served(s)

    try:
        hostile(scenario)
        assert _marked(marker) == [], "a process the inferlet started outlived its worker"
    finally:
        for pid in _marked(marker):  # only what this test's inferlet started
            os.kill(pid, signal.SIGKILL)


def test_threads_share_the_workers_memory_limit(hostile, tmp_path: Path) -> None:
    async def scenario(s: Served) -> None:
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            program = await mallory.install(write_program(tmp_path / "memory", MEMORY,
                                                         parameters='mib = { type = "int" }'))
            result = await (await mallory.launch(program, {"mib": 400})).wait()  # 3 x 400 MiB under 1 GiB
        assert result["held"] <= 2 and result["errors"], result
        await victim_is_served(s)

    hostile(scenario)


PRIORITY = '''
import os

async def main(input):
    return os.getpriority(os.PRIO_PROCESS, 0)
'''


def test_workers_run_below_the_servers_cpu_priority(hostile, tmp_path: Path) -> None:
    from pie_core.runtime.process.sandbox import WORKER_NICE

    async def scenario(s: Served) -> None:
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            program = await mallory.install(write_program(tmp_path / "priority", PRIORITY))
            nice = await (await mallory.launch(program, {})).wait()
        assert nice == min(19, os.getpriority(os.PRIO_PROCESS, 0) + WORKER_NICE)

    hostile(scenario)
