"""Speculative drafts are bounded (issue 36, item 2): a pass verifies at most ``DRAFTS_PER_PASS``
drafts, fewer where the backend samples fewer rows per chunk, and more is refused before any
work, whether the inferlet goes through the SDK or straight to the wire."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from adapter_steps import isolation  # noqa: F401 - a fixture
from hostile import Served, write_program
from victim import Victim

from inferlet import Context, Model, Sampler, runtime
from inferlet.host.inference import DRAFTS_PER_PASS
from inferlet.host.types import SampleSpec
from pie_core.client import connect
from pie_core.engine.engine import Engine
from pie_core.host import inference as engine_inference
from pie_core.runtime.instance import run_main

HUGE_DRAFT = r'''
import time
from inferlet import Context, Model, Sampler, runtime, session
from inferlet.host import transport
from inferlet.host.types import SampleSpec

async def refused(call):
    start = time.monotonic()
    try:
        result = call()
        if hasattr(result, "__await__"):
            await result
        return ["accepted", time.monotonic() - start]
    except Exception as exc:
        return [f"{type(exc).__name__}: {exc}", time.monotonic() - start]

async def main(input):
    drafts = list(range(7, 10007))
    with Context(Model.load(runtime.models()[0])) as ctx:
        ctx.append([1, 2, 3])
        await ctx.flush()
        fwd = ctx.forward()
        fwd.input([4])
        sdk = await refused(lambda: fwd.draft(drafts))  # the SDK refuses at once
        tokens = [4] + drafts  # straight to the wire, as a guest that skips the SDK
        samples = [SampleSpec(i) for i in range(len(tokens))]
        args = (ctx._ctx, tokens, None, None, None, samples, [], len(drafts), None, 0, 0, [])
        session.send("attacking")
        wire = await refused(lambda: transport.installed().call_async(("inference", "forward"), args))
        fwd = ctx.forward()
        fwd.input([4]).draft([5, 6])  # a sensible pass still runs
        fwd.sample([0, 1, 2], Sampler.argmax())
        out = await fwd.execute()
        return {"sdk": sdk, "wire": wire, "kept": out.raw.drafts_kept}
'''


def test_a_pass_of_10000_drafts_is_refused_at_once_and_alice_is_still_served(hostile, isolation, tmp_path):
    async def scenario(s: Served) -> Any:
        async with Victim(s, tmp_path / "a") as alice, await connect(s.url, s.tokens["mallory"]) as mallory:
            proc = await mallory.launch(await mallory.install(write_program(tmp_path / "m", HUGE_DRAFT)), {})
            events = proc.events()
            assert (await events.__anext__()).value == "attacking"
            during = await alice.served_s()
            result = await asyncio.wait_for(proc.wait(), 30)
            return result, during, await alice.served_s()

    result, during, after = hostile(scenario, launcher=isolation)
    assert during < 0.5 and after < 0.5, (during, after)
    # The SDK refuses in draft(); on the wire the engine refuses by forward's declaration, as it
    # checks every call a sandboxed inferlet makes. That includes moving 10,001 sample records
    # (1.3 MB) each way; no pass starts.
    assert result["sdk"][0] == (f"InvalidInput: a pass verifies at most {DRAFTS_PER_PASS} drafts (DRAFTS_PER_PASS), "
                                "got 10000: draft fewer tokens per step"), result
    assert result["wire"][0] == ("InvalidInput: inference.forward(): drafts must be an int >= 0 and "
                                 f"< {DRAFTS_PER_PASS + 1}, got 10000"), result
    assert result["sdk"][1] < 0.5 and result["wire"][1] < 2.0, result
    assert 0 <= result["kept"] <= 2


def _in_process(engine: Engine, main: Any) -> Any:
    final = asyncio.run(run_main(engine, main, {}, lambda event: None))
    assert final.kind == "return", final.value
    assert engine.pools_whole()
    return final.value


async def _engine_forward(ctx: Context, tokens: list[int], drafts: int) -> str:
    """The engine's own forward, past every check the SDK and the wire make; the outcome."""
    samples = [SampleSpec(i) for i in range(len(tokens) - drafts - 1, len(tokens))]
    try:
        out = await engine_inference.forward(ctx._ctx, tokens, samples=samples, drafts=drafts)
        return f"kept {out.drafts_kept}"
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"


def test_the_engine_refuses_too_many_drafts_before_it_reads_a_token(security_engine):
    async def main(_: dict) -> list[str]:
        with Context(Model.load(runtime.models()[0])) as ctx:
            ctx.append([1, 2, 3])
            await ctx.flush()
            over = DRAFTS_PER_PASS + 1
            bad_ids = [-1] * (over + 1)  # token ids the engine would refuse, had it looked at them
            return [await _engine_forward(ctx, bad_ids, over),
                    await _engine_forward(ctx, [4] + [5] * DRAFTS_PER_PASS, DRAFTS_PER_PASS)]

    refused, full = _in_process(security_engine, main)
    assert refused.startswith(f"InvalidInput: a pass may verify at most {DRAFTS_PER_PASS} drafts"), refused
    assert full.startswith("kept "), full


@pytest.mark.parametrize("limit", ["max_sample_rows", "max_batch_tokens"])
def test_drafts_are_held_below_the_rows_and_tokens_the_backend_takes_per_chunk(security_engine, monkeypatch, limit):
    model = next(iter(security_engine.models.values()))
    monkeypatch.setattr(model, "caps", dataclasses.replace(model.caps, **{limit: 9}))

    async def main(_: dict) -> list[str]:
        with Context(Model.load(runtime.models()[0])) as ctx:
            ctx.append([1, 2, 3])
            await ctx.flush()
            return [await _engine_forward(ctx, [4] + [5] * 9, 9), await _engine_forward(ctx, [4] + [5] * 8, 8)]

    refused, fits = _in_process(security_engine, main)
    assert refused.startswith("InvalidInput: a pass may verify at most 8 drafts"), refused
    assert fits.startswith("kept "), fits


@pytest.mark.parametrize("count", [DRAFTS_PER_PASS + 1, 10_000])
def test_the_sdk_refuses_a_draft_over_the_bound_when_it_is_added(security_engine, count):
    async def main(_: dict) -> str:
        with Context(Model.load(runtime.models()[0])) as ctx:
            fwd = ctx.forward()
            fwd.input([1])
            try:
                fwd.draft(list(range(7, 7 + count)))
            except Exception as exc:  # noqa: BLE001
                return f"{type(exc).__name__}: {exc}"
            return "accepted"

    out = _in_process(security_engine, main)
    assert out == (f"InvalidInput: a pass verifies at most {DRAFTS_PER_PASS} drafts (DRAFTS_PER_PASS), got {count}: "
                   "draft fewer tokens per step"), out
