"""Zeroth-order fine-tuning: an evolution strategy trains a LoRA adapter on a reward.

``zo.initialize`` gives the adapter fresh LoRA weights that change nothing yet. Each generation
then runs ``population`` candidates at once (``asyncio.gather``: their passes batch together),
each being the adapter's mean weights plus ``sigma`` times its own seed's noise (``zo_seed=s``).
A candidate's reward is 1.0 when its greedy reply names ``word``, and otherwise the probability
that it would reply with exactly ``word`` -- a smooth signal while no candidate says it yet.
``zo.update`` moves the mean toward the better half of the candidates and adapts sigma.

At the end the mean adapter (no seed) is scored the same way, and ``samples`` replies sampled
at temperature 1 from the base model and from the trained adapter count how often each names
the word. With the defaults the mean reward climbs from about 0.02 to 0.5-1.0 in 10 generations
and the trained adapter's greedy reply becomes "Mango" (about 70 s with the torch backend on two
CPU cores); a larger ``sigma`` learns faster but can wreck the model within a few generations.
"""

import asyncio
import math

from inferlet import Adapter, Context, Logprob, Model, Sampler, runtime, session, zo


async def reply(model: Model, prompt: str, sampler: Sampler, max_tokens: int,
                adapter: Adapter | None, seed: int = 0) -> str:
    """One reply (``seed`` 0: the adapter's mean weights, or the base model without an adapter)."""
    with Context(model) as ctx:
        ctx.user(prompt)
        g = ctx.generate(sampler, max_tokens=max_tokens, adapter=adapter, zo_seed=seed or None)
        return await g.collect_text()


async def probability(model: Model, prompt: str, word: list[int], adapter: Adapter | None, seed: int = 0) -> float:
    """The probability that the reply starts with the tokens ``word`` (one teacher-forced pass)."""
    with Context(model) as ctx:
        ctx.user(prompt)
        ctx.cue()
        first = len(ctx.buffer()) - 1  # the cue's last row predicts the reply's first token
        ctx.append(word[:-1])
        fwd = ctx.forward(flush=True).adapter(adapter)
        if seed:
            fwd.zo_seed(seed)
        handles = [fwd.probe(first + i, Logprob(t)) for i, t in enumerate(word)]
        out = await fwd.execute()
        return math.exp(sum(out.logprobs(h)[0] for h in handles))


async def reward(model: Model, input: dict, adapter: Adapter | None, seed: int = 0) -> tuple[float, str]:
    """The reward of one candidate and its greedy reply."""
    word = input["word"]
    tokens = model.tokenizer().encode(word[:1].upper() + word[1:])  # as a reply starts: "Mango"
    text, p = await asyncio.gather(
        reply(model, input["prompt"], Sampler.argmax(), input["max_tokens"], adapter, seed),
        probability(model, input["prompt"], tokens, adapter, seed),
    )
    return (1.0 if word.lower() in text.lower() else p), text


async def hit_rate(model: Model, input: dict, adapter: Adapter | None) -> float:
    """The share of ``samples`` replies sampled at temperature 1 that name the word."""
    n = input["samples"]
    texts = await asyncio.gather(*(
        reply(model, input["prompt"], Sampler.top_p(1.0, 1.0, seed=i + 1), input["max_tokens"], adapter)
        for i in range(n)
    ))
    return sum(input["word"].lower() in t.lower() for t in texts) / n


async def main(input: dict) -> dict:
    if not input["word"].strip():
        raise ValueError("word must be a non-empty word, e.g. --word mango")
    if input["seed"] < 0:
        raise ValueError(f"seed must be >= 0, got {input['seed']}")
    model = Model.load(runtime.models()[0])
    n = input["population"]
    base, base_text = await reward(model, input, None)
    session.send(f"base model: reward {base:.3f}, reply {base_text!r}\n")

    adapter = Adapter.create(model, "es-finetune")
    await zo.initialize(adapter, rank=input["rank"], alpha=input["alpha"], population_size=n,
                        mu_fraction=0.5, initial_sigma=input["sigma"])
    curve = []
    for gen in range(input["generations"]):
        seeds = [input["seed"] * 1_000_003 + gen * n + i + 1 for i in range(n)]  # nonzero, distinct
        results = await asyncio.gather(*(reward(model, input, adapter, s) for s in seeds))
        scores = [r for r, _ in results]
        curve.append(sum(scores) / n)
        best = max(range(n), key=scores.__getitem__)
        session.send(f"generation {gen + 1}: mean reward {curve[-1]:.3f}, best {scores[best]:.3f} "
                     f"({results[best][1]!r})\n")
        await zo.update(adapter, scores, seeds, input["max_sigma"])

    final, final_text = await reward(model, input, adapter)
    session.send(f"trained adapter: reward {final:.3f}, reply {final_text!r}\n")
    result = {"rewards": curve, "base": base, "final": final, "reply": final_text}
    if input["samples"] > 0:
        rates = await asyncio.gather(hit_rate(model, input, None), hit_rate(model, input, adapter))
        result["hit_rate"] = {"base": rates[0], "trained": rates[1]}
        session.send(f"sampled replies naming {input['word']!r}: base {rates[0]:.0%}, trained {rates[1]:.0%}\n")
    if input.get("save"):
        await adapter.save(input["save"])
        session.send(f"saved the adapter to {input['save']}\n")
    return result
