"""Replicas on Ray (``pie serve --ray``): each replica's backend is a Ray actor in its own
process that reads the model by name; placement, page tables and the market stay in the engine.
Two replicas of a tiny qwen2 on the cpu backend, on one local Ray for the whole module."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import ray

from pie_core.backend import BackendCalls
from pie_core.cli.main import main as pie_main
from pie_core.engine.engine import Engine, LoadedModel
from pie_core.engine.events import Event
from pie_core.hookspec import BackendOptions
from pie_core.runtime.instance import run_inferlet
from pie_core.runtime.manifest import load_manifest
from pie_core.errors import BackendError
from pie_core.hookspec import CopyKind
from pie_core.scaleout.ray_calls import RayCalls, start_ray_replicas
from pie_core.server import Authenticator, PieServer, ServerOptions
from pie_core.server.openai_placement import demand_of

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
from tiny_gguf import write_tiny_qwen2  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PS = 4
OPTIONS = BackendOptions(page_size=PS, kv_pages=64)
PROMPT = "The quick brown fox jumps over the lazy dog while the cat sleeps by the warm fire tonight"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A tiny qwen2 GGUF, and one local Ray whose actors see this module's PIE_HOME and cache
    (a Ray's workers take the environment of the process that started it)."""
    root = tmp_path_factory.mktemp("ray")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PIE_HOME", str(root / "home"))
        env.setenv("PIE_CACHE_DIR", str(root / "cache"))
        ray.init(num_cpus=2, object_store_memory=100 << 20, include_dashboard=False, log_to_driver=False)
        try:
            yield write_tiny_qwen2(root / "tiny-qwen2.gguf")
        finally:
            ray.shutdown()


def _engine(model: Path, ray_address: str | None) -> tuple[Engine, list[LoadedModel]]:
    engine = Engine("cpu", options=OPTIONS, replicas=2 if ray_address is not None else 1, ray=ray_address)
    name = engine.load(str(model)).name
    return engine, engine.replicas[name]


def _complete(engine: Engine, prompts: list[str]) -> list[Event]:
    """Run ``text-completion`` on each prompt at once; each one's terminal event, its streamed
    text as ``value`` when it returned."""
    manifest = load_manifest(EXAMPLES / "text-completion")

    async def one(prompt: str) -> Event:
        events: list[Event] = []
        final = await run_inferlet(engine, manifest, {"prompt": prompt, "max_tokens": 6}, events.append)
        text = "".join(str(e.value) for e in events if e.kind == "stdout")
        return Event("return", text) if final.kind == "return" else final

    async def all_of() -> list[Event]:
        return list(await asyncio.gather(*(one(p) for p in prompts)))

    return asyncio.run(all_of())


def _actor(replica: LoadedModel) -> Any:
    calls = replica.worker._calls
    assert isinstance(calls, RayCalls)
    return calls.actor


def _dies(actor: Any, within: float = 30.0) -> bool:
    """True once a call on ``actor`` fails because it is dead (``ray.kill`` takes effect a
    moment after it returns)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            ray.get(actor.ready.remote(), timeout=within)
        except ray.exceptions.RayActorError:
            return True
        time.sleep(0.05)
    return False


def test_ray_calls_send_every_backend_call_to_the_actor():
    """A method added to BackendCalls and not to RayCalls would call a hook that is not here."""
    public = {n for n, v in vars(BackendCalls).items() if callable(v) and not n.startswith("_")}
    missing = [n for n in sorted(public) if vars(RayCalls).get(n) is None]
    assert not missing


def test_an_example_answers_on_two_ray_replicas_as_in_process(tiny: Path):
    local, _ = _engine(tiny, None)
    try:
        expected = _complete(local, ["hello there", "a fox"])
    finally:
        asyncio.run(local.close())
    engine, replicas = _engine(tiny, "")
    try:
        pids = {ray.get(_actor(r).ready.remote())[2] for r in replicas}
        assert len(pids) == 2 and os.getpid() not in pids, "each replica's backend is its own process"
        got = _complete(engine, ["hello there", "a fox"])
        assert [r.batcher.stats.batches > 0 for r in replicas] == [True, True], "both replicas served"
        assert engine.pools_whole()
    finally:
        asyncio.run(engine.close())
    for replica in replicas:  # closing the engine killed its actors
        assert _dies(_actor(replica))
    assert [e.kind for e in expected] == ["return", "return"] and got == expected
    assert all(e.value for e in got)


def test_every_backend_call_reaches_the_actor_and_its_errors_come_back_as_raised(tiny: Path):
    engine = Engine("cpu", options=OPTIONS, ray="")
    (replica,) = engine.replicas[engine.load(str(tiny)).name]

    def use(calls: BackendCalls) -> tuple[Any, ...]:
        calls.adapter_create(7, 2, 2.0)  # the engine's id: the actor maps it onto a slot
        zero = calls.adapter_save(7)
        calls.adapter_zo(7, 0.5, np.array([11], np.int64), np.array([1.0], np.float32))
        moved = calls.adapter_save(7)
        calls.adapter_load(7, zero, 2.0)
        back = calls.adapter_save(7)
        calls.adapter_destroy(7)
        calls.copy_pages(CopyKind.DEVICE_TO_HOST, np.array([0], np.int32), np.array([0], np.int32))
        return calls.info(), zero, moved, back

    try:
        info, zero, moved, back = replica.worker.call(use)
        assert info.name == "cpu" and zero
        assert any(not np.array_equal(zero[k], moved[k]) for k in zero) and all(np.array_equal(zero[k], back[k]) for k in zero)
        with pytest.raises(BackendError, match="no adapter with id 7"):
            replica.worker.call(lambda calls: calls.adapter_save(7))  # the backend's own error, not Ray's wrapper
        with pytest.raises(RuntimeError, match="worker's thread"):
            replica.worker._calls.info()  # off the worker's thread, as for a local backend
    finally:
        asyncio.run(engine.close())


def test_an_actor_that_cannot_start_is_one_line(tiny: Path):
    from pie_core.models.registry import resolve_model

    source = resolve_model(str(tiny))
    with pytest.raises(BackendError) as caught:
        start_ray_replicas("no-such-backend", ["replica 0 of 'tiny'"], str(tiny), None, OPTIONS, source.spec)
    message = str(caught.value)
    assert "the Ray actor of replica 0 of 'tiny' failed to start" in message and "no-such-backend" in message, message
    assert "\n" not in message


def test_placement_follows_the_prompt_prefix_across_ray_replicas(tiny: Path):
    engine, (r0, r1) = _engine(tiny, "")
    model = r0.name

    async def main() -> tuple[int, int, int]:
        opts = ServerOptions(port=0, data_dir=Path(tempfile.mkdtemp(prefix="pie-srv-")), status_interval=0)
        server = PieServer(engine, opts, auth=Authenticator([], enabled=False), close_engine=False)
        await server.start()
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="none")
        ask: dict[str, Any] = {"model": model, "prompt": PROMPT, "max_tokens": 2, "temperature": 0}
        try:
            demand = demand_of(server, {**ask, "mode": "completion", "n": 1})
            assert demand is not None and len(demand.keys) >= 3
            r0.bound += 1  # the first request goes to replica 1 (less loaded)
            await client.completions.create(**ask)
            r0.bound -= 1
            assert (r0.pool.cache.cached_prefix(list(demand.keys)), r1.pool.cache.cached_prefix(list(demand.keys))) \
                == (0, len(demand.keys))
            r1.bound += 2  # replica 1 is now the busier one: its cached prefix still wins
            before = r1.pool.cache.hits
            await client.completions.create(**ask)
            r1.bound -= 2
            return r1.pool.cache.hits - before, len(r0.pool.cache), len(demand.keys)
        finally:
            await client.close()
            await server.close()
            await engine.close()

    hits, r0_cached, pages = asyncio.run(main())
    assert hits >= pages and r0_cached == 0
    assert engine.pools_whole()


def test_a_killed_actor_fails_only_its_replicas_inferlets(tiny: Path):
    engine, (r0, r1) = _engine(tiny, "")
    try:
        ray.kill(_actor(r1), no_restart=True)
        assert _dies(_actor(r1))
        first, second = _complete(engine, ["hello there", "a fox"])  # one on each replica
        assert first.kind == "return" and first.value
        assert second.kind == "error"
        message = str(second.value)
        assert "the Ray actor of replica 1 of" in message and "is gone" in message and "\n" not in message.strip(), message
        assert (r0.alive, r1.alive) == (True, False)
        r0.bound += 5  # a busy replica 0 would lose to a live replica 1: placement skips the dead one
        (third,) = _complete(engine, ["again"])
        r0.bound -= 5
        assert third.kind == "return" and third.value
        assert engine.pools_whole()
    finally:
        asyncio.run(engine.close())
    assert engine.pools_whole()


def test_pie_serve_ray_answers_the_openai_client(tiny: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]):
    monkeypatch.setenv("PIE_HOME", str(tiny.parent / "serve-home"))
    asked: dict[str, Any] = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0}
    answers: list[str] = []
    engines: list[Engine] = []

    async def ask_then_stop(self: PieServer) -> None:  # instead of waiting for a signal
        try:
            client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="none")
            reply = await client.completions.create(model=next(iter(self.engine.models)), **asked)
            answers.append(reply.choices[0].text)
            await client.close()
            engines.append(self.engine)
        finally:
            await self.close()

    monkeypatch.setattr(PieServer, "serve_until_signalled", ask_then_stop)
    code = pie_main(["serve", "--ray", "--replicas", "2", "--backend", "cpu", "--model", str(tiny), "--no-auth",
                     "--port", "0", "--isolation", "inprocess", "--status-interval", "0", "--kv-pages", "64"])
    err = capsys.readouterr().err
    assert code == 0 and len(answers) == 1, err
    assert "× 2 replicas on Ray" in err
    (engine,) = engines
    assert [type(r.worker._calls) for r in engine.replicas[next(iter(engine.models))]] == [RayCalls, RayCalls]
    assert ray.is_initialized(), "an engine that found Ray connected leaves it connected"

    local = Engine("cpu", options=BackendOptions(dtype="auto", kv_pages=64))  # the same request without Ray
    local.load(str(tiny))

    async def in_process() -> str:
        opts = ServerOptions(port=0, data_dir=Path(tempfile.mkdtemp(prefix="pie-srv-")), status_interval=0)
        server = PieServer(local, opts, auth=Authenticator([], enabled=False))
        await server.start()
        try:
            client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="none")
            reply = await client.completions.create(model=next(iter(local.models)), **asked)
            await client.close()
            return reply.choices[0].text
        finally:
            await server.close()

    assert answers == [asyncio.run(in_process())]


def test_pie_serve_ray_without_ray_installed_says_what_to_install(monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str], tmp_path: Path):
    monkeypatch.setenv("PIE_HOME", str(tmp_path))
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as it does where Ray is not installed
    code = pie_main(["serve", "--ray", "--dummy", "--no-auth", "--port", "0", "--isolation", "inprocess"])
    err = capsys.readouterr().err.strip()
    assert code != 0 and "pie serve --ray needs Ray: pip install 'pie-engine[ray]'" in err and "\n" not in err, err


@pytest.mark.parametrize(("flags", "key", "expected"), [
    ([], "off", None), (["--ray"], "off", ""), (["--ray-address", "ray://head:10001"], "off", "ray://head:10001"),
    ([], "on", ""), ([], "auto", "auto"),
])
def test_ray_comes_from_the_flags_else_engine_ray(flags: list[str], key: str, expected: str | None):
    import argparse

    import tomlkit

    from pie_core.cli import serve
    from pie_core.cli.backend_args import engine_options

    parser = argparse.ArgumentParser()
    serve.register(parser.add_subparsers())
    args = parser.parse_args(["serve", *flags])
    doc = tomlkit.parse(f'[engine]\nray = "{key}"\n')
    options = engine_options(args, doc)
    assert options.ray == expected
    assert options.engine_kwargs().get("ray") == expected


def test_a_cuda_replica_asks_ray_for_one_gpu_and_a_cpu_replica_for_one_cpu():
    import argparse

    import tomlkit

    from pie_core.cli import serve
    from pie_core.cli.backend_args import engine_options
    from pie_core.scaleout.ray_calls import actor_resources

    parser = argparse.ArgumentParser()
    serve.register(parser.add_subparsers())
    options = engine_options(parser.parse_args(["serve", "--ray", "--device", "cuda"]), tomlkit.parse(""))
    assert options.backend.device == "cuda"
    assert actor_resources(options.backend.device) == {"num_gpus": 1}
    assert actor_resources("cuda:1") == {"num_gpus": 1} and actor_resources("cpu") == {"num_cpus": 1}


def test_a_ray_address_where_no_cluster_answers_is_one_line(monkeypatch: pytest.MonkeyPatch):
    from pie_core.errors import InvalidInput
    from pie_core.scaleout.ray_cluster import connect

    def no_cluster(**_: Any) -> None:
        raise SystemExit(15)  # what ray.init does after ~40 s without an answer from the address

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", no_cluster)
    with pytest.raises(InvalidInput, match="cannot join the Ray cluster at 'head:6379'.*is it running"):
        connect("head:6379")
