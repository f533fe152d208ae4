"""Driving a generator step by step: ``async for step in g`` with ``await step.execute()``,
the Output of a step, a step whose sampler is cleared and whose token is picked by hand and
registered with ``g.accept``, per-step probes (``g.probe_each_step``, ``step.probe``), decoded
event streams (``decode=True``, with ``reasoning`` and ``tool_use``), and ``horizon``."""

from inferlet import (Context, Decoder, Distribution, Entropy, Event, EventStream, Forward, ForwardPass, Generator,
                      GenStep, Logprob, Model, Sampler, TokenStream, chat, reasoning, runtime)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def r(x):
    """Six significant digits: the same float32 value reads the same in every runner."""
    return float(f"{x:.6g}")


def prompt(model):
    ctx = Context(model)
    ctx.user("Tell me a story.")
    return ctx


async def main(input):
    model = Model.load(runtime.models()[0])
    out = {}
    with prompt(model) as ctx:
        reference = await ctx.generate(Sampler.argmax(), max_tokens=4, stop=[]).collect_tokens()
    out["reference"] = reference

    with prompt(model) as ctx:
        g = ctx.generate(Sampler.argmax(), max_tokens=4, stop=[], horizon=2)
        entropy = g.probe_each_step(-1, Entropy())
        steps = []
        async for step in g:
            check(isinstance(step, GenStep), "async for yields GenSteps")
            top = step.probe(-1, Distribution(1.0, 3))
            o = await step.execute()
            ids, probs = o.distribution(top)
            check(o.token(o.auto_sampler) == o.tokens[0] == ids[0], "argmax is the distribution's top id")
            steps.append({"tokens": o.tokens, "entropy": r(o.entropy(entropy)), "top": ids,
                          "probs": [r(p) for p in probs], "raw_tokens": [list(t) for t in o.raw.tokens],
                          "wrong_kind": [o.logits(entropy), o.distribution(entropy), o.embedding(top)]})
        check([s["tokens"][0] for s in steps] == reference, "stepping gives the collector's tokens")
        check(g.is_done and g.tokens_generated == 4, "max_tokens ends the loop")
        try:
            await step.execute()
            out["twice"] = None
        except Exception as exc:  # noqa: BLE001
            out["twice"] = [type(exc).__name__, str(exc)]
        out["steps"] = steps

    with prompt(model) as ctx:  # pick the second most likely token by hand every step
        g = ctx.generate(Sampler.argmax(), max_tokens=3, stop=[])
        picked, returned = [], []
        async for step in g:
            step.clear_sampler()
            h = step.probe(-1, Distribution(1.0, 2))
            o = await step.execute()
            check(o.tokens == [] and o.auto_sampler is None, "a cleared step samples nothing")
            ids, _ = o.distribution(h)
            picked.append(ids[1])
            returned.append(g.accept([ids[1]]))
        out["accepted"] = [picked, returned, g.tokens_generated, ctx.buffer()]

    with prompt(model) as ctx:  # logprob of the reference token at every step
        g = ctx.generate(Sampler.argmax(), max_tokens=3, stop=[])
        lp = g.probe_each_step(-1, Logprob(reference[0]))
        first = await (await g.__anext__()).execute()
        out["logprob_first"] = [r(v) for v in first.logprobs(lp)]
        out["rest"] = await g.collect_tokens()

    with prompt(model) as ctx:
        stream = ctx.generate(Sampler.argmax(), decode=True, max_tokens=4, stop=[])
        check(isinstance(stream, EventStream) and stream.generator.tokens_generated == 0, "decode=True is an EventStream")
        events = [[type(e).__name__, e.text] async for e in stream]
        check(events[-1][0] == "Done" and events[-1][1] == "".join(t for k, t in events[:-1] if k == "Text"),
              "Done carries the whole text")
        out["events"] = events
    with prompt(model) as ctx:
        events = [type(e).__name__ async for e in ctx.generate(Sampler.argmax(), decode=True, reasoning=True,
                                                               tool_use=True, max_tokens=4, stop=[])]
        out["events_reasoning_tools"] = events
    with prompt(model) as ctx:
        out["stream_text"] = await ctx.generate(Sampler.argmax(), decode=True, max_tokens=3, stop=[]).text()
    with prompt(model) as ctx:
        out["stream_tokens"] = await ctx.generate(Sampler.argmax(), decode=True, max_tokens=3, stop=[]).tokens()
    with prompt(model) as ctx:  # a stop token ends the stream with Done
        stream = ctx.generate(Sampler.argmax(), decode=True, max_tokens=5, stop=[reference[2]])
        events = [e async for e in stream]
        check(isinstance(events[-1], Event.Done), "the stream ends with Done")
        out["stopped_stream"] = [[type(e).__name__, e.text] for e in events]
    check(ForwardPass is Forward and TokenStream is Generator, "the readme's names are aliases")
    tk = model.tokenizer()
    stop = chat.stop_tokens(model)[0]
    dec = chat.Decoder(model)
    fed = [dec.feed(tk.encode("Hello")), dec.feed(tk.encode(" wörld")), dec.feed([151644]), dec.feed([stop])]
    out["chat_decoder"] = [[type(e).__name__, getattr(e, "text", getattr(e, "token", None))] for e in fed]
    start, end = tk.encode("<")[0], tk.encode(">")[0]
    think = reasoning.Decoder(model, markers=(start, end))
    fed = [think.feed([start]), think.feed(tk.encode("hmm, ok")), think.feed([end]), think.feed(tk.encode("after"))]
    out["reasoning_decoder"] = [[type(e).__name__, getattr(e, "text", None)] for e in fed]
    out["reasoning_markers"] = [reasoning.Decoder(model).markers, think.markers, think.inside, think.text()]
    events = Decoder(model, reasoning=True, tool_use=True)
    out["event_decoder"] = [[type(e).__name__, e.text] for e in events.feed(tk.encode("Hi there")) + events.finish()]
    with prompt(model) as ctx:
        try:
            ctx.generate(Sampler.argmax(), reasoning=True)
            out["reasoning_without_decode"] = None
        except Exception as exc:  # noqa: BLE001
            out["reasoning_without_decode"] = [type(exc).__name__, str(exc)]
        for bad in ({"horizon": 0}, {"max_tokens": 0}):
            try:
                ctx.generate(Sampler.argmax(), **bad)
            except Exception as exc:  # noqa: BLE001
                out.setdefault("bad_options", []).append([type(exc).__name__, str(exc)])
        try:
            ctx.generate(Sampler.embedding())
        except Exception as exc:  # noqa: BLE001
            out["embedding_sampler"] = [type(exc).__name__, str(exc)]
    return out
