"""A pass's speculative drafts stay in working pages until they are verified: the page that
holds the first draft is neither committed nor published to the prefix cache before the
verdict, wherever the drafts fall against page and chunk boundaries, so a rejected draft is
dropped and only kept tokens ever fill a committed page."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest

from pie_core.engine.engine import Engine
from pie_core.hookspec import BackendOptions
from pie_core.host import context as host_context
from pie_core.host.inference import forward
from pie_core.runtime.instance import run_main
from pie_core.values import SampleSpec

PS = 4
FORCED = 7  # every verifying row may only sample this token (a one-token logit mask)
OTHER = 9  # a draft that is not FORCED is rejected


def _only(token: int, vocab: int) -> bytes:
    bits = np.zeros(vocab, dtype=bool)
    bits[token] = True
    return np.packbits(bits, bitorder="little").tobytes()


def _run(lead: int, drafts: list[int], chunk: int | None = None) -> dict:
    """Feed ``lead`` tokens then ``drafts`` as drafts in one pass; what the context holds after."""
    engine = Engine("dummy", options=BackendOptions(page_size=PS, kv_pages=16))
    model = engine.load(None)
    if chunk is not None:
        model.caps = dataclasses.replace(model.caps, max_batch_tokens=chunk)
    vocab = model.spec.vocab_size

    async def main(_) -> dict:
        ctx = host_context.create(model.name)
        tokens = [100 + i for i in range(lead)] + drafts
        n = len(tokens)
        rows = range(n - len(drafts) - 1, n)
        out = await forward(ctx, tokens, samples=[SampleSpec(index=r, logit_mask=_only(FORCED, vocab)) for r in rows],
                            drafts=len(drafts))
        state = {"kept": out.drafts_kept, "length": ctx.kv.length, "tokens": list(ctx.kv.tokens),
                 "committed": ctx.kv.committed, "cached": len(model.pool.cache),
                 "working_tokens": host_context.working_page_token_count(ctx)}
        ctx.release()
        return state

    try:
        final = asyncio.run(run_main(engine, main, {}, lambda event: None))
    finally:
        asyncio.run(engine.close())
    assert final.kind == "return", final.value
    state = final.value
    assert engine.pools_whole(), "the pass left KV pages allocated"
    return state


@pytest.mark.parametrize("lead", [PS - 1, 2 * PS - 1], ids=["end-of-page-0", "end-of-page-1"])
def test_a_rejected_first_draft_on_the_last_slot_of_a_page_never_commits_that_page(lead):
    state = _run(lead, [OTHER, OTHER, OTHER])
    assert state["kept"] == 0
    assert state["length"] == lead and state["tokens"] == [100 + i for i in range(lead)]
    assert state["committed"] == lead // PS  # only pages full of the lead tokens
    assert state["cached"] == lead // PS  # and only those reached the prefix cache
    assert state["working_tokens"] == lead % PS


def test_a_kept_first_draft_that_fills_a_page_commits_it_once_verified():
    state = _run(PS - 1, [FORCED, OTHER, OTHER])
    assert state["kept"] == 1
    assert state["tokens"] == [100 + i for i in range(PS - 1)] + [FORCED]
    assert state["committed"] == 1 and state["cached"] == 1 and state["working_tokens"] == 0


def test_a_first_draft_at_the_start_of_a_page_leaves_the_full_pages_before_it_committed():
    state = _run(PS, [OTHER, OTHER])
    assert (state["kept"], state["length"], state["committed"], state["cached"]) == (0, PS, 1, 1)


@pytest.mark.parametrize("lead", [PS - 1, 2 * PS - 1], ids=["end-of-page-0", "end-of-page-1"])
def test_drafts_split_across_chunks_are_held_in_the_chunk_that_holds_the_first(lead):
    # chunks of PS tokens: the chunk ending at the page boundary holds the lead's tail and the first draft
    state = _run(lead, [OTHER, OTHER, OTHER], chunk=PS)
    assert state["kept"] == 0 and state["length"] == lead
    assert state["committed"] == lead // PS and state["cached"] == lead // PS
