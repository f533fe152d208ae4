"""Issue 35 at the engine: on the default backend (torch, ``dtype`` auto: quant fit) a request's
greedy tokens are the same alone, among 31 other generations, with the system drafter, and after
its context is suspended mid-generation (pages to the host pool, or dropped and replayed)."""

from __future__ import annotations

import asyncio

import pytest

from inferlet import Context, Model, Sampler, runtime
from pie_core.host import scheduling as host_scheduling
from pie_core.kv.host_pool import HostPool

pytestmark = pytest.mark.model

PROMPT = "Rewrite this sentence in the passive voice: the scheduler batches every forward pass."
OTHERS = ["Name a prime number.", "What is a mutex?", "Spell 'cache' backwards.", "Give a synonym for fast."]
TOKENS = 10


def _generate(prompt: str, tokens: int = TOKENS, split_at: int = 0, suspend: bool = False, **options):
    """Greedy tokens of ``prompt``; with ``split_at``, in two generations (the second, with
    ``auto_flush``, cues a new turn as the reference says), suspended between them if ``suspend``."""

    async def main(_):
        with Context(Model.load(runtime.models()[0])) as ctx:
            ctx.user(prompt)
            ctx.cue()
            out: list[int] = []
            if split_at:
                out += await ctx.generate(Sampler.argmax(), max_tokens=split_at, stop=[]).collect_tokens()
                if suspend:
                    ctx.suspend()
                    assert host_scheduling.is_suspended(ctx._handle())
            out += await ctx.generate(Sampler.argmax(), max_tokens=tokens - len(out), stop=[], **options).collect_tokens()
            return out

    return main


def test_a_request_s_tokens_are_the_same_alone_in_a_batch_of_32_and_speculated(torch_pie):
    alone = torch_pie.value(_generate(PROMPT))
    assert len(alone) == TOKENS
    mains = [_generate(f"{OTHERS[i % len(OTHERS)]} ({i})", tokens=2 + i % 5) for i in range(31)]
    together = torch_pie.values_together(mains[:15] + [_generate(PROMPT)] + mains[15:])
    assert together[15] == alone
    assert torch_pie.value(_generate(PROMPT, system_speculation=True)) == alone


@pytest.mark.parametrize("path", ["offload", "replay"])
def test_a_request_s_tokens_are_the_same_after_a_suspend(torch_pie, path, monkeypatch):
    state = torch_pie.engine.models[torch_pie.model]
    alone = torch_pie.value(_generate(PROMPT, split_at=5))
    if path == "replay":
        monkeypatch.setattr(state.market, "host", HostPool(0))
        state.pool.cache.clear()  # nothing to take back from the prefix cache: replay it all
    replays = state.market.replays
    assert torch_pie.value(_generate(PROMPT, split_at=5, suspend=True)) == alone
    assert (state.market.replays > replays) == (path == "replay")
