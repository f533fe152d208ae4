"""A stop token ends generation and is not an accepted token ("post stop truncation"): not in
``out.tokens``, the collectors or ``tokens_generated``, and never in the context's KV cache or
buffer, also when the step that samples it verified drafts."""

from __future__ import annotations

from inferlet import Context, Model, Sampler, runtime


def _model() -> Model:
    return Model.load(runtime.models()[0])


class WrongDrafts:
    """A speculator that drafts two tokens the model will not pick, and records the protocol."""

    def __init__(self, start: int, avoid: int) -> None:
        self.start, self.avoid = start, avoid
        self.calls: list[tuple] = []

    def draft(self):
        drafts = [t for t in (3, 4, 5) if t != self.avoid][:2]
        self.calls.append(("draft", drafts))
        return drafts, [self.start, self.start + 1]

    def accept(self, tokens):
        self.calls.append(("accept", list(tokens)))

    def rollback(self, n):
        self.calls.append(("rollback", n))

    def reset(self):
        pass


def test_a_step_that_samples_only_the_stop_token_accepts_nothing_and_rolls_the_drafts_back(dummy):
    async def main(_):
        with Context(_model()) as ctx:  # the greedy first token, to make it the stop token
            ctx.user("stop at once")
            first = (await ctx.generate(Sampler.argmax(), max_tokens=1, stop=[]).collect_tokens())[0]
        with Context(_model()) as ctx:
            ctx.user("stop at once")
            ctx.cue()
            prompt = len(ctx.buffer())
            spec = WrongDrafts(prompt, first)
            g = ctx.generate(Sampler.argmax(), max_tokens=8, stop=[first], speculator=spec, auto_flush=False)
            outs = [(await step.execute()).tokens async for step in g]
            return outs, g.tokens_generated, g.is_done, spec.calls, ctx.seq_len, ctx.buffer(), prompt

    outs, generated, done, calls, seq_len, buffer, prompt = dummy.value(main)
    assert outs == [[]] and generated == 0 and done
    assert calls[1:] == [("rollback", 2)]  # nothing to accept; both drafts rejected
    assert seq_len == prompt and buffer == []  # the prompt only: no draft, no stop token
