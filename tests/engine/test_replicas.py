"""Data-parallel replicas in one engine (dummy backend): placement compares free pages, then the
cached prefix, then load; contexts, forks and snapshots stay on their replica; messages cross
replicas; a replica whose backend fails fails only its own inferlets. Every test ends with
every replica's page pool whole."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pie_core.engine.engine import Engine
from pie_core.engine.placement import Demand, prompt_keys
from pie_core.hookspec import BackendOptions, hookimpl
from pie_core.host import context as host_context
from pie_core.host import messaging
from pie_core.host.binding import HostInstance, current
from pie_core.host.inference import forward
from pie_core.runtime.instance import run_main
from pie_core.values import SampleSpec

PS = 4
PAGES = 16
PROMPT = [100 + i for i in range(3 * PS)]  # three full pages


@pytest.fixture
def engine():
    engine = Engine("dummy", options=BackendOptions(page_size=PS, kv_pages=PAGES), replicas=2)
    engine.load(None)
    yield engine
    asyncio.run(engine.close())
    assert engine.pools_whole(), "a replica's pages were left allocated"


def _name(engine: Engine) -> str:
    return next(iter(engine.models))


async def _prefill(tokens: list[int]) -> tuple[int, Any]:
    """In an inferlet: open a context on its replica and run ``tokens`` (the prompt)."""
    ctx = host_context.create(_name(current().engine))
    await forward(ctx, tokens, samples=[SampleSpec(index=len(tokens) - 1)])
    return ctx.model.index, ctx


async def _inferlet(engine: Engine, main, demand: Demand | None = None) -> Any:
    inst = HostInstance(engine=engine, emit=lambda event: None, demand=demand)
    return await run_main(engine, main, {}, lambda event: None, instance=inst)


def test_one_replica_is_the_default_and_zero_is_refused():
    engine = Engine("dummy", options=BackendOptions(page_size=PS, kv_pages=PAGES))
    model = engine.load(None)
    assert engine.replicas[model.name] == [model] and engine.place(model.name) is model
    model.bound -= 1
    asyncio.run(engine.close())
    with pytest.raises(ValueError, match="replicas must be >= 1"):
        Engine("dummy", replicas=0)


def test_a_pool_that_covers_the_expected_pages_beats_prefix_and_load(engine):
    r0, r1 = engine.replicas[_name(engine)]
    held = r0.pool.alloc(PAGES - 2)  # replica 0: 2 free pages
    r1.bound += 5  # replica 1 is the busier one
    try:
        assert engine.place(r0.name, Demand(pages=3)) is r1
        assert engine.place(r0.name, Demand(pages=2)) is r0  # both cover: load decides
    finally:
        r0.pool.release(held)
        r0.bound -= 1
        r1.bound -= 6


def test_when_no_pool_covers_the_pages_the_one_with_most_free_wins(engine):
    r0, r1 = engine.replicas[_name(engine)]
    held = r0.pool.alloc(PAGES - 6), r1.pool.alloc(PAGES - 3)
    try:
        assert engine.place(r0.name, Demand(pages=PAGES)) is r0  # 6 free beats 3
    finally:
        r0.pool.release(held[0])
        r1.pool.release(held[1])
        r0.bound -= 1


def test_among_pools_with_room_the_longest_cached_prefix_wins_over_load(engine):
    r0, r1 = engine.replicas[_name(engine)]
    r0.bound += 1  # so the first inferlet is placed on replica 1

    async def scenario():
        async def first(_):
            index, ctx = await _prefill(PROMPT + [7])
            ctx.release()  # its full prompt pages stay in replica 1's prefix cache
            return index

        placed = await _inferlet(engine, first)
        r0.bound -= 1
        r1.bound += 3  # replica 1 is now the busier one; the prefix still wins

        async def second(_):
            index, ctx = await _prefill(PROMPT + [8])
            ctx.release()
            return index, ctx.model.pool.cache.hits

        again = await _inferlet(engine, second, Demand(pages=5, keys=prompt_keys(PROMPT + [8], PS)))
        r1.bound -= 3
        return placed.value, again.value

    (first, (second, hits)) = asyncio.run(scenario())
    assert first == 1 and second == 1 and hits == 3


def test_launched_inferlets_spread_over_the_replicas_by_load(engine):
    async def scenario():
        async def main(_):
            index, ctx = await _prefill([1, 2, 3, 4, 5])
            await asyncio.sleep(0.05)  # still running while the others are placed
            ctx.release()
            return index

        finals = await asyncio.gather(*(_inferlet(engine, main) for _ in range(4)))
        return sorted(f.value for f in finals)

    assert asyncio.run(scenario()) == [0, 0, 1, 1]


def test_a_page_quota_bounds_a_user_on_all_replicas_together(engine):
    """A quota of N pages is N pages with any number of replicas (the server sets
    ``total_limit_of``); each pool still has its own bound."""
    from pie_core.errors import OutOfPages
    from pie_core.kv.context import KvContext

    r0, r1 = engine.replicas[_name(engine)]
    for r in (r0, r1):
        r.pool.accounts.limit_of = lambda user: 6
        r.pool.accounts.total_limit_of = lambda user: 8
    a = KvContext(r0.pool, r0.pool.accounts.of("mallory"))
    b = KvContext(r1.pool, r1.pool.accounts.of("mallory"))
    other = KvContext(r1.pool, r1.pool.accounts.of("alice"))
    try:
        a.reserve(5)
        with pytest.raises(OutOfPages, match="holds 5 of its 8 KV pages across the model's 2 replicas"):
            b.reserve(4)
        assert r1.pool.accounts.held_by("mallory") == 5 and r1.pool.accounts.of("mallory").held == 0
        b.reserve(3)
        with pytest.raises(OutOfPages, match="holds 5 of its 6 KV pages and needs 2 more"):
            a.reserve(2)
        other.reserve(6)  # another user's pages do not count against mallory's
    finally:
        for ctx in (a, b, other):
            ctx.release()
    assert r0.pool.accounts.held_by("mallory") == 0


def test_forks_and_snapshots_stay_on_their_replica(engine):
    r0, r1 = engine.replicas[_name(engine)]
    r0.bound += 1

    async def scenario():
        async def save(_):
            index, ctx = await _prefill(PROMPT + [7])
            child = host_context.fork(ctx)
            host_context.save(ctx, "snap", [], None)
            out = index, child.model.index, child.kv.pool is ctx.kv.pool
            child.release()
            ctx.release()
            return out

        saved = await _inferlet(engine, save)
        r0.bound -= 1
        r1.bound += 1  # the next inferlet is placed on replica 0

        async def reopen(_):
            own = host_context.create(_name(current().engine))
            opened = host_context.open_snapshot(_name(current().engine), "snap")
            assert opened is not None
            ctx, _, _ = opened
            out = own.model.index, ctx.model.index
            ctx.release()
            own.release()
            host_context.delete_snapshot(_name(current().engine), "snap")
            return out

        back = await _inferlet(engine, reopen)
        r1.bound -= 1
        return saved.value, back.value

    saved, back = asyncio.run(scenario())
    assert saved == (1, 1, True)
    assert back == (0, 1)  # the inferlet runs on replica 0, its snapshot's context on replica 1


def test_messages_cross_replicas(engine):
    async def scenario():
        async def receiver(_):
            index, ctx = await _prefill([1, 2, 3])
            ctx.release()
            return index, await asyncio.wait_for(messaging.pull("topic"), 10)

        async def sender(_):
            index, ctx = await _prefill([4, 5, 6])
            ctx.release()
            messaging.push("topic", f"hello from {index}")
            return index

        got, sent = await asyncio.gather(_inferlet(engine, receiver), _inferlet(engine, sender))
        return got.value, sent.value

    (got_on, text), sent_on = asyncio.run(scenario())
    assert {got_on, sent_on} == {0, 1}
    assert text == f"hello from {sent_on}"


class _Broken:
    """A hook wrapper that makes one replica's backend fail every batch."""

    def __init__(self) -> None:
        self.calls = 0

    @hookimpl(tryfirst=True)
    def pie_backend_forward(self, batch: Any) -> Any:
        self.calls += 1
        raise RuntimeError("device lost")


def test_a_replica_whose_backend_dies_fails_only_its_own_inferlets(engine):
    r0, r1 = engine.replicas[_name(engine)]
    broken = _Broken()
    r1.worker.register(broken)

    async def scenario():
        async def main(_):
            index, ctx = await _prefill([1, 2, 3, 4, 5])
            await asyncio.sleep(0.05)
            ctx.release()
            return index

        async def opened_before(_):  # its context is on replica 1 before the replica dies
            ctx = host_context.create(_name(current().engine))
            await died.wait()
            try:
                await forward(ctx, [1, 2], samples=[SampleSpec(index=1)])
            finally:
                ctx.release()

        died = asyncio.Event()
        r0.bound += 1
        early = asyncio.ensure_future(_inferlet(engine, opened_before))
        await asyncio.sleep(0.01)
        r0.bound -= 1

        r1.bound -= 1  # the early inferlet does not count as load: the four below split 2 and 2
        first = await asyncio.gather(*(_inferlet(engine, main) for _ in range(4)))
        r1.bound += 1
        died.set()
        later = await asyncio.gather(*(_inferlet(engine, main) for _ in range(3)))
        return first, later, await early

    first, later, early = asyncio.run(scenario())
    kinds = sorted((f.kind, f.value if f.kind == "return" else "device lost" in f.value) for f in first)
    assert kinds == [("error", True), ("error", True), ("return", 0), ("return", 0)]
    assert not r1.alive and r0.alive
    assert [(f.kind, f.value) for f in later] == [("return", 0)] * 3  # the engine keeps serving
    assert early.kind == "error" and "died" in early.value  # failed in the host, not on the backend
    assert broken.calls == 1  # one batch reached the dead backend: the one that failed
    assert r0.bound == r1.bound == 0


def test_a_bare_cuda_device_is_spread_over_the_replicas():
    from pie_core.engine.engine import replica_device

    assert [replica_device("cuda", i, 3) for i in range(3)] == ["cuda:0", "cuda:1", "cuda:2"]
    assert replica_device("cuda", 0, 1) == "cuda" and replica_device("cpu", 1, 2) == "cpu"
    assert replica_device("cuda:1", 1, 2) == "cuda:1"


def test_load_takes_its_own_replica_count():
    engine = Engine("dummy", options=BackendOptions(page_size=PS, kv_pages=PAGES))
    model = engine.load(None, replicas=3)
    assert [r.index for r in engine.replicas[model.name]] == [0, 1, 2]
    assert len({id(r.pool) for r in engine.replicas[model.name]}) == 3
    asyncio.run(engine.close())
    assert engine.pools_whole()
