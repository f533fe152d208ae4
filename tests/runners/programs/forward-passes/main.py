"""Explicit passes: ``ctx.forward()`` and ``forward(flush=True)``, ``input``/``input_at``,
``attention_mask``, ``mask`` and ``sample(..., mask=)`` (BRLE and packed), every probe
(Logits decoded with ``array``, Distribution, Logprob(s), Entropy, Embedding), ``Sampler.dist``
and ``Sampler.embedding`` handles, and each Output accessor (None for a handle of another kind)."""

from array import array

from inferlet import (Context, Distribution, Embedding, Entropy, Grammar, Logits, Logprob, Logprobs, Matcher, Model,
                      Output, Sampler, runtime)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def r(x):
    """Six significant digits: the same float32 value reads the same in every runner."""
    return float(f"{x:.6g}")


async def main(input):
    model = Model.load(runtime.models()[0])
    vocab = model.vocab_size
    out = {}
    with Context(model) as ctx:
        prompt = model.tokenizer().encode("The quick brown fox jumps")
        fwd = ctx.forward()
        check(fwd.start_position() == 0 and fwd.page_size() == ctx.page_size, "a pass starts at seq_len")
        fwd.input(prompt)
        last = len(prompt) - 1
        greedy = fwd.sample([last], Sampler.argmax())
        multi = fwd.sample([last], Sampler.multinomial(1.0, 3, seed=5))
        every = fwd.sample(list(range(len(prompt))), Sampler.top_k(0.7, 5, seed=6))
        logits = fwd.probe(last, Logits())
        dist = fwd.probe(last, Distribution(1.0, 4))
        lp = fwd.probe(last, Logprob(100))
        lps = fwd.probe(index=last, probe=Logprobs([100, 200, 300]))
        ent = fwd.probe(last, Entropy())
        emb = fwd.probe(last, Embedding())
        full = fwd.sample([last], Sampler.dist(0.8, seed=7))
        hidden = fwd.sample([0, last], Sampler.embedding())
        o = await fwd.execute()
        check(isinstance(o, Output) and o.tokens == [] and o.auto_sampler is None, "a raw pass accepts nothing")
        check(ctx.seq_len == len(prompt), "the pass commits its inputs")
        values = array("f")
        values.frombytes(o.logits(logits))
        check(len(values) == vocab, "Logits are vocab_size float32 values")
        best = max(range(vocab), key=values.__getitem__)
        check(best == o.token(greedy), "argmax is the logits' maximum")
        ids, probs = o.distribution(dist)
        full_ids, full_probs = o.distribution(full)
        check(len(full_ids) == vocab and abs(sum(full_probs) - 1.0) < 1e-3, "Sampler.dist reads the whole distribution")
        embedding = o.embedding(emb)
        out["first_pass"] = {
            "greedy": o.token(greedy), "multi": o.tokens_at(multi), "multi_token": o.token(multi),
            "every": o.tokens_at(every), "logits_best": best, "logits_head": [r(v) for v in values[:3]],
            "distribution": [ids, [r(p) for p in probs]], "logprob": [r(v) for v in o.logprobs(lp)],
            "logprobs": [r(v) for v in o.logprobs(lps)], "entropy": r(o.entropy(ent)),
            "embedding": [len(embedding), [r(v) for v in embedding[:3]]],
            "dist_sampler": [o.token(full), full_ids[:3], [r(p) for p in full_probs[:3]]],
            "embedding_sampler": [o.token(hidden), [len(e) for e in o.embeddings_at(hidden)],
                                  [r(v) for v in o.embeddings_at(hidden)[1][:3]] == [r(v) for v in embedding[:3]]],
            "wrong_kind": [o.logits(dist), o.distribution(logits), o.logprobs(ent), o.entropy(lp), o.embedding(lp),
                           o.token(every), o.tokens_at(logits), o.embeddings_at(greedy)],
            "raw": [len(o.raw.tokens), len(o.raw.probes), o.raw.drafts_kept],
        }

        fwd = ctx.forward()
        check(fwd.start_position() == len(prompt), "the next pass starts after the first")
        fwd.input_at([11, 12], [len(prompt), len(prompt) + 1])
        h = fwd.sample([1], Sampler.argmax())
        o = await fwd.execute()
        out["input_at"] = [o.token(h), ctx.seq_len]

        kv = ctx.seq_len  # attend to the first token and yourself only
        fwd = ctx.forward()
        fwd.input([21, 22])
        fwd.attention_mask([[0, 1, kv - 1, 1, 1], [0, 1, kv, 1]])
        h = fwd.sample([0, 1], Sampler.argmax())
        o = await fwd.execute()
        out["attention_mask"] = [o.tokens_at(h), ctx.seq_len]

        fwd = ctx.forward()
        fwd.input([31, 32])
        fwd.mask([1000, 10, vocab - 1010])
        h1 = fwd.sample([0], Sampler.argmax())
        matcher = Matcher(Grammar.from_regex("(hello|world)"), model.tokenizer())
        packed = matcher.packed_mask()
        h2 = fwd.sample([1], Sampler.argmax(), mask=packed)
        h3 = fwd.sample([1], Sampler.argmax(), mask=[2000, 3, vocab - 2003])
        o = await fwd.execute()
        check(1000 <= o.token(h1) < 1010 and 2000 <= o.token(h3) < 2003, "the masks hold")
        check(matcher.try_accept(o.token(h2)), "the packed mask allows only the grammar's tokens")
        out["masks"] = [o.token(h1), o.token(h2), o.token(h3), len(packed)]

    with Context(model) as ctx:  # probes over the buffered prompt while flushing it
        ctx.user("Probe the prompt.")
        buffered = ctx.buffer()
        fwd = ctx.forward(flush=True)
        ent = [fwd.probe(i, Entropy()) for i in range(len(buffered))]
        h = fwd.sample([len(buffered) - 1], Sampler.argmax())
        o = await fwd.execute()
        check(ctx.buffer() == [] and ctx.seq_len == len(buffered), "forward(flush=True) runs the buffer")
        out["flush_pass"] = [o.token(h), [r(o.entropy(e)) for e in ent[:3]]]
        ctx.append([1, 2])
        stale = ctx.forward(flush=True)
        await ctx.flush()
        try:
            await stale.execute()
        except Exception as exc:  # noqa: BLE001
            out["stale_flush_pass"] = [type(exc).__name__, str(exc)]
    for bad in (lambda: Distribution(0.0, 1).spec(0), lambda: Logprob(), lambda: Logprob(1, token_id=2),
                lambda: Sampler.top_k(0.5, 0), lambda: Sampler.top_p(0.5, 1.5), lambda: Sampler(None, draws=0),
                lambda: Context(model).forward().input_at([1, 2], [0])):
        try:
            bad()
            out.setdefault("refused", []).append(None)
        except Exception as exc:  # noqa: BLE001
            out.setdefault("refused", []).append([type(exc).__name__, str(exc)])
    return out
