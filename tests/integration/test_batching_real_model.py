"""Batching does not change what the real model generates.

Greedy decoding is deterministic, so an inferlet must produce the same tokens whether its passes
run alone or merged with other inferlets' prefills and decodes. "Alone" for the sixteen
concurrent inferlets is checked with one teacher-forced pass each (prompt + generated tokens,
argmax at every position, nothing else in the batch): that is exactly what a solo greedy decode
computes, at a fraction of the cost of sixteen solo decode loops on a CPU.
"""

from __future__ import annotations

import asyncio
import string

import numpy as np
import pytest

from inferlet import Context, Model, Sampler, runtime
from pie_core.hookspec import hookimpl

pytestmark = pytest.mark.model

PROMPTS = [f"Q{i}: name an animal whose name starts with {c}. A:" for i, c in enumerate(string.ascii_uppercase[:16])]
LONG_TEXT = (
    "Paged attention stores the key and value cache in fixed-size pages, so a sequence can grow "
    "without copying and several sequences can share a common prefix. "
)


def _model() -> Model:
    return Model.load(runtime.models()[0])


async def _greedy(prompt: str, n: int, started: asyncio.Event | None = None, after: int = 0) -> list[int]:
    """Greedy-decode ``n`` tokens after raw ``prompt``; set ``started`` after ``after`` steps."""
    with Context(_model()) as ctx:
        ctx.fill(prompt)
        g = ctx.generate(Sampler.argmax(), max_tokens=n, stop=[], auto_flush=False)
        tokens: list[int] = []
        async for step in g:
            tokens += (await step.execute()).tokens
            if started is not None and len(tokens) == after:
                started.set()
        return tokens


class BatchRecorder:
    """A hook wrapper beside the backend: the input-token count of each request, per batch."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    @hookimpl(wrapper=True)
    def pie_backend_forward(self, batch):
        self.batches.append(np.diff(batch.qo_indptr).tolist())
        return (yield)


@pytest.fixture
def recorder(pie):
    worker = pie.engine.models[pie.model].worker
    rec = BatchRecorder()
    worker.register(rec)
    yield rec
    worker.unregister(rec)


def test_sixteen_concurrent_inferlets_are_batched_and_generate_their_solo_tokens(pie):
    stats = pie.engine.models[pie.model].batcher.stats
    before = stats.sizes.copy()
    together = pie.values_together([lambda _, p=p: _greedy(p, 16) for p in PROMPTS])
    sizes = stats.sizes - before
    assert max(sizes) > 1, f"no batch held more than one request: {dict(sizes)}"
    assert all(len(t) == 16 for t in together)

    async def teacher_forced(_):
        """Each prompt alone, with its generated tokens: argmax at every generated position."""
        out = []
        for prompt, tokens in zip(PROMPTS, together):
            with Context(_model()) as ctx:
                ids = ctx.model.tokenizer().encode(prompt)
                fwd = ctx.forward()
                fwd.input(ids + tokens[:-1])
                h = fwd.sample(list(range(len(ids) - 1, len(ids) + len(tokens) - 1)), Sampler.argmax())
                out.append((await fwd.execute()).tokens_at(h))
        return out

    alone = pie.value(teacher_forced)
    for i, (a, b) in enumerate(zip(alone, together)):
        assert a == b, f"inferlet {i} ({PROMPTS[i]!r}) generated {b} together but {a} alone"
    # and a real solo decode loop agrees with the concurrent run
    assert pie.value(lambda _: _greedy(PROMPTS[0], 16)) == together[0]


def test_prompt_spanning_many_pages_generates_the_same_tokens_beside_decoders(pie, recorder):
    async def long_solo(_):
        with Context(_model()) as ctx:
            ctx.fill(LONG_TEXT * 10)
            n, page = len(ctx.buffer()), ctx.page_size
            g = ctx.generate(Sampler.argmax(), max_tokens=6, stop=[], auto_flush=False)
            tokens = await g.collect_tokens()
            return n, page, ctx.seq_len, tokens

    n, page, seq_len, long_alone = pie.value(long_solo)
    assert 280 <= n <= 340 and n > 16 * page, f"{n} prompt tokens on {page}-token pages"
    assert seq_len == n + 5  # the last token waits in the buffer
    decoders = [PROMPTS[1], PROMPTS[2]]
    short_alone = [pie.value(lambda _, p=p: _greedy(p, 10)) for p in decoders]

    started = asyncio.Event()

    async def long_after_decoders_run(_):
        await started.wait()
        return await _greedy(LONG_TEXT * 10, 6)

    recorder.batches.clear()
    pie.engine.models[pie.model].pool.cache.clear()  # so the long prompt is computed, not adopted
    mixed = pie.values_together(
        [lambda _, p=p: _greedy(p, 10, started, after=2) for p in decoders] + [long_after_decoders_run]
    )
    assert mixed == [*short_alone, long_alone]
    assert any(max(b) == n and 1 in b for b in recorder.batches), (
        f"the long prefill never shared a batch with a decode step: {recorder.batches}"
    )
