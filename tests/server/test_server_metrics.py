"""`/metrics` and the status line count generated (sampled) and input tokens separately."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.error
import urllib.request
from pathlib import Path

from inferlet import Context, Model, Sampler, runtime
from pie_core.client import connect
from pie_core.runtime.instance import run_main
from pie_core.server.latency import Histogram, RequestMetrics
from pie_core.server.metrics import RateMeter, status_line, token_totals

PROBE = Path(__file__).parent / "inferlets" / "probe"


def _scrape(s) -> str:
    """``/metrics``, read with a user's token (auth is on)."""
    request = urllib.request.Request(s.http + "/metrics", headers={"Authorization": f"Bearer {s.tokens['alice']}"})
    with urllib.request.urlopen(request) as resp:
        return resp.read().decode()


def _metrics(s) -> dict[str, float]:
    """Every unlabelled or ``model``-labelled sample of ``/metrics``, summed over models."""
    text = _scrape(s)
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.fullmatch(r'(pie_[a-z_]+)(?:\{model="[^"]*"\})? (\S+)', line)
        if m:
            out[m[1]] = out.get(m[1], 0.0) + float(m[2])
    return out


def test_metrics_count_generated_tokens_apart_from_input_tokens(served):
    async def scenario(s):
        before = await asyncio.to_thread(_metrics, s)
        meter = RateMeter()
        meter.sample(*token_totals(s.server), now=100.0)
        async with await connect(s.url, s.tokens["alice"]) as client:
            proc = await client.launch(await client.install(PROBE), {"mode": "generate", "max_tokens": 7})
            assert await proc.wait() == 7
        after = await asyncio.to_thread(_metrics, s)
        generated = after["pie_generated_tokens_total"] - before["pie_generated_tokens_total"]
        fed = after["pie_input_tokens_total"] - before["pie_input_tokens_total"]
        assert generated == 7  # one sampled token per step, argmax, no stop tokens
        # The prompt (chat template + "count") runs once, then the 6 tokens fed back; the 7th is never run.
        prompt = fed - 6
        assert prompt > 6
        meter.sample(*token_totals(s.server), now=102.0)
        assert meter.generated_rate == 3.5 and meter.input_rate == fed / 2
        assert "pie_tokens_per_second" in after and "pie_input_tokens_per_second" in after
        assert re.search(r"\d+ tok/s generated \(\d[\d,]* in\)", status_line(s.server))

    served(scenario)


def test_rate_meter_reports_rates_over_the_interval_between_samples():
    meter = RateMeter()
    meter.sample(10, 100, now=5.0)
    assert (meter.generated_rate, meter.input_rate) == (0.0, 0.0)  # one sample is no interval
    meter.sample(30, 400, now=9.0)
    assert (meter.generated_rate, meter.input_rate) == (5.0, 75.0)
    meter.sample(30, 400, now=9.0)  # no time passed: the rates stand
    assert (meter.generated_rate, meter.input_rate) == (5.0, 75.0)
    meter.sample(30, 400, now=11.0)
    assert (meter.generated_rate, meter.input_rate) == (0.0, 0.0)


def test_a_multinomial_row_counts_each_draw_as_a_generated_token(dummy_engine):
    async def main(_: dict) -> list[int]:
        with Context(Model.load(runtime.models()[0])) as ctx:
            fwd = ctx.forward().input([31, 32, 33])
            handle = fwd.sample([2], Sampler.multinomial(1.0, 6, seed=3))
            return (await fwd.execute()).tokens_at(handle)

    stats = dummy_engine.models[next(iter(dummy_engine.models))].batcher.stats
    sampled, fed = stats.sampled, stats.tokens
    final = asyncio.run(run_main(dummy_engine, main, {}, lambda event: None))
    assert final.kind == "return" and len(final.value) == 6
    assert (stats.sampled - sampled, stats.tokens - fed) == (6, 3)  # one row, six draws; three input tokens
    assert dummy_engine.pools_whole()


def _samples(s, prefix: str) -> dict[str, float]:
    """Every sample of ``/metrics`` whose name starts with ``prefix``, by its full name and labels."""
    text = _scrape(s)
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith(prefix)}


def _post(url: str, body: dict, token: str) -> int:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_metrics_have_latency_histograms_and_responses_by_route_and_status(served):
    async def scenario(s):
        model = next(iter(s.server.engine.models))
        label = f'model="{model}"'
        before = await asyncio.to_thread(_samples, s, "pie_")
        chat = s.http + "/v1/chat/completions"
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0}
        assert await asyncio.to_thread(_post, chat, {**body, "n": 2}, s.tokens["alice"]) == 200
        assert await asyncio.to_thread(_post, chat, {**body, "stream": True}, s.tokens["alice"]) == 200
        assert await asyncio.to_thread(_post, chat, {"messages": []}, s.tokens["alice"]) == 400
        assert await asyncio.to_thread(_post, s.http + "/nowhere", {}, s.tokens["alice"]) == 404
        after = await asyncio.to_thread(_samples, s, "pie_")

        def grew(name: str) -> float:
            return after.get(name, 0.0) - before.get(name, 0.0)

        assert grew(f"pie_request_ttft_seconds_count{{{label}}}") == 2  # one per request, not per choice
        assert grew(f"pie_request_e2e_seconds_count{{{label}}}") == 2
        # every token after a choice's first is one inter-token interval: 2 choices + 1 stream, 5 tokens each
        assert grew(f"pie_request_inter_token_seconds_count{{{label}}}") == 3 * 4
        assert grew('pie_http_requests_total{route="/v1/chat/completions",status="200"}') == 2
        assert grew('pie_http_requests_total{route="/v1/chat/completions",status="400"}') == 1
        assert grew('pie_http_requests_total{route="other",status="404"}') == 1
        for name in ("pie_request_ttft_seconds", "pie_request_inter_token_seconds", "pie_request_e2e_seconds"):
            buckets = [v for k, v in after.items() if k.startswith(f"{name}_bucket{{{label}")]
            assert buckets == sorted(buckets) and buckets[-1] == after[f"{name}_count{{{label}}}"]
            assert after[f"{name}_sum{{{label}}}"] > 0

    served(scenario)


def test_a_histogram_keeps_fixed_buckets_whatever_it_observes():
    hist = Histogram((0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 7.0, 1e9):
        hist.observe(value)
    hist.observe(0.5, 3)
    assert hist.counts == [2, 4, 2] and hist.count == 8
    lines = hist.lines("x", 'model="m"')
    assert lines[:3] == ['x_bucket{model="m",le="0.1"} 2', 'x_bucket{model="m",le="1"} 6', 'x_bucket{model="m",le="+Inf"} 8']
    metrics = RequestMetrics(["m"], ["/health"])
    for i in range(1000):
        metrics.response(f"/random/{i}", 404)
    metrics.response("/health/", 200)
    assert metrics.responses == {("other", 404): 1000, ("/health", 200): 1}
