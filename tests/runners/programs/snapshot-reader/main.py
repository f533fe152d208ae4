"""Continues a snapshot another inferlet saved: ``open`` clones it (the snapshot stays),
``take`` removes it (the run that took it leaves nothing behind)."""

from inferlet import Context, Model, Sampler, runtime


async def main(input):
    model = Model.load(runtime.models()[0])
    found = (Context.open if input["mode"] == "open" else Context.take)(model, input["name"])
    if found is None:
        raise LookupError(f"no snapshot {input['name']!r}")
    with found as ctx:
        length, buffered = ctx.seq_len, ctx.buffer()
        tokens = await ctx.generate(Sampler.argmax(), max_tokens=3, stop=[]).collect_tokens()
    if input["mode"] == "take" and Context.open(model, input["name"]) is not None:
        raise AssertionError("take left the snapshot in place")
    return {"mode": input["mode"], "seq_len": length, "buffer": buffered, "tokens": tokens}
