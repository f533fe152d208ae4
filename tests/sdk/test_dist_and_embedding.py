"""The readme's ``Sampler.dist()`` and ``Sampler.embedding()`` (and the ``Embedding`` probe) on
the dummy backend, and how the ``"embeddings"`` backend feature gates them."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from inferlet import Context, Embedding, Logits, Model, Sampler, runtime
from pie_core import brle
from pie_core.backend_kit.dummy import DummyBackend, _embedding_table, dummy_embeddings
from pie_core.errors import InvalidInput, Unsupported
from pie_core.hookspec import CONTRACT_VERSION, BackendInfo, hookimpl
from pie_core.plugins import bind_plugin
from pie_core.backend_kit.sampling import softmax


def _model() -> Model:
    return Model.load(runtime.models()[0])


def _logits(raw: str) -> np.ndarray:
    """A Logits probe's bytes, returned from the inferlet as hex."""
    return np.frombuffer(bytes.fromhex(raw), dtype=np.float32).astype(np.float64)


def test_dist_gives_the_full_tempered_distribution_and_a_seeded_draw_from_it(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            fwd = ctx.forward().input([5, 6, 7])
            h = fwd.sample([2], Sampler.dist(0.8, seed=42))
            h_logits = fwd.probe(2, Logits())
            same = fwd.sample([2], Sampler.multinomial(0.8, seed=42))
            out = await fwd.execute()
            return out.distribution(h), out.token(h), out.tokens_at(h), out.logits(h_logits).hex(), out.token(same)

    (ids, probs), token, tokens_at, raw, multinomial_token = dummy.value(main)
    p = softmax(_logits(raw), 0.8)
    assert len(ids) == len(p) == len(set(ids))  # the whole vocabulary, once each
    assert abs(sum(probs) - 1.0) < 1e-5
    assert probs == sorted(probs, reverse=True)
    assert np.abs(np.array(probs) - p[ids]).max() < 1e-6
    # the draw is an ordinary seeded multinomial draw from that same distribution
    assert token == multinomial_token and tokens_at == [token]


def test_dist_draws_repeat_for_a_seed_and_follow_the_logit_mask(dummy):
    async def main(_):
        model = _model()
        allowed = np.zeros(model.vocab_size, dtype=bool)
        allowed[[10, 20, 30, 40]] = True
        results = []
        for _ in range(2):
            with Context(model) as ctx:
                fwd = ctx.forward().input([1, 2]).mask(brle.encode(allowed))
                h = fwd.sample([1], Sampler.dist(1.0, seed=7))
                out = await fwd.execute()
                results.append((out.token(h), out.distribution(h)))
        return results

    (tok_a, (ids, probs)), (tok_b, dist_b) = dummy.value(main)
    assert tok_a == tok_b and (ids, probs) == dist_b
    nonzero = {i for i, q in zip(ids, probs) if q > 0}
    assert nonzero == {10, 20, 30, 40} and tok_a in nonzero
    assert abs(sum(probs) - 1.0) < 1e-5


def test_dist_at_temperature_zero_is_one_hot_at_the_argmax(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            fwd = ctx.forward().input([3, 4])
            h = fwd.sample([1], Sampler.dist(0.0))
            g = fwd.sample([1], Sampler.argmax())
            out = await fwd.execute()
            return out.distribution(h), out.token(h), out.token(g)

    (ids, probs), token, greedy = dummy.value(main)
    assert token == greedy == ids[0] and probs[0] == 1.0 and sum(probs) == 1.0


def test_generate_with_dist_reads_each_steps_distribution_without_shifting_probe_handles(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.user("hi")
            g = ctx.generate(Sampler.dist(1.0, seed=3), max_tokens=3, stop=[])
            steps = []
            async for step in g:
                h = step.probe(-1, Logits())
                out = await step.execute()
                ids, probs = out.distribution(out.auto_sampler)
                steps.append((out.tokens, out.token(out.auto_sampler), ids[:5], probs[:5], out.logits(h).hex()))
            return steps

    steps = dummy.value(main)
    assert len(steps) == 3
    for tokens, token, ids, probs, raw in steps:
        assert tokens == [token]
        p = softmax(_logits(raw))
        assert ids == np.argsort(-p, kind="stable")[:5].tolist()
        assert np.abs(np.array(probs) - p[ids]).max() < 1e-6


def test_embedding_sampler_and_probe_give_the_final_hidden_state(dummy):
    async def main(_):
        model = _model()
        with Context(model) as ctx:
            fwd = ctx.forward().input([11, 12, 13])
            h = fwd.sample([0, 2], Sampler.embedding())
            one = fwd.sample([1], Sampler.embedding())
            p = fwd.probe(2, Embedding())
            out = await fwd.execute()
            return (
                out.embeddings_at(h), out.embedding(one), out.embedding(p), out.embedding(h),
                out.token(one), out.tokens_at(one), out.distribution(one), out.logits(p),
                ctx.seq_len,
            )

    rows, single, probed, multi, token, tokens_at, dist, logits, seq_len = dummy.value(main)
    spec = dummy.engine.models[dummy.model].spec
    expected = dummy_embeddings(_embedding_table(spec.hidden_size), np.array([11, 12, 13]), np.arange(3))
    assert np.array_equal(np.array(rows), expected[[0, 2]])
    assert np.array_equal(np.array(single), expected[1])
    assert probed == rows[1] and len(probed) == spec.hidden_size
    # no token is drawn; a multi-index handle and the wrong accessors give nothing
    assert multi is None and token is None and tokens_at == [] and dist is None and logits is None
    assert seq_len == 3  # the pass still writes its tokens


def test_embedding_cannot_drive_a_generator(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.user("hi")
            before = ctx.buffer()
            with pytest.raises(InvalidInput, match="draws no token"):
                ctx.generate(Sampler.embedding())
            return before == ctx.buffer()

    assert dummy.value(main) is True  # refused before the cue was appended


def test_embeddings_need_the_backend_feature(dummy):
    loaded = dummy.engine.models[dummy.model]
    caps = loaded.caps
    loaded.caps = replace(caps, features=caps.features - {"embeddings"})

    async def main(_):
        with Context(_model()) as ctx:
            fwd = ctx.forward().input([1, 2])
            fwd.probe(1, Embedding())
            try:
                await fwd.execute()
            except Unsupported as exc:
                return str(exc), ctx.seq_len
            return "no error", ctx.seq_len

    try:
        message, seq_len = dummy.value(main)
    finally:
        loaded.caps = caps
    assert "does not support embedding probes (feature 'embeddings')" in message and seq_len == 0


class _BackendOfContract10(DummyBackend):
    """A backend written against contract 1.0, before embeddings existed."""

    PIE_CONTRACT_VERSION = "1.0"

    @hookimpl
    def pie_backend_info(self) -> BackendInfo:
        return BackendInfo(name="old", version="0", contract_version="1.0")


class _BackendOfContract20(_BackendOfContract10):
    PIE_CONTRACT_VERSION = "2.0"


def test_backends_of_an_older_minor_still_bind_and_another_major_is_refused():
    from pie_core.errors import ContractError

    assert CONTRACT_VERSION.startswith("1.") and CONTRACT_VERSION != "1.0"
    bind_plugin(_BackendOfContract10(), "old")
    with pytest.raises(ContractError, match="major versions must match"):
        bind_plugin(_BackendOfContract20(), "future")
