"""Prefix sharing on the real model: a second inferlet with the same prompt computes only its
tail, holds the prompt's pages once, and gets the same logits and continuation."""

import numpy as np
import pytest

from inferlet import Context, Model, Sampler, runtime
from inferlet.probes import Logits

pytestmark = pytest.mark.model

PROMPT = "List three reasons why content-addressed KV pages make prompt caching free. " * 4


async def prompt_logits_and_reply(_):
    model = Model.load(runtime.models()[0])
    with Context(model) as ctx:
        ctx.user(PROMPT)
        ctx.cue()
        tokens = ctx.buffer()
        ctx._buffer = []  # run the prompt as one explicit pass with a probe on its last row
        fwd = ctx.forward().input(tokens)
        h = fwd.probe(len(tokens) - 1, Logits())
        first = fwd.sample([len(tokens) - 1], Sampler.argmax())
        out = await fwd.execute()
        logits = np.frombuffer(out.logits(h), dtype=np.float32)
        pages = ctx.inner().committed_page_count()
        ctx.append([out.token(first)])
        rest = await ctx.generate(Sampler.argmax(), max_tokens=7, stop=[], auto_flush=False).collect_tokens()
        return len(tokens), pages, logits.tolist(), [out.token(first), *rest]


def test_a_repeated_prompt_runs_only_its_tail_and_matches(pie):
    loaded = pie.engine.models[pie.model]
    loaded.pool.cache.clear()
    stats = loaded.batcher.stats
    before = stats.tokens
    n, pages, cold_logits, cold_reply = pie.value(prompt_logits_and_reply)
    cold_tokens = stats.tokens - before
    before = stats.tokens
    _, _, warm_logits, warm_reply = pie.value(prompt_logits_and_reply)
    warm_tokens = stats.tokens - before

    ps = loaded.pool.page_size
    assert n > 2 * ps and pages >= 2
    # the warm run computed everything except the prompt's full pages
    assert cold_tokens - warm_tokens == (n // ps) * ps
    np.testing.assert_allclose(warm_logits, cold_logits, rtol=1e-4, atol=1e-4)
    assert warm_reply == cold_reply
