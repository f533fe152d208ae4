"""Best-of-N: sample N candidates, score each by its mean token log-probability, keep the best.

The prompt is prefilled once. Each candidate is sampled on a fork with its own seed; then it is
scored on another fork: the assistant cue and the candidate go into the context's buffer, and
one pass built over that buffer (``ctx.forward(flush=True)``) runs them with a ``Logprob`` probe
on each row that predicts a candidate token.
"""

import asyncio

from inferlet import Context, Logprob, Model, Sampler, chat, runtime


async def sample(prefix: Context, sampler: Sampler, max_tokens: int) -> list[int]:
    """One candidate's tokens. The generator leaves out the stop token that ends a reply; the
    chat format's end-of-turn token is put back here, so that a candidate's score counts how
    likely the model was to end its reply there."""
    with prefix.fork() as ctx:
        tokens = await ctx.generate(sampler, max_tokens=max_tokens).collect_tokens()
    ended = len(tokens) < max_tokens  # only a stop token ends it before max_tokens
    return tokens + chat.stop_tokens(prefix.model)[:1] if ended else tokens


async def mean_logprob(prefix: Context, tokens: list[int]) -> float:
    with prefix.fork() as ctx:
        ctx.cue()
        first = len(ctx.buffer()) - 1  # the cue's last row predicts tokens[0]
        ctx.append(tokens[:-1])
        fwd = ctx.forward(flush=True)
        handles = [fwd.probe(first + i, Logprob(t)) for i, t in enumerate(tokens)]
        out = await fwd.execute()
        logprobs = [out.logprobs(h)[0] for h in handles]
    return sum(logprobs) / len(logprobs)


async def main(input: dict) -> dict:
    model = Model.load(runtime.models()[0])
    stop = set(chat.stop_tokens(model))

    with Context(model) as prefix:
        prefix.user(input["prompt"])
        await prefix.flush()

        samplers = [
            Sampler.top_p(input["temperature"], input["top_p"], seed=input["seed"] + i)
            for i in range(input["n"])
        ]
        candidates = await asyncio.gather(*(sample(prefix, s, input["max_tokens"]) for s in samplers))
        scores = await asyncio.gather(*(mean_logprob(prefix, c) for c in candidates))

    tok = model.tokenizer()
    ranked = sorted(
        (
            {"text": tok.decode([t for t in c if t not in stop]), "score": s}
            for c, s in zip(candidates, scores)
        ),
        key=lambda r: r["score"],
        reverse=True,
    )
    return {"text": ranked[0]["text"], "score": ranked[0]["score"], "candidates": ranked}
