"""Beam search with forks.

Every beam is a context holding its tokens' KV, plus one *pending* token that has not been run
yet. Each step runs every beam's pending token with a ``Distribution`` probe, so one pass both
extends the KV and yields the top-k continuations; the ``beam_width`` best extensions (by summed
log-probability) survive, each in a copy-on-write fork of its parent.
"""

import asyncio
import math

from inferlet import Context, Distribution, Model, chat, runtime


async def top_k(ctx: Context, pending: list[int], k: int) -> list[tuple[int, float]]:
    """Run ``pending`` on ``ctx``; the k most likely next tokens with their log-probabilities."""
    fwd = ctx.forward().input(pending)
    h = fwd.probe(len(pending) - 1, Distribution(1.0, k))
    ids, probs = (await fwd.execute()).distribution(h)
    return [(t, math.log(p)) for t, p in zip(ids, probs) if p > 0]


async def main(input: dict) -> dict:
    model = Model.load(runtime.models()[0])
    width, stop = input["beam_width"], set(chat.stop_tokens(model))

    # The root beam's pending tokens are the whole prompt: its KV is computed once, then shared.
    prompt = chat.user(model, input["prompt"]) + chat.cue(model)
    beams = [{"ctx": Context(model), "pending": prompt, "tokens": [], "score": 0.0}]
    finished = []

    for _ in range(input["max_tokens"]):
        options = await asyncio.gather(*(top_k(b["ctx"], b["pending"], width) for b in beams))
        candidates = [
            (b["score"] + lp, b, t) for b, opts in zip(beams, options) for t, lp in opts
        ]
        candidates.sort(key=lambda c: c[0], reverse=True)
        survivors = []
        for score, parent, t in candidates[: width - len(finished)]:
            beam = {"tokens": parent["tokens"] + [t], "score": score}
            if t in stop:
                finished.append(beam)  # a complete answer: no context needed any more
            else:
                survivors.append({**beam, "ctx": parent["ctx"].fork(), "pending": [t]})
        for b in beams:
            b["ctx"].release()
        beams = survivors
        if not beams:
            break

    for b in beams:
        b["ctx"].release()
    tok = model.tokenizer()
    ranked = sorted(finished + beams, key=lambda b: b["score"], reverse=True)
    results = [
        {"text": tok.decode([t for t in b["tokens"] if t not in stop]), "score": b["score"]}
        for b in ranked
    ]
    return {"text": results[0]["text"], "score": results[0]["score"], "beams": results}
