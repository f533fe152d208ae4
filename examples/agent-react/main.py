"""ReAct agent: thought → action → observation, with the loop beside the model.

What a client loop over an OpenAI endpoint pays on every turn, this inferlet does not:

- **The context stays.** The conversation lives in one ``Context`` across turns. Each turn
  prefills only the new observation; the history is never re-sent, re-tokenised or matched
  against a prefix cache, and the model's own tokens stay exactly as sampled (a client sends
  their text back, which may tokenise differently).
- **Idle during tools.** ``with ctx.idle():`` around the tool wait takes the context out of the
  KV-page market, so under contention its pages go to agents that are decoding meanwhile (its
  next pass brings them back).
- **Concurrent tools.** The actions of one turn run at once (``asyncio.gather``).

``mode="text"`` runs the same loop as one plain transcript (``Thought: … Action: … Observation:``)
without the chat template, as a client over ``/v1/completions`` would. The protocol (actions,
tools, observations) is in ``react.py``, which ``benchmarks/agents.py`` shares for its client side.
"""

from inferlet import Context, Model, Sampler, chat, runtime

import react


async def main(input: dict) -> dict:
    model = Model.load(runtime.models()[0])
    tools = react.Tools(input["tool_delay_s"])
    log: list[dict] = []
    answer = None
    generated = 0
    with Context(model) as ctx:
        text_mode = input["mode"] == "text"
        if input["mode"] not in ("chat", "text"):
            raise ValueError(f"mode must be 'chat' or 'text', got {input['mode']!r}")
        system = input.get("system") or react.SYSTEM
        if text_mode:
            tokenizer = model.tokenizer()
            ctx.append(tokenizer.encode(f"{system}\nQuestion: {input['task']}\n"))
        else:
            ctx.system(system).user(input["task"])
        for turn in range(input["turns"]):
            if text_mode:
                g = ctx.generate(Sampler.argmax(), max_tokens=input["max_tokens"], auto_flush=False,
                                 stop=chat.stop_tokens(model))
                text = tokenizer.decode(await g.collect_tokens())
            else:
                g = ctx.generate(Sampler.argmax(), max_tokens=input["max_tokens"])
                text = await g.collect_text()
                ctx.seal()
            generated += g.tokens_generated
            calls = react.actions(text, input["parallel_tools"])
            answer = react.finished(calls)
            log.append({"turn": turn, "text": text, "actions": calls})
            if answer is not None and input["stop_at_finish"]:
                break
            with ctx.idle():  # no pass runs while the tools do: lend the pages meanwhile
                results = await tools.run(calls)
            seen = react.observation(results)
            log[-1]["observation"] = seen
            if text_mode:
                ctx.append(tokenizer.encode(f"\n{seen}\n"))
            else:
                ctx.user(seen)
        kept = ctx.seq_len + len(ctx.buffer())
    return {"answer": answer, "turns": len(log), "tokens": generated, "context_tokens": kept, "log": log}
