"""Tree of thought: grow a small tree of sampled "thoughts" with forks, score each path by the
sum of its tokens' log-probabilities, and return the best root-to-leaf path.

Every node is a context; its children are forks, so the question and shared ancestors are
computed once. The score comes for free while sampling: every step attaches a full-vocabulary
``Distribution`` probe to the sampled row and looks up the log-probability of the accepted token.
"""

import asyncio
import math

from inferlet import Context, Distribution, Model, Sampler, chat, runtime


async def think(ctx: Context, sampler: Sampler, max_tokens: int) -> tuple[list[int], float]:
    """Sample one thought on ``ctx`` (extending it); its tokens and summed log-probability."""
    g = ctx.generate(sampler, max_tokens=max_tokens, auto_flush=False, stop=chat.stop_tokens(ctx.model))
    h = g.probe_each_step(-1, Distribution(1.0, 0))
    tokens, logprob = [], 0.0
    async for step in g:
        out = await step.execute()
        ids, probs = out.distribution(h)
        for t in out.tokens:
            tokens.append(t)
            logprob += math.log(max(probs[ids.index(t)], 1e-30))
    return tokens, logprob


async def expand(node: dict, input: dict, level: int) -> list[dict]:
    """The leaves below ``node`` (a dict with a context, its path texts and its score)."""
    if level == input["depth"]:
        node["ctx"].release()
        return [node]
    children = []
    for i in range(input["breadth"]):
        child = node["ctx"].fork()
        child.append(child.model.tokenizer().encode(f"\nStep {level + 1}:"))
        seed = input["seed"] * 1000 + level * 100 + node["id"] * 10 + i
        children.append({"ctx": child, "seed": seed, "id": i})
    node["ctx"].release()

    async def grow(c: dict) -> list[dict]:
        sampler = Sampler.top_p(input["temperature"], 0.95, seed=c["seed"])
        tokens, lp = await think(c["ctx"], sampler, input["thought_tokens"])
        text = c["ctx"].model.tokenizer().decode(tokens)
        leaf = {"ctx": c["ctx"], "id": c["id"], "path": node["path"] + [text.strip()], "score": node["score"] + lp}
        return await expand(leaf, input, level + 1)

    return [leaf for leaves in await asyncio.gather(*(grow(c) for c in children)) for leaf in leaves]


async def main(input: dict) -> dict:
    model = Model.load(runtime.models()[0])
    root = Context(model)
    root.user(input["prompt"]).cue()
    await root.flush()
    leaves = await expand({"ctx": root, "id": 0, "path": [], "score": 0.0}, input, 0)
    leaves.sort(key=lambda l: l["score"], reverse=True)
    paths = [{"path": l["path"], "score": l["score"]} for l in leaves]
    return {"best": paths[0], "paths": paths}
