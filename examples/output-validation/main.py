"""Output validation: how likely is each candidate answer as the model's reply?

The question is prefilled once. Each candidate is scored on a fork: the assistant cue and the
candidate go into the context's buffer, and one pass built over that buffer
(``ctx.forward(flush=True)``) runs them with a ``Logprobs`` probe on each row that predicts a
candidate token. Candidates come back ranked, best first.
"""

import asyncio

from inferlet import Context, Logprobs, Model, runtime


async def score(prefix: Context, tokens: list[int]) -> list[float]:
    """Per-token log-probabilities of ``tokens`` as the start of the assistant's reply."""
    with prefix.fork() as ctx:
        ctx.cue()
        first = len(ctx.buffer()) - 1  # the cue's last row predicts tokens[0]
        ctx.append(tokens[:-1])
        fwd = ctx.forward(flush=True)
        # (A Logprobs probe can ask for several ids at one row; here each row needs one.)
        handles = [fwd.probe(first + i, Logprobs([t])) for i, t in enumerate(tokens)]
        out = await fwd.execute()
        return [out.logprobs(h)[0] for h in handles]


async def main(input: dict) -> dict:
    model = Model.load(runtime.models()[0])
    tok = model.tokenizer()
    answers = [c.strip() for c in input["candidates"].split(",") if c.strip()]
    if not answers:
        raise ValueError("candidates: give at least one comma-separated answer")

    with Context(model) as prefix:
        prefix.user(input["prompt"])
        await prefix.flush()
        per_token = await asyncio.gather(*(score(prefix, tok.encode(a)) for a in answers))

    ranked = []
    for answer, lps in zip(answers, per_token):
        total = sum(lps)
        ranked.append({"answer": answer, "logprob": total, "mean_logprob": total / len(lps)})
    key = "mean_logprob" if input["normalize"] else "logprob"
    ranked.sort(key=lambda r: r[key], reverse=True)
    return {"ranked": ranked}
