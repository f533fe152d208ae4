"""``pie serve`` with two replicas (dummy backend): an OpenAI request knows its prompt, so it is
placed on the replica whose prefix cache holds the prompt's pages, even when that replica is the
busier one; without a cached prefix the less loaded replica takes it. ``/metrics`` labels each
replica, and the users' quotas bound every replica's pool."""

from __future__ import annotations

import asyncio
import json
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from pie_core.engine.engine import Engine
from pie_core.hookspec import BackendOptions
from pie_core.server import Authenticator, PieServer, ServerOptions
from pie_core.server.metrics import prometheus_text
from pie_core.server.openai_placement import demand_of
from pie_core.server.openai_request import chat_args

PS = 4
PROMPT = "The quick brown fox jumps over the lazy dog while the cat sleeps by the warm fire tonight"


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as reply:
        return json.loads(reply.read())


def test_a_completion_goes_to_the_replica_holding_its_prompt_prefix():
    engine = Engine("dummy", options=BackendOptions(page_size=PS, kv_pages=64), replicas=2)
    model = engine.load(None).name
    r0, r1 = engine.replicas[model]

    async def main() -> tuple[int, int, int]:
        opts = ServerOptions(port=0, data_dir=Path(tempfile.mkdtemp(prefix="pie-srv-")), status_interval=0)
        server = PieServer(engine, opts, auth=Authenticator([], enabled=False), close_engine=False)
        await server.start()
        url = f"http://127.0.0.1:{server.port}/v1/completions"
        ask = {"model": model, "prompt": PROMPT, "max_tokens": 2, "temperature": 0}
        try:
            demand = demand_of(server, {**ask, "mode": "completion", "n": 1})
            assert demand is not None and len(demand.keys) >= 3
            r0.bound += 1  # the first request goes to replica 1 (less loaded)
            await asyncio.to_thread(_post, url, ask)
            r0.bound -= 1
            cached = r0.pool.cache.cached_prefix(list(demand.keys)), r1.pool.cache.cached_prefix(list(demand.keys))
            assert cached == (0, len(demand.keys)), "the router's keys are the ones the inferlet committed"
            r1.bound += 2  # replica 1 is now the busier one: its cached prefix still wins
            before = r1.pool.cache.hits
            await asyncio.to_thread(_post, url, ask)
            hits = r1.pool.cache.hits - before
            other = await asyncio.to_thread(_post, url, {**ask, "prompt": "Something else entirely, of no shared pages"})
            r1.bound -= 2
            assert other["choices"]
            text = prometheus_text(server)
            for replica in (0, 1):
                assert f'pie_batches_total{{model="{model}",replica="{replica}"}}' in text
            assert r1.pool.accounts.limit_of is not None and r1.pool.accounts.total_limit_of is not None, \
                "the users' page quotas bound every replica's pool, and all of them together"
            return hits, len(r0.pool.cache), len(demand.keys)
        finally:
            await server.close()
            await engine.close()

    hits, r0_cached, pages = asyncio.run(main())
    assert hits >= pages  # the second request reused the first one's prompt pages on replica 1
    assert r0_cached > 0  # the unrelated prompt went to the idle replica 0
    assert engine.pools_whole()


def test_a_chat_requests_router_keys_are_the_pages_its_inferlet_commits():
    engine = Engine("dummy", options=BackendOptions(page_size=PS, kv_pages=64), replicas=2)
    model = engine.load(None).name
    messages = [{"role": "system", "content": "You are a terse assistant for questions about foxes."},
                {"role": "user", "content": PROMPT}]

    async def main() -> tuple[int, list[int]]:
        opts = ServerOptions(port=0, data_dir=Path(tempfile.mkdtemp(prefix="pie-srv-")), status_interval=0)
        server = PieServer(engine, opts, auth=Authenticator([], enabled=False), close_engine=False)
        await server.start()
        body = {"model": model, "messages": messages, "max_tokens": 2, "temperature": 0}
        try:
            demand = demand_of(server, chat_args(server, body))
            assert demand is not None
            await asyncio.to_thread(_post, f"http://127.0.0.1:{server.port}/v1/chat/completions", body)
            return len(demand.keys), [r.pool.cache.cached_prefix(list(demand.keys)) for r in engine.replicas[model]]
        finally:
            await server.close()
            await engine.close()

    pages, cached = asyncio.run(main())
    assert pages >= 3 and sorted(cached) == [0, pages]  # all of them, on the replica it ran on
    assert engine.pools_whole()
