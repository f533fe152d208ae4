"""Speculative decoding on the real default model (cpu backend): greedy tokens are the same
with no speculation, the system drafter and a custom prompt-lookup speculator, with a JSON
schema and with stop tokens; the speculator sees the protocol; every page goes back."""

from __future__ import annotations

import pytest

from inferlet import Context, JsonSchema, Model, Sampler, runtime

pytestmark = pytest.mark.model

CODE = '''def count_words(text):
    counts = {}
    for word in text.split():
        word = word.lower()
        counts[word] = counts.get(word, 0) + 1
    return counts
'''
PROMPTS = {
    "rewrite": "Rename count_words to word_histogram in this code. Reply with the code only.\n\n" + CODE,
    "quote": "Here is a sentence: 'The quick brown fox jumps over the lazy dog near the river bank.' "
             "Repeat the sentence exactly, word for word.",
    "free": "Write one sentence about why the sky is blue.",
}
TOKENS = 28


class PromptLookup:
    """A custom speculator: the tokens after the latest earlier match of the last 2 tokens."""

    def __init__(self, context_tokens: list[int]) -> None:
        self.history = list(context_tokens)
        self.calls: list[tuple] = []

    def draft(self):
        h = self.history
        drafts: list[int] = []
        for at in range(len(h) - 3, 0, -1):
            if h[at - 1 : at + 1] == h[-2:]:
                drafts = h[at + 1 : at + 5]
                break
        self.calls.append(("draft", drafts))
        return drafts, list(range(len(h), len(h) + len(drafts)))

    def accept(self, tokens):
        self.calls.append(("accept", list(tokens)))
        self.history += tokens

    def rollback(self, n):
        self.calls.append(("rollback", n))

    def reset(self):
        self.history = []


def _check_protocol(calls: list[tuple]) -> int:
    """Every draft is followed by accept(run) (absent when the step accepted nothing: it sampled
    only a stop token) and, if drafts were dropped, rollback(dropped); the run is the kept drafts
    plus the step's own token, which only the last step may lack (a stop token ends generation
    without being accepted). Returns how many drafted tokens were kept."""
    kept_total, i = 0, 0
    while i < len(calls):
        kind, value = calls[i]
        if kind == "accept":  # a step that carried no drafts
            i += 1
            continue
        assert kind == "draft", calls[i]
        drafts, i = value, i + 1
        run: list[int] = []
        if i < len(calls) and calls[i][0] == "accept":
            run, i = calls[i][1], i + 1
        dropped = 0
        if i < len(calls) and calls[i][0] == "rollback":
            dropped, i = calls[i][1], i + 1
            assert dropped > 0
        kept = len(drafts) - dropped
        assert run[:kept] == drafts[:kept], (drafts, run, dropped)
        assert len(run) == kept + 1 or (len(run) == kept and i == len(calls)), (drafts, run, dropped, i, len(calls))
        kept_total += kept
    return kept_total


def _run(pie, prompt: str, mode: str, **options):
    async def main(_):
        with Context(Model.load(runtime.models()[0])) as ctx:
            ctx.user(prompt)
            ctx.cue()
            spec = PromptLookup(ctx.buffer()) if mode == "custom" else None
            kwargs = {"speculator": spec} if spec else {"system_speculation": True} if mode == "system" else {}
            g = ctx.generate(Sampler.argmax(), auto_flush=False, **kwargs, **options)
            steps = []
            async for step in g:
                steps.append((await step.execute()).tokens)
            return steps, spec.calls if spec else [], ctx.seq_len, ctx.buffer()

    return pie.value(main)


@pytest.mark.parametrize("kind", list(PROMPTS))
def test_greedy_tokens_are_the_same_with_either_drafter(pie, kind):
    stop = [151645]  # <|im_end|>
    plain, _, seq_len, buffer = _run(pie, PROMPTS[kind], "none", max_tokens=TOKENS, stop=stop)
    system, _, seq_len2, buffer2 = _run(pie, PROMPTS[kind], "system", max_tokens=TOKENS, stop=stop)
    custom, calls, seq_len3, buffer3 = _run(pie, PROMPTS[kind], "custom", max_tokens=TOKENS, stop=stop)
    flat = [t for s in plain for t in s]
    assert [t for s in system for t in s] == flat
    assert [t for s in custom for t in s] == flat
    assert seq_len == seq_len2 == seq_len3 and buffer == buffer2 == buffer3
    kept = _check_protocol(calls)
    if kind in ("rewrite", "quote"):  # text the model copies: several tokens per step
        assert len(system) < len(plain) and len(custom) < len(plain) and kept > 0


def test_a_json_schema_constraint_gives_the_same_tokens(pie):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "words": {"type": "array", "items": {"type": "string"}}},
              "required": ["name", "words"]}
    prompt = "Give JSON with name 'fox' and words: quick, brown, fox, quick, brown, fox."
    options = dict(max_tokens=TOKENS, stop=[151645], constrain=JsonSchema(schema))
    plain, *_ = _run(pie, prompt, "none", **options)
    system, *_ = _run(pie, prompt, "system", **options)
    custom, calls, *_ = _run(pie, prompt, "custom", **options)
    flat = [t for s in plain for t in s]
    assert [t for s in system for t in s] == flat and [t for s in custom for t in s] == flat
    _check_protocol(calls)


def test_a_stop_token_inside_a_copied_run_ends_it_there(pie):
    plain, *_ = _run(pie, PROMPTS["rewrite"], "none", max_tokens=TOKENS, stop=[151645])
    flat = [t for s in plain for t in s]
    stop = next(t for i, t in enumerate(flat) if i >= 12 and t not in flat[:i])  # first seen late
    cut = flat[: flat.index(stop)]  # post stop truncation: the stop token ends it, unreported
    for mode in ("none", "system", "custom"):
        steps, calls, _, buffer = _run(pie, PROMPTS["rewrite"], mode, max_tokens=TOKENS, stop=[151645, stop])
        assert [t for s in steps for t in s] == cut, mode
        assert buffer == []  # nor kept
        _check_protocol(calls)
