"""A Context from construction to release: chat helpers and raw appends fill the SDK buffer,
flush moves it into the KV cache, truncate and the raw page operations of ``ctx.inner()`` change
the pages, a fork shares them, and a released context refuses further use."""

from inferlet import Context, Model, RawContext, Sampler, runtime
from inferlet.host.errors import PieError


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def pages(ctx):
    raw = ctx.inner()
    check(isinstance(raw, RawContext), "inner() gives a RawContext")
    return [raw.committed_page_count(), raw.working_page_count(), raw.working_page_token_count()]


def refused(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the class and text are the observation
        return [type(exc).__name__, str(exc)]
    return None


async def main(input):
    model = Model.load(runtime.models()[0])
    out = {}
    ctx = Context(model, name="main")
    check(ctx.model == model and ctx.name == "main", "the context keeps its model and name")
    out["page_size"] = ctx.page_size
    out["empty"] = [ctx.seq_len, ctx.buffer(), pages(ctx)]
    check(ctx.system("You are terse.") is ctx, "chat helpers chain")
    ctx.user("Hi there.").assistant("Hello.").user("Count to three.")
    out["chat_buffer"] = ctx.buffer()
    ctx.append([11, 12]).fill(" and more").fill_tokens([13])
    out["raw_tail"] = ctx.buffer()[len(out["chat_buffer"]):]
    check(ctx.seq_len == 0, "nothing runs before flush")
    n = len(ctx.buffer())
    await ctx.flush()
    check(ctx.buffer() == [] and ctx.seq_len == n, "flush moves the buffer into the KV cache")
    await ctx.flush()  # nothing buffered: nothing runs
    out["flushed"] = [ctx.seq_len, pages(ctx)]

    ctx.truncate(3)
    check(ctx.seq_len == n - 3, "truncate drops trailing tokens")
    out["truncated"] = [ctx.seq_len, pages(ctx)]
    out["truncate_too_far"] = refused(lambda: ctx.truncate(10_000))

    raw = ctx.inner()
    raw.reserve_working_pages(2)
    out["reserved"] = pages(ctx)
    raw.release_working_pages(2)
    out["released_working"] = pages(ctx)
    raw.truncate_working_page_tokens(1)
    check(ctx.seq_len == n - 4, "raw truncation moves seq_len too")
    out["raw_truncated"] = [ctx.seq_len, pages(ctx)]
    out["commit_too_many"] = refused(lambda: raw.commit_working_pages(5))

    fork = ctx.fork("child")
    check(fork.seq_len == ctx.seq_len and fork.name == "child", "a fork starts at its parent's length")
    ctx.cue()
    fork.cue()
    a = await ctx.generate(Sampler.argmax(), max_tokens=3, stop=[], auto_flush=False).collect_tokens()
    b = await fork.generate(Sampler.argmax(), max_tokens=3, stop=[], auto_flush=False).collect_tokens()
    check(a == b, f"a fork continues as its parent does: {a} != {b}")
    out["fork_tokens"] = a
    out["after_generate"] = [ctx.seq_len, ctx.buffer(), fork.seq_len, fork.buffer()]
    ctx.seal()
    out["sealed_buffer"] = ctx.buffer()
    await ctx.flush()
    out["parent_pages"] = pages(ctx)
    fork.release()
    out["released_fork"] = [refused(lambda: fork.seq_len), refused(lambda: fork.append([1])),
                            refused(lambda: fork.forward())]
    ctx.release()
    ctx.release()  # twice is harmless

    with Context(model) as scoped:
        scoped.user("scoped")
        await scoped.flush()
        out["with_block"] = scoped.seq_len
    out["after_with"] = refused(lambda: scoped.seq_len)
    async with Context(model) as scoped_async:
        scoped_async.append([1, 2, 3])
        await scoped_async.flush()
        out["async_with_block"] = pages(scoped_async)
    out["not_a_model"] = refused(lambda: Context("qwen"))
    try:
        await Context(model).generate(Sampler.argmax(), max_tokens=1, auto_flush=False).collect_tokens()
        out["empty_generate"] = None
    except PieError as exc:
        out["empty_generate"] = [type(exc).__name__, str(exc)]
    return out
