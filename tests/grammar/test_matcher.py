"""Matchers on the default model's vocabulary: packed masks, end of sequence, errors, caching,
compilation off the event loop and its time limit."""

from __future__ import annotations

import asyncio
import threading
import time
import numpy as np
import pytest

from pie_core.errors import InvalidInput
from pie_core.grammar import Matcher, compiler_for, source
from pie_core.grammar.compiler import check_timeout
from pie_core.models.registry import resolve_model
from pie_core.backend_kit.sampling import unpack_logit_masks
from schemas import heavy_schema


@pytest.fixture(scope="module")
def model():
    return resolve_model(None)


def _stops(model) -> list[int]:
    return sorted(set(model.chat.stop_tokens) | set(model.tokenizer.eos_ids))


def _matcher(model, src, vocab: int | None = None) -> Matcher:
    vocab = vocab or model.spec.vocab_size
    compiled = compiler_for(model.tokenizer, vocab, _stops(model)).compile_blocking(src)
    return Matcher(compiled, vocab, src.describe(), model.tokenizer.decode)


def _allowed(m: Matcher) -> np.ndarray:
    return np.flatnonzero(np.unpackbits(m.packed(), bitorder="little", count=m.vocab_size))


def _ids(model, text: str) -> list[int]:
    return model.tokenizer.encode(text)


def test_packed_mask_allows_exactly_the_tokens_the_grammar_accepts(model):
    m = _matcher(model, source.regex(r"[0-9]{2}-[a-z]+"))
    m.accept(_ids(model, "4"))
    allowed = _allowed(m)
    assert 0 < allowed.size < 100
    for tok in allowed:
        assert m.fork().try_accept(int(tok))
    others = np.setdiff1d(np.random.default_rng(0).integers(0, m.vocab_size, 2000), allowed)
    assert not any(m.fork().try_accept(int(tok)) for tok in others)
    # the backend's own unpacking reads the same set
    backend = unpack_logit_masks(m.packed()[None, :], m.vocab_size)[0]
    assert np.array_equal(np.flatnonzero(backend), allowed)
    # and the BRLE form says the same
    from pie_core import brle

    assert np.array_equal(np.flatnonzero(brle.decode(m.brle(), m.vocab_size)), allowed)


def test_ids_past_the_tokenizer_and_special_tokens_are_masked(model):
    tokenizer_size = len(model.tokenizer.vocabs()[0])
    vocab = tokenizer_size + 45  # embedding rows the tokenizer has no token for
    m = _matcher(model, source.json_schema({"type": "string"}), vocab)
    m.accept(_ids(model, '"'))
    mask = m.packed()
    assert mask.shape == ((vocab + 7) // 8,)
    bits = np.unpackbits(mask, bitorder="little")
    assert bits[tokenizer_size:].sum() == 0
    assert bits[:tokenizer_size].sum() > 100_000  # inside a string nearly every text token goes
    specials = sorted(model.tokenizer.special_ids)
    assert bits[specials].sum() == 0


def test_stop_tokens_are_allowed_exactly_when_the_grammar_can_end(model):
    stops = _stops(model)
    m = _matcher(model, source.regex(r"[0-9]{2,3}"))
    seen = []
    for digit in "123":
        m.accept(_ids(model, digit))
        allowed = set(_allowed(m).tolist())
        seen.append((m.can_end, all(s in allowed for s in stops), bool(allowed - set(stops))))
    assert seen == [(False, False, True), (True, True, True), (True, True, False)]
    m.accept([stops[0]])
    assert m.is_terminated


def test_accept_is_all_or_none_and_names_the_bad_token(model):
    m = _matcher(model, source.regex(r"[0-9]+;"))
    before = _allowed(m)
    with pytest.raises(InvalidInput, match=r"token \d+ \('x'\) at index 2 is not allowed by the regex"):
        m.accept(_ids(model, "12") + _ids(model, "x"))
    assert np.array_equal(_allowed(m), before)  # the two digits were taken back
    with pytest.raises(InvalidInput, match="outside the vocabulary"):
        m.accept([m.vocab_size + 5])


def test_a_terminated_matcher_refuses_a_mask_until_reset(model):
    m = _matcher(model, source.regex(r"ok"))
    m.accept(_ids(model, "ok") + [_stops(model)[0]])
    assert m.is_terminated
    with pytest.raises(InvalidInput, match="has ended"):
        m.packed()
    with pytest.raises(InvalidInput, match="after the regex 'ok' has ended"):
        m.accept(_ids(model, "o"))
    m.reset()
    assert not m.is_terminated and _allowed(m).size > 0


def test_a_fork_walks_on_its_own(model):
    m = _matcher(model, source.regex(r"(ab|cd)"))
    twin = m.fork()
    m.accept(_ids(model, "a"))
    assert twin.allows(_ids(model, "c")[0]) and not m.allows(_ids(model, "c")[0])


def test_compiled_grammars_are_cached_per_source_and_vocabulary(model):
    comp = compiler_for(model.tokenizer, model.spec.vocab_size, _stops(model))
    assert compiler_for(model.tokenizer, model.spec.vocab_size, _stops(model)) is comp
    assert compiler_for(model.tokenizer, model.spec.vocab_size + 8, _stops(model)) is not comp
    src = source.regex(r"cache-[0-9]{3}")
    first = comp.submit(src)
    assert comp.submit(source.regex(r"cache-[0-9]{3}")) is first
    assert comp.compile_blocking(src) is first.result()
    assert comp.cached(src) and not comp.cached(source.regex(r"never-compiled"))


def test_compilation_runs_off_the_event_loop(model, monkeypatch):
    comp = compiler_for(model.tokenizer, model.spec.vocab_size, _stops(model))
    src = source.regex(r"off-the-loop-[0-9]{4}")
    real = comp._compile
    threads: list[int] = []
    loop_turned = threading.Event()
    saw_the_loop_turn: list[bool] = []

    def compile_and_wait_for_the_loop(grammar_source):
        threads.append(threading.get_ident())
        # On the loop's own thread this would wait in vain: the loop could not set the event.
        saw_the_loop_turn.append(loop_turned.wait(30))
        return real(grammar_source)

    monkeypatch.setattr(comp, "_compile", compile_and_wait_for_the_loop)

    async def go() -> int:
        compiling = asyncio.create_task(comp.compile(src, timeout=120))
        await asyncio.sleep(0)  # the task starts the compilation
        loop_turned.set()  # the loop turns while it runs
        await compiling
        return threading.get_ident()

    loop_thread = asyncio.run(go())
    assert saw_the_loop_turn == [True]
    assert len(threads) == 1 and threads[0] != loop_thread
    assert comp.cached(src)


def test_a_grammar_too_complex_for_the_time_limit_is_a_clear_error(model):
    comp = compiler_for(model.tokenizer, model.spec.vocab_size, _stops(model))
    message = r"the JSON schema did not compile within 0.02 s: it is too complex .* pass a larger compile_timeout"
    with pytest.raises(InvalidInput, match=message):
        asyncio.run(comp.compile(source.json_schema(heavy_schema()), timeout=0.02))
    with pytest.raises(InvalidInput, match=message):
        comp.compile_blocking(source.json_schema(heavy_schema()), timeout=0.02)
    for bad in (0, -1, "soon"):
        with pytest.raises(InvalidInput, match="compile timeout must be > 0"):
            check_timeout(bad)  # type: ignore[arg-type]


def _busy_compile_threads(seconds: float) -> list:
    """Both compile threads asleep for ``seconds`` (another user's long compilations)."""
    from pie_core.grammar import compiler

    return [compiler._executor().submit(time.sleep, seconds) for _ in range(compiler.COMPILE_THREADS)]


def test_the_time_limit_counts_from_the_compilation_s_start_not_its_wait_for_a_thread(model):
    """A grammar queued behind others is not "too complex" for the wait: on a loaded server 20
    schemas of one request queued behind each other and the last ones failed (CI, issue 35)."""
    comp = compiler_for(model.tokenizer, model.spec.vocab_size, _stops(model))
    comp.compile_blocking(source.regex(r"warm"))  # the vocabulary is built once, outside the limits below
    busy = _busy_compile_threads(1.5)
    assert asyncio.run(comp.compile(source.regex(r"queued-[0-9]{3}"), timeout=1.0)) is not None
    for b in busy:
        b.result()
    busy = _busy_compile_threads(1.5)
    assert comp.compile_blocking(source.regex(r"queued-blocking-[0-9]{3}"), timeout=1.0) is not None


def test_a_grammar_that_finds_no_free_compile_thread_is_refused_as_busy(model, monkeypatch):
    from pie_core.grammar import compiler

    comp = compiler_for(model.tokenizer, model.spec.vocab_size, _stops(model))
    comp.compile_blocking(source.regex(r"warm"))
    monkeypatch.setattr(compiler, "QUEUE_WAIT_S", 0.3)
    busy = _busy_compile_threads(2.0)
    with pytest.raises(InvalidInput, match="waited 0.3 s for a compile thread: the grammar compiler is busy"):
        asyncio.run(comp.compile(source.regex(r"never-started-[0-9]{3}"), timeout=0.2))
    for b in busy:
        b.result()
