"""CodeAct agent: the model acts by writing a Python expression; the inferlet runs it.

Each turn the model writes one expression (held to expression characters by a regex). The
inferlet evaluates it with ``evaluate.py``'s restricted evaluator, inside the sandbox, and feeds the
value back; ``answer(x)`` ends the task with ``x``. Earlier values are bound as ``r1``, ``r2``, …

A turn is tried on a fork of the conversation. An expression that fails is dropped with its fork:
neither the broken code nor its error enters the conversation's KV cache, and the next attempt
(sampled, another seed) starts from the same committed pages, so a retry costs only its own tokens.
An attempt that works becomes the conversation. ``with ctx.idle():`` marks the evaluation (and its
simulated latency) as a wait that runs no pass.
"""

import asyncio

from inferlet import Context, Model, Regex, Sampler, runtime, session

from evaluate import Refused, evaluate

SYSTEM = (
    "You solve problems by writing one Python expression per turn, nothing else. You may use numbers, "
    "+ - * / // % **, comparisons, lists, and the functions abs min max round sum len sorted range sqrt. "
    "Earlier results are named r1, r2, ... When you know the answer, write answer(<expression>)."
)
EXPRESSION = r"[A-Za-z0-9_+\-*/%()\[\],.<>=! ]+"


async def attempt(ctx: Context, try_no: int, max_tokens: int) -> tuple[Context, str]:
    """One expression on a fork of ``ctx``: the fork and its text."""
    branch = ctx.fork()
    sampler = Sampler.argmax() if try_no == 0 else Sampler.top_p(0.8, 0.95, seed=try_no)
    text = await branch.generate(sampler, max_tokens=max_tokens, constrain=Regex(EXPRESSION)).collect_text()
    return branch, text.strip()


async def main(input: dict) -> dict:
    model = Model.load(runtime.models()[0])
    names: dict = {}
    answer = None
    log: list[dict] = []
    ctx = Context(model).system(SYSTEM).user(input["task"])
    try:
        for turn in range(input["turns"]):
            await ctx.flush()  # the retries fork committed pages and share them
            for try_no in range(input["retries"] + 1):
                branch, code = await attempt(ctx, try_no, input["max_tokens"])
                done: list = []
                with branch.idle():
                    await asyncio.sleep(input["tool_delay_s"])
                    try:
                        value = evaluate(code, {**names, "answer": lambda x: done.append(x) or x})
                    except Refused as exc:
                        log.append({"turn": turn, "code": code, "error": str(exc)})
                        branch.release()  # the broken attempt leaves the KV cache with its fork
                        continue
                ctx.release()
                ctx = branch.seal()
                names[f"r{len(names) + 1}"] = value
                log.append({"turn": turn, "code": code, "value": repr(value)[:200]})
                session.send(f"{code} -> {value!r:.200}")
                if done:
                    answer = done[0]
                else:
                    ctx.user(f"r{len(names)} = {value!r:.500}")
                break
            else:
                ctx.user(f"The last {input['retries'] + 1} attempts failed: {log[-1]['error']}")
            if answer is not None:
                break
        kept = ctx.seq_len + len(ctx.buffer())  # the conversation: failed attempts are not in it
    finally:
        ctx.release()
    return {"answer": repr(answer) if answer is not None else None, "steps": log, "context_tokens": kept}
