"""`/metrics` and the status line count generated (sampled) and input tokens separately."""

from __future__ import annotations

import asyncio
import re
import urllib.request
from pathlib import Path

from inferlet import Context, Model, Sampler, runtime
from pie_core.client import connect
from pie_core.runtime.instance import run_main
from pie_core.server.metrics import RateMeter, status_line, token_totals

PROBE = Path(__file__).parent / "inferlets" / "probe"


def _metrics(url: str) -> dict[str, float]:
    """Every unlabelled or ``model``-labelled sample of ``/metrics``, summed over models."""
    with urllib.request.urlopen(url + "/metrics") as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.fullmatch(r'(pie_[a-z_]+)(?:\{model="[^"]*"\})? (\S+)', line)
        if m:
            out[m[1]] = out.get(m[1], 0.0) + float(m[2])
    return out


def test_metrics_count_generated_tokens_apart_from_input_tokens(served):
    async def scenario(s):
        before = await asyncio.to_thread(_metrics, s.http)
        meter = RateMeter()
        meter.sample(*token_totals(s.server), now=100.0)
        async with await connect(s.url, s.tokens["alice"]) as client:
            proc = await client.launch(await client.install(PROBE), {"mode": "generate", "max_tokens": 7})
            assert await proc.wait() == 7
        after = await asyncio.to_thread(_metrics, s.http)
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
