"""A LoRA adapter from a PEFT folder, next to the base model.

``Adapter.create`` makes an (empty) adapter and ``await adapter.load(path)`` fills it from a
folder in the Hugging Face PEFT layout (``adapter_config.json`` + ``adapter_model.safetensors``),
as ``PeftModel.save_pretrained`` writes it. The prompt is then answered greedily twice at once,
once with ``adapter=`` and once without: the two contexts batch together, each row running its
own weights.

Without ``adapter`` a random stand-in is used (fresh zo weights moved once by one seed's noise)
so the example runs anywhere; ``python examples/lora/make_adapter.py DIR`` writes a real PEFT
folder to try instead.
"""

import asyncio

from inferlet import Adapter, Context, Model, Sampler, runtime, session, zo


async def answer(model: Model, prompt: str, max_tokens: int, adapter: Adapter | None) -> str:
    with Context(model) as ctx:
        ctx.user(prompt)
        return await ctx.generate(Sampler.argmax(), max_tokens=max_tokens, adapter=adapter).collect_text()


async def stand_in(model: Model) -> Adapter:
    """A random rank-8 adapter: B moves from zero by one zo seed's noise (the better of two)."""
    adapter = Adapter.create(model, "lora-example")
    zo.initialize(adapter, rank=8, alpha=16.0, population_size=2, mu_fraction=0.5, initial_sigma=0.02)
    await zo.update(adapter, [1.0, 0.0], [1, 2], max_sigma=0.02)
    return adapter


async def main(input: dict) -> dict:
    model = Model.load(runtime.models()[0])
    path = input.get("adapter")
    if path:
        adapter = Adapter.create(model, "lora-example")
        await adapter.load(path)
    else:
        session.send("no --adapter given: using a random stand-in; write a PEFT one with "
                     "'python examples/lora/make_adapter.py DIR' and pass --adapter DIR\n")
        adapter = await stand_in(model)
    with adapter:
        base, adapted = await asyncio.gather(
            answer(model, input["prompt"], input["max_tokens"], None),
            answer(model, input["prompt"], input["max_tokens"], adapter),
        )
    return {"adapter": path or "random stand-in", "base": base, "adapted": adapted, "same": base == adapted}
