"""Probes on the default model agree with each other and with their definitions (to 1e-4)."""

import numpy as np
import pytest

from inferlet import Context, Distribution, Entropy, Logits, Logprob, Logprobs, Model, runtime

pytestmark = pytest.mark.model


def test_distribution_logprobs_and_entropy_match_the_logits(pie):
    async def main(_):
        model = Model.load(runtime.models()[0])
        with Context(model) as ctx:
            ctx.user("Name three prime numbers.")
            ctx.cue()
            tokens = ctx.buffer()
            fwd = ctx.forward().input(tokens)
            last = len(tokens) - 1
            h_logits = fwd.probe(last, Logits())
            h_dist = fwd.probe(last, Distribution(1.0, 0))
            h_top = fwd.probe(last, Distribution(0.7, 5))
            h_one = fwd.probe(last, Logprob(17))
            h_many = fwd.probe(last, Logprobs([17, 3, 100000]))
            h_ent = fwd.probe(last, Entropy())
            out = await fwd.execute()
            return (
                out.logits(h_logits).hex(),
                out.distribution(h_dist),
                out.distribution(h_top),
                out.logprobs(h_one),
                out.logprobs(h_many),
                out.entropy(h_ent),
                model.vocab_size,
            )

    raw, (ids, probs), (top_ids, top_probs), one, many, entropy, vocab = pie.value(main)
    logits = np.frombuffer(bytes.fromhex(raw), dtype=np.float32).astype(np.float64)
    assert logits.shape == (vocab,)
    logp = logits - logits.max()
    logp -= np.log(np.exp(logp).sum())
    p = np.exp(logp)

    full = np.zeros(vocab)
    full[ids] = probs
    assert abs(full.sum() - 1.0) < 1e-4
    assert np.abs(full - p).max() < 1e-4
    assert list(probs) == sorted(probs, reverse=True)

    tempered = np.exp((logits - logits.max()) / 0.7)
    tempered /= tempered.sum()
    assert top_ids == np.argsort(-tempered, kind="stable")[:5].tolist()
    assert np.abs(np.array(top_probs) - tempered[top_ids]).max() < 1e-4

    assert abs(one[0] - logp[17]) < 1e-4
    assert np.abs(np.array(many) - logp[[17, 3, 100000]]).max() < 1e-4
    assert abs(entropy - float(-(p * logp).sum())) < 1e-4
