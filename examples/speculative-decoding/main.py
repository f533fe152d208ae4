"""Speculative decoding, two ways, side by side with plain decoding.

A reply that copies its prompt (code being edited, a passage being quoted) can be guessed
ahead: the tokens that followed the last few tokens the previous time they appeared. The
guesses (drafts) run in the same forward pass as the step's token and the context keeps those
the model would have produced anyway, so each mode returns the same text in fewer steps.

- ``custom``: :class:`PromptLookup`, a :class:`inferlet.spec.Speculator` written here.
- ``system``: ``system_speculation=True``, the runtime's own n-gram drafter, which also backs
  off when its guesses stop being kept.

A short untimed run comes first, so the first timed mode does not pay for the backend's first
passes (kernel builds, allocations) or for prefilling a prompt the later modes find in the
prefix cache: every mode is timed warm, on the same cached prompt.
"""

import time

from inferlet import Context, Model, Sampler, chat, runtime, session

CODE = '''def mean_price(items):
    total = 0.0
    count = 0
    for item in items:
        if item.price is not None:
            total += item.price
            count += 1
    return total / count if count else 0.0
'''
DEFAULT_PROMPT = f"Rename mean_price to average_price in this code. Reply with the code only.\n\n{CODE}"


class PromptLookup:
    """Drafts the tokens that followed the latest earlier occurrence of the last ``n`` tokens."""

    def __init__(self, context_tokens: list[int], n: int = 3, length: int = 6) -> None:
        self.tokens = list(context_tokens)  # everything the context holds, prompt and reply
        self.n, self.length = n, length

    def draft(self) -> tuple[list[int], list[int]]:
        tail = self.tokens[-self.n :]
        for at in range(len(self.tokens) - self.n - 1, self.n - 1, -1):
            if self.tokens[at - self.n : at] == tail:
                drafts = self.tokens[at : at + self.length]
                start = len(self.tokens)  # drafts follow the last token, which runs this step
                return drafts, list(range(start, start + len(drafts)))
        return [], []

    def accept(self, tokens: list[int]) -> None:
        self.tokens += tokens

    def rollback(self, n: int) -> None:
        pass  # drafts never entered self.tokens; only accepted tokens do

    def reset(self) -> None:
        self.tokens = []


async def run(model: Model, prompt: str, mode: str, max_tokens: int) -> dict:
    with Context(model) as ctx:
        ctx.user(prompt)
        ctx.cue()
        options = {}
        if mode == "custom":
            options["speculator"] = PromptLookup(ctx.buffer())
        elif mode == "system":
            options["system_speculation"] = True
        g = ctx.generate(Sampler.argmax(), max_tokens=max_tokens, stop=chat.stop_tokens(model),
                         auto_flush=False, **options)
        steps, start = 0, time.perf_counter()
        async for step in g:
            await step.execute()
            steps += 1
        seconds = time.perf_counter() - start
        text = await g.collect_text()  # already done: decodes what it generated
        n = g.tokens_generated
        return {"mode": mode, "tokens": n, "steps": steps, "tokens_per_step": round(n / steps, 2),
                "seconds": round(seconds, 2), "text": text}


async def main(input: dict) -> dict:
    model = Model.load(runtime.models()[0])
    prompt = input.get("prompt") or DEFAULT_PROMPT
    modes = [m.strip() for m in input["modes"].split(",") if m.strip()]
    unknown = sorted(set(modes) - {"none", "custom", "system"})
    if unknown:
        raise ValueError(f"unknown mode {unknown[0]!r}: use none, custom or system")
    warm = await run(model, prompt, "none", min(8, input["max_tokens"]))  # not timed: see the docstring
    session.send(f"warm-up: {warm['tokens']} tokens in {warm['seconds']} s (not counted)\n")
    results = []
    for mode in modes:
        result = await run(model, prompt, mode, input["max_tokens"])
        session.send(f"{mode}: {result['tokens']} tokens in {result['steps']} steps, {result['seconds']} s\n")
        results.append(result)
    return {"same_text": len({r["text"] for r in results}) == 1, "warm_up_seconds": warm["seconds"], "runs": results}
