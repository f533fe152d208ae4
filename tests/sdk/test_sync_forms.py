"""The readme's synchronous forms in-process, where nothing may block the engine's event loop:
each raises a one-line error naming the async form and the runners that allow it; the async
forms are unchanged; ``Subscription.get()`` never waits. (The forms themselves run in the
process and wasm runners: tests/server/test_isolation_sync_forms.py.)"""

from __future__ import annotations

import asyncio
import inspect

import pytest

from inferlet import Context, Model, Sampler, messaging, runtime
from pie_core.errors import InvalidInput, Unsupported
from pie_core.runtime.instance import load_entry
from pie_core.runtime.manifest import load_manifest

WHERE = "(synchronous forms need `pie serve --isolation process` or `--isolation wasm`)"


def _model() -> Model:
    return Model.load(runtime.models()[0])


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text
    return text


def test_a_for_loop_over_an_event_stream_names_async_for(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.user("hi")
            stream = ctx.generate(Sampler.argmax(), decode=True, max_tokens=2)
            with pytest.raises(Unsupported) as err:
                for _event in stream:
                    pass
            return _one_line(err.value), ctx.seq_len

    text, seq_len = dummy.value(main)
    assert text == ("`for event in ctx.generate(..., decode=True)` blocks, and this runner cannot block an inferlet: "
                    f"write `async for event in ctx.generate(..., decode=True)` {WHERE}")
    assert seq_len == 0  # nothing ran


def test_a_for_loop_over_a_generator_names_async_for_step(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.user("hi")
            with pytest.raises(Unsupported) as err:
                for _tokens in ctx.generate(Sampler.argmax(), max_tokens=2):
                    pass
            return _one_line(err.value)

    assert dummy.value(main) == ("`for tokens in ctx.generate(...)` blocks, and this runner cannot block an inferlet: "
                                 f"write `async for step in ctx.generate(...)` {WHERE}")


def test_a_for_loop_over_a_subscription_names_async_for(dummy):
    async def main(_):
        with messaging.subscribe("news") as sub:
            with pytest.raises(Unsupported) as err:
                for _msg in sub:
                    pass
            return _one_line(err.value)

    assert dummy.value(main) == ("`for msg in sub` blocks, and this runner cannot block an inferlet: "
                                 f"write `async for msg in sub` {WHERE}")


def test_value_calls_from_synchronous_code_name_their_await_form(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.user("hi")
            g = ctx.generate(Sampler.argmax(), max_tokens=2)
            calls = {
                "generate_text": lambda: ctx.generate_text(Sampler.argmax(), max_tokens=2),
                "collect_tokens": g.collect_tokens,
                "flush": ctx.flush,
                "pull": lambda: messaging.pull("q"),
            }
            errors = {}
            for name, call in calls.items():  # synchronous code: a thread with no event loop
                with pytest.raises(Unsupported) as err:
                    await asyncio.to_thread(call)
                errors[name] = _one_line(err.value)
            return errors, ctx.seq_len, g.tokens_generated

    errors, seq_len, generated = dummy.value(main)
    assert errors["generate_text"] == (f"ctx.generate_text(...) is a coroutine here: write `await ctx.generate_text(...)` "
                                       f"{WHERE}")
    assert errors["collect_tokens"] == f"g.collect_tokens() is a coroutine here: write `await g.collect_tokens()` {WHERE}"
    assert errors["flush"].startswith("ctx.flush() is a coroutine here: write `await ctx.flush()`")
    assert errors["pull"].startswith("messaging.pull(topic) is a coroutine here: write `await messaging.pull(topic)`")
    assert seq_len == 0 and generated == 0  # nothing ran


def test_value_calls_from_coroutine_code_are_coroutines_as_in_the_reference(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.user("hi")
            pending = ctx.generate_text(Sampler.argmax(), max_tokens=3, stop=[])
            is_coro = inspect.iscoroutine(pending)
            text = await pending
            more = await ctx.generate(Sampler.argmax(), max_tokens=2, stop=[]).collect_tokens()
            return is_coro, isinstance(text, str) and len(text) > 0, len(more)

    assert dummy.value(main) == (True, True, 2)


def test_a_plain_def_main_is_refused_in_process_with_the_async_form(tmp_path):
    (tmp_path / "Pie.toml").write_text('[package]\nname = "plain"\nversion = "1.0.0"\ndescription = "sync main"\n')
    (tmp_path / "main.py").write_text("def main(input):\n    return 'x'\n")
    manifest = load_manifest(tmp_path)
    with pytest.raises(InvalidInput) as err:
        load_entry(manifest)
    assert _one_line(err.value).endswith(f"main is a plain function here: write 'async def main(input)' {WHERE}")
    assert load_entry(manifest, synchronous=True)({}) == "x"  # what the process runner loads


def test_get_returns_a_broadcast_that_arrived_and_none_otherwise_without_waiting(dummy):
    async def main(_):
        with messaging.subscribe("news") as sub:
            empty = sub.get()
            messaging.broadcast("news", "one")
            messaging.broadcast("news", "two")
            got = [sub.get(), sub.get(), sub.get()]
            messaging.broadcast("news", "three")
            nxt = await sub.next()  # goes on with the fetch the last get() started: nothing lost
            sub.unsubscribe()
            return empty, got, nxt, sub.get(), await sub.next()

    assert dummy.value(main) == (None, ["one", "two", None], "three", None, None)


def test_get_from_synchronous_code_in_process_names_the_async_context(dummy):
    async def main(_):
        with messaging.subscribe("news") as sub:
            with pytest.raises(Unsupported) as err:
                await asyncio.to_thread(sub.get)
            messaging.broadcast("news", "kept")
            return _one_line(err.value), await sub.next()

    text, kept = dummy.value(main)
    assert text == f"sub.get() needs the inferlet's event loop: call it from `async def` code {WHERE}"
    assert kept == "kept"
