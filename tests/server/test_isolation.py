"""Process isolation: each inferlet in a worker process, contained when it misbehaves."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import pytest
from conftest import PROBE, TOKENS, Served
from server_helpers import wait_until

from pie_core.client import connect
from pie_core.errors import InvalidInput
from pie_core.host import runtime as host_runtime
from pie_core.host.binding import HostInstance, bind, unbind
from pie_core.runtime.process import ProcessLauncher, WorkerLimits
from pie_core.server import Authenticator, PieServer, ServerOptions
from pie_core.server.auth import User, hash_token

BAD = '''
import os
from inferlet import Context, Model, Sampler, runtime, session

async def main(input: dict):
    mode = input["mode"]
    model = Model.load(runtime.models()[0])
    with Context(model) as ctx:
        ctx.user("hold pages while misbehaving")
        await ctx.generate(Sampler.argmax(), max_tokens=2, stop=[]).collect_tokens()
        session.send("holding")
        if mode == "exit":
            os._exit(3)
        if mode == "spin":
            while True:
                pass
        if mode == "alloc":
            hog = []
            while True:
                hog.append(bytearray(64 * 2**20))
        if mode == "scratch":
            path = runtime.scratch_path(input["name"])
            with open(path, "a") as f:
                f.write(runtime.username())
            return [runtime.scratch_dir(), open(path).read()]
        if mode == "escape":
            return runtime.scratch_path("../bob/x")
        if mode == "reach":  # a handle is opaque: host calls take it, its engine object stays out of reach
            from inferlet.host import context
            context.check_live(ctx._ctx)
            return ctx._ctx.owner
    return "unreachable"
'''


@pytest.fixture
def served(dummy_engine):
    """Like conftest's ``served``, with a chosen launcher (None: in-process)."""

    def run(scenario, *, launcher=None):
        async def main():
            users = [User(name, hash_token(tok)) for name, tok in TOKENS.items()]
            opts = ServerOptions(port=0, data_dir=Path(tempfile.mkdtemp(prefix="pie-srv-")), status_interval=0)
            server = PieServer(dummy_engine, opts, auth=Authenticator(users), launcher=launcher, close_engine=False)
            await server.start()
            try:
                return await asyncio.wait_for(scenario(Served(server, server.url, "", TOKENS)), 60)
            finally:
                await server.close()

        result = asyncio.run(main())
        assert dummy_engine.pools_whole(), "a test left KV pages allocated"
        return result

    return run


@pytest.fixture(scope="module")
def bad_program() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="pie-bad-"))
    (folder / "Pie.toml").write_text('[package]\nname = "bad"\nversion = "1.0.0"\ndescription = "misbehaves"\n\n'
                                     '[parameters]\nmode = { type = "string", description = "how" }\n'
                                     'name = { type = "string", default = "f.txt" }\n')
    (folder / "main.py").write_text(BAD)
    yield folder
    shutil.rmtree(folder)


def _launcher(*, zygote: bool = True, **limits) -> ProcessLauncher:
    return ProcessLauncher(WorkerLimits(**{"wall_s": 20.0, "cpu_s": 20, "memory_mb": 512, **limits}), zygote=zygote)


async def _events(client, program, args):
    proc = await client.launch(program, args)
    return [(e.kind, e.value) async for e in proc.events()]


@pytest.mark.parametrize("mode, limits, error", [
    ("exit", {}, "worker exited with code 3"),
    ("spin", {"wall_s": 3.0}, "wall-time limit of 3s"),
    ("spin", {"cpu_s": 1}, "CPU-time limit"),
    ("alloc", {}, "memory limit"),
    ("alloc", {"zygote": False}, "memory limit"),  # a fresh interpreter instead of a fork
])
def test_misbehaving_worker_is_killed_and_its_pages_return(served, bad_program, mode, limits, error):
    launcher = _launcher(**limits)

    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as alice:
            events = await _events(alice, await alice.install(bad_program), {"mode": mode})
            assert events[0] == ("stdout", "holding"), events
            assert events[-1][0] == "error" and error in events[-1][1], events
            assert s.server.engine.pools_whole()
            await wait_until(lambda: not launcher.workers)  # reaped right after the event
            assert await (await alice.launch(await alice.install(PROBE), {"mode": "user"})).wait() == "alice"

    served(scenario, launcher=launcher)


def test_normal_inferlet_gives_the_same_events_as_in_process(served):
    async def run_both(s):
        async with await connect(s.url, s.tokens["alice"]) as alice:
            program = await alice.install(PROBE)
            return await _events(alice, program, {"mode": "generate", "max_tokens": 4})

    isolated = served(run_both, launcher=_launcher())
    in_process = served(run_both)
    assert isolated == in_process
    assert [k for k, _ in isolated] == ["stdout"] * 4 + ["return"]


def test_scratch_is_per_user_and_refuses_traversal(served, bad_program):
    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as alice, await connect(s.url, s.tokens["bob"]) as bob:
            a_dir, a_text = (await _events(alice, await alice.install(bad_program), {"mode": "scratch"}))[-1][1]
            b_dir, b_text = (await _events(bob, await bob.install(bad_program), {"mode": "scratch"}))[-1][1]
            assert (a_text, b_text) == ("alice", "bob")
            assert a_dir != b_dir and Path(a_dir).parent == Path(b_dir).parent
            assert Path(a_dir).parent == s.server.options.data_dir / "scratch"
            kind, value = (await _events(alice, await alice.install(bad_program), {"mode": "escape"}))[-1]
            assert kind == "error" and "leaves the scratch directory" in value

    served(scenario, launcher=_launcher())


def test_a_worker_cannot_reach_engine_objects_through_a_handle(served, bad_program):
    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as alice:
            kind, value = (await _events(alice, await alice.install(bad_program), {"mode": "reach"}))[-1]
            assert kind == "error" and "Context handle is opaque and has no attribute 'owner'" in value

    served(scenario, launcher=_launcher())


def test_terminating_an_isolated_process_kills_its_worker_and_frees_its_pages(served):
    launcher = _launcher()

    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as alice:
            proc = await alice.launch(await alice.install(PROBE), {"mode": "hold"})
            events = proc.events()
            assert (await events.__anext__()).value == "holding"
            assert not s.server.engine.pools_whole() and len(launcher.workers) == 1
            await proc.terminate()
            last = await events.__anext__()
            assert (last.kind, last.value) == ("error", "cancelled: terminated by client")
            assert s.server.engine.pools_whole()
            await wait_until(lambda: not launcher.workers)

    served(scenario, launcher=launcher)


def test_scratch_path_refuses_absolute_paths_and_links_out(dummy_engine, tmp_path):
    inst = HostInstance(engine=dummy_engine, emit=lambda ev: None, username="alice", scratch_root=tmp_path / "scratch")
    token = bind(inst)
    try:
        base = Path(host_runtime.scratch_dir())
        assert base == (tmp_path / "scratch" / "alice").resolve() and base.is_dir()
        assert host_runtime.scratch_path("a/b.txt") == str(base / "a" / "b.txt") and (base / "a").is_dir()
        (base / "out").symlink_to(tmp_path)
        for bad in ["/etc/passwd", "../bob/x", "a/../../x", "out/secret", ""]:
            with pytest.raises(InvalidInput):
                host_runtime.scratch_path(bad)
    finally:
        unbind(token)


def test_worker_limits_come_from_config(tmp_path, monkeypatch):
    monkeypatch.setenv("PIE_HOME", str(tmp_path))
    assert WorkerLimits.from_config() == WorkerLimits()
    (tmp_path / "config.toml").write_text('[server]\nworker_wall_s = 5\nworker_cpu_s = 2\nworker_memory = "256MiB"\n')
    assert WorkerLimits.from_config() == WorkerLimits(wall_s=5.0, cpu_s=2, memory_mb=256)
    (tmp_path / "config.toml").write_text("[server]\nworker_cpu_s = -1\n")
    with pytest.raises(InvalidInput, match="must be >= 0"):
        WorkerLimits.from_config()
