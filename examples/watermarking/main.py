"""Watermarking (Kirchenbauer et al., 2023) with a sampler written in the inferlet.

Each step drops the generator's built-in sampler, reads the top-k next-token distribution with a
``Distribution`` probe, adds ``delta`` to the logits of "green" tokens — a pseudo-random
``gamma`` fraction of the vocabulary, re-drawn from the previous token and a secret key — and
draws a token with a seeded RNG. A detector holding the key counts green tokens: unmarked text
is green about ``gamma`` of the time, watermarked text far more often.
"""

import math
import random

from inferlet import Context, Distribution, Model, Sampler, chat, runtime

_MASK = 2**64 - 1


def is_green(prev: int, token: int, key: int, gamma: float) -> bool:
    """Whether ``token`` is on the green list seeded by ``prev`` (a splitmix64 hash)."""
    x = (key * 0x9E3779B97F4A7C15 + prev * 0xBF58476D1CE4E5B9 + token) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    x ^= x >> 31
    return x / 2**64 < gamma


async def main(input: dict) -> dict:
    model = Model.load(runtime.models()[0])
    key, gamma, delta = input["key"], input["gamma"], input["delta"]
    rng = random.Random(input["seed"])
    stop = set(chat.stop_tokens(model))

    with Context(model) as ctx:
        ctx.user(input["prompt"])
        # The sampler is never used: every step clears it and picks the token here.
        g = ctx.generate(Sampler.argmax(), max_tokens=input["max_tokens"])
        prev = ctx.buffer()[-1]  # the last prompt token seeds the first green list
        tokens, green = [], []
        async for step in g:
            step.clear_sampler()
            h = step.probe(-1, Distribution(1.0, input["top_k"]))
            out = await step.execute()
            ids, probs = out.distribution(h)
            logits = [
                math.log(max(p, 1e-30)) + (delta if is_green(prev, t, key, gamma) else 0.0)
                for t, p in zip(ids, probs)
            ]
            top = max(logits)
            tok = rng.choices(ids, weights=[math.exp(l - top) for l in logits])[0]
            g.accept([tok])
            if tok not in stop:
                tokens.append(tok)
                green.append(is_green(prev, tok, key, gamma))
            prev = tok

    return {
        "text": model.tokenizer().decode(tokens),
        "tokens": tokens,
        "green_fraction": sum(green) / max(len(green), 1),
    }
