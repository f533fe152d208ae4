"""Speculative decoding through the SDK on the dummy backend: the generated tokens, the KV
lineage and the speculator protocol are those of generation without speculation.

The dummy's logits depend on each row's (token, position) only, so a speculator that knows the
reference continuation can draft exactly what the verifier will keep; KV-dependent exactness
is checked on the real model in tests/integration/test_speculation_real_model.py.
"""

import pytest

from inferlet import Context, Model, Regex, Sampler, chat, runtime
from inferlet.spec import Speculator
from pie_core.errors import InvalidInput


def _model() -> Model:
    return Model.load(runtime.models()[0])


class Oracle:
    """Drafts ``right`` tokens of the known continuation, then ``wrong`` wrong ones."""

    def __init__(self, reference: list[int], start: int, right: int = 2, wrong: int = 1) -> None:
        self.ref, self.start, self.right, self.wrong = reference, start, right, wrong
        self.seen = 0
        self.calls: list[tuple] = []

    def draft(self):
        ahead = self.ref[self.seen : self.seen + self.right]
        drafts = ahead + [(t + 1) % 7 + 3 for t in self.ref[self.seen + len(ahead) : self.seen + len(ahead) + self.wrong]]
        base = self.start + self.seen + 1
        self.calls.append(("draft", list(drafts)))
        return drafts, list(range(base, base + len(drafts)))

    def accept(self, tokens):
        self.calls.append(("accept", list(tokens)))
        self.seen += len(tokens)

    def rollback(self, n):
        self.calls.append(("rollback", n))

    def reset(self):
        self.seen = 0


def _lineage(ctx: Context) -> list[int]:
    return list(ctx._ctx.kv.tokens)  # the core's record of what the KV holds (test-only peek)


async def _reference(prompt: str, **options):
    with Context(_model()) as ctx:
        ctx.user(prompt)
        tokens = await ctx.generate(Sampler.argmax(), **options).collect_tokens()
        return tokens, _lineage(ctx), ctx.buffer(), ctx.seq_len


def test_a_speculator_gives_the_same_tokens_kv_and_buffer_and_sees_the_protocol(dummy):
    async def main(_):
        ref, lineage, buffer, seq_len = await _reference("speculate", max_tokens=12, stop=[])
        with Context(_model()) as ctx:
            ctx.user("speculate")
            ctx.cue()
            start = len(ctx.buffer()) - 1  # position of the last prompt token (the anchor)
            spec = Oracle(ref, start)
            g = ctx.generate(Sampler.argmax(), max_tokens=12, stop=[], speculator=spec, auto_flush=False)
            steps = []
            async for step in g:
                steps.append((await step.execute()).tokens)
            return ref, lineage, buffer, seq_len, steps, spec.calls, _lineage(ctx), ctx.buffer(), ctx.seq_len

    ref, lineage, buffer, seq_len, steps, calls, lineage2, buffer2, seq_len2 = dummy.value(main)
    assert [t for s in steps for t in s] == ref
    assert (lineage2, buffer2, seq_len2) == (lineage, buffer, seq_len)
    # each step: two right drafts kept, the wrong one rejected, three tokens out
    assert [len(s) for s in steps] == [3, 3, 3, 3]
    expected = []
    for i in range(4):
        expected += [("draft", ref[3 * i : 3 * i + 2] + [calls[3 * i][1][2]]), ("accept", ref[3 * i : 3 * i + 3]), ("rollback", 1)]
    assert calls == expected


def test_system_speculation_gives_the_same_tokens(dummy):
    async def main(_):
        ref, lineage, buffer, _ = await _reference("a b c a b c a b c", max_tokens=10, stop=[])
        with Context(_model()) as ctx:
            ctx.user("a b c a b c a b c")
            got = await ctx.generate(Sampler.argmax(), max_tokens=10, stop=[], system_speculation=True).collect_tokens()
            return ref, lineage, buffer, got, _lineage(ctx), ctx.buffer()

    ref, lineage, buffer, got, lineage2, buffer2 = dummy.value(main)
    assert got == ref and lineage2 == lineage and buffer2 == buffer


def test_drafts_stop_before_a_stop_token_and_at_max_tokens(dummy):
    async def main(_):
        ref, *_ = await _reference("stop here", max_tokens=9, stop=[])
        stop = ref[4]
        want, lineage, buffer, _ = await _reference("stop here", max_tokens=9, stop=[stop])
        with Context(_model()) as ctx:
            ctx.user("stop here")
            ctx.cue()
            spec = Oracle(ref, len(ctx.buffer()) - 1, right=8, wrong=0)
            g = ctx.generate(Sampler.argmax(), max_tokens=9, stop=[stop], speculator=spec, auto_flush=False)
            got = await g.collect_tokens()
            return ref, want, lineage, buffer, got, _lineage(ctx), ctx.buffer(), spec.calls

    ref, want, lineage, buffer, got, lineage2, buffer2, calls = dummy.value(main)
    assert got == want == ref[:4]  # the stop token ends it and is not accepted
    assert lineage2 == lineage and buffer2 == buffer  # the stop token is neither in the KV nor buffered
    # one step: four drafts kept (the fifth, the stop token, can only be sampled), 8 drafted
    assert calls[1] == ("accept", want) and calls[2] == ("rollback", 4)


def test_max_tokens_caps_a_speculative_step(dummy):
    async def main(_):
        ref, lineage, buffer, _ = await _reference("cap", max_tokens=5, stop=[])
        with Context(_model()) as ctx:
            ctx.user("cap")
            ctx.cue()
            spec = Oracle(ref + [1] * 20, len(ctx.buffer()) - 1, right=10, wrong=0)
            got = await ctx.generate(Sampler.argmax(), max_tokens=5, stop=[], speculator=spec, auto_flush=False).collect_tokens()
            return ref, lineage, buffer, got, _lineage(ctx), ctx.buffer(), spec.calls

    ref, lineage, buffer, got, lineage2, buffer2, calls = dummy.value(main)
    assert got == ref and (lineage2, buffer2) == (lineage, buffer)
    assert calls == [("draft", (ref + [1] * 20)[:10]), ("accept", ref), ("rollback", 6)]


def test_grammar_masks_every_verified_row_and_rolls_back(dummy):
    pattern = "[a-z]{3,12}"

    async def main(_):
        ref, lineage, buffer, _ = await _reference("letters", max_tokens=8, constrain=Regex(pattern))
        with Context(_model()) as ctx:
            ctx.user("letters")
            ctx.cue()
            spec = Oracle(ref, len(ctx.buffer()) - 1, right=3, wrong=1)
            stop = chat.stop_tokens(ctx.model)
            g = ctx.generate(Sampler.argmax(), max_tokens=8, constrain=Regex(pattern), speculator=spec, stop=stop,
                             auto_flush=False)
            got = await g.collect_tokens()
            return ref, lineage, buffer, got, _lineage(ctx), ctx.buffer(), spec.calls

    ref, lineage, buffer, got, lineage2, buffer2, calls = dummy.value(main)
    assert got == ref and (lineage2, buffer2) == (lineage, buffer)
    assert any(kind == "accept" and len(v) > 1 for kind, v in calls)  # several tokens per step happened


def test_speculation_composes_with_the_event_stream(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.user("decode me")
            plain = await ctx.generate(Sampler.argmax(), max_tokens=10, decode=True).text()
        with Context(_model()) as ctx:
            ctx.user("decode me")
            spec = await ctx.generate(Sampler.argmax(), max_tokens=10, decode=True, system_speculation=True).text()
        return plain, spec

    plain, spec = dummy.value(main)
    assert plain == spec


def test_steps_with_probes_run_without_drafts(dummy):
    from inferlet import Entropy

    async def main(_):
        ref, *_ = await _reference("probe", max_tokens=4, stop=[])
        with Context(_model()) as ctx:
            ctx.user("probe")
            ctx.cue()
            spec = Oracle(ref, len(ctx.buffer()) - 1)
            g = ctx.generate(Sampler.argmax(), max_tokens=4, stop=[], speculator=spec, auto_flush=False)
            h = g.probe_each_step(-1, Entropy())
            values = []
            async for step in g:
                values.append((await step.execute()).entropy(h))
            return ref, spec.calls, values

    ref, calls, values = dummy.value(main)
    assert all(kind == "accept" for kind, _ in calls) and [v for _, v in calls] == [[t] for t in ref]
    assert len(values) == 4 and all(v is not None for v in values)


def test_bad_speculators_get_clear_errors_and_lose_nothing(dummy):
    class NoAccept:
        def draft(self):
            return [], []

    class BadPositions:
        def draft(self):
            return [5, 6], [0, 1]

        def accept(self, tokens):
            pass

    async def main(_):
        errors = []
        with Context(_model()) as ctx:
            ctx.user("x")
            for kwargs in ({"speculator": BadPositions(), "system_speculation": True}, {"speculator": NoAccept()}):
                try:
                    ctx.generate(Sampler.argmax(), max_tokens=3, **kwargs)
                except (InvalidInput, TypeError) as e:
                    errors.append((type(e).__name__, str(e)))
            buffered = ctx.buffer()
            g = ctx.generate(Sampler.argmax(), max_tokens=3, speculator=BadPositions(), auto_flush=False)
            try:
                await g.collect_tokens()
            except InvalidInput as e:
                errors.append(("InvalidInput", str(e)))
            return errors, buffered, ctx.buffer(), ctx.seq_len

    errors, buffered, after, seq_len = dummy.value(main)
    assert errors[0][0] == "InvalidInput" and "mutually exclusive" in errors[0][1]
    assert errors[1][0] == "TypeError" and "draft() and accept()" in errors[1][1]
    assert errors[2][0] == "InvalidInput" and "continuing the context" in errors[2][1]
    assert after == buffered and seq_len == 0  # nothing ran, nothing was lost


def test_the_protocol_is_runtime_checkable():
    assert isinstance(Oracle([], 0), Speculator)
    assert not isinstance(object(), Speculator)


def test_a_raw_pass_with_drafts_keeps_the_matching_run_and_frees_rejected_pages(dummy):
    async def next_token(ctx: Context, token: int) -> int:
        fwd = ctx.forward()
        fwd.input([token])
        h = fwd.sample([0], Sampler.argmax())
        return (await fwd.execute()).token(h)

    async def main(_):
        with Context(_model()) as ctx:
            ps = ctx.page_size
            ctx.append(list(range(10, 10 + ps - 3)))  # the drafts will cross a page boundary
            await ctx.flush()
            with ctx.fork() as twin:  # learn what the model says after 5, to draft it right
                right = await next_token(twin, 5)
            before = ctx.seq_len
            fwd = ctx.forward()
            fwd.input([5]).draft([right, 8, 9, 11])
            h = fwd.sample(list(range(5)), Sampler.argmax())
            out = await fwd.execute()
            raw = ctx.inner()
            pages = raw.committed_page_count(), raw.working_page_count()
            return before, out.tokens_at(h), out.raw.drafts_kept, ctx.seq_len, pages, ps, right

    before, sampled, kept, seq_len, (committed, working), ps, right = dummy.value(main)
    assert sampled[0] == right
    expect = 1 + next((i for i, (d, s) in enumerate(zip([8, 9, 11], sampled[1:])) if d != s), 3)
    assert kept == expect and seq_len == before + 1 + kept
    # full pages of kept tokens are committed; no page is left holding only rejected drafts
    assert committed == seq_len // ps and committed + working == -(-seq_len // ps)


def test_a_pass_with_drafts_is_checked_before_anything_runs(dummy):
    async def main(_):
        errors = []
        with Context(_model()) as ctx:
            ctx.append([1, 2, 3])
            for build in (
                lambda f: f.draft([4, 5]) and f.sample([2, 3], Sampler.argmax()),  # row 4 unsampled
                lambda f: f.draft([4]) and f.sample([2, 3], Sampler.multinomial(draws=2)),
                lambda f: f.draft([4]).attention_mask([[0, 4]] * 4) and f.sample([2, 3], Sampler.argmax()),
            ):
                fwd = ctx.forward(flush=True)
                build(fwd)
                try:
                    await fwd.execute()
                except InvalidInput as e:
                    errors.append(str(e))
            try:
                ctx.forward().draft([1]).input([2])
            except InvalidInput as e:
                errors.append(str(e))
            return errors, ctx.buffer(), ctx.seq_len

    errors, buffer, seq_len = dummy.value(main)
    assert "row 4 is not sampled" in errors[0]
    assert "one draw" in errors[1]
    assert "custom attention masks" in errors[2]
    assert "drafts come after every other input" in errors[3]
    assert buffer == [1, 2, 3] and seq_len == 0


def test_a_wrong_sized_row_mask_is_refused_at_the_host(dummy):
    import numpy as np

    async def main(_):
        with Context(_model()) as ctx:
            ctx.append([1, 2])
            fwd = ctx.forward(flush=True)
            fwd.sample([1], Sampler.argmax(), mask=np.zeros(3, dtype=np.uint8))
            try:
                await fwd.execute()
            except InvalidInput as e:
                return str(e), ctx.buffer()

    message, buffer = dummy.value(main)
    assert "packed uint8 array" in message and buffer == [1, 2]
