"""Contexts: a conversation's KV cache plus an SDK-side buffer of tokens not yet run."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Literal, overload

from inferlet.host import context as _host
from inferlet.host import types as _types
from inferlet.host import model as _model
from inferlet.host import scheduling as _market
from inferlet.host import tools as _tools
from inferlet.host.errors import InvalidInput
from inferlet import _blocking
from inferlet.cache import KvCache
from inferlet.events import Decoder, EventStream
from inferlet.forward import Forward
from inferlet.generator import Generator
from inferlet.model import Model
from inferlet.pending import Pending
from inferlet.sampler import Sampler

__all__ = ["Context", "RawContext"]


class Context:
    """A KV-cache context on one model.

    Chat helpers (``system``, ``user``, ...) and ``append`` add tokens to the SDK-side buffer;
    ``await flush()`` (or a generator's first step) runs them through the model. Pages are
    released by :meth:`release`, by leaving a ``with`` block, when the last reference to the
    context goes away, or when the inferlet ends.
    """

    def __init__(self, model: Model, name: str | None = None) -> None:
        if not isinstance(model, Model):
            raise TypeError(f"Context(model) needs a Model (from Model.load), got {type(model).__name__}")
        self._model = model
        self._ctx = _host.create(model.name)
        self._kv = KvCache(self._ctx, length=0)
        self._pending = Pending()
        self._chat = _model.chat_builder(model.name)
        self._idle_depth = 0
        self.name = name

    @classmethod
    def _wrap(cls, model: Model, kv: KvCache, buffer: list[int], chat: Any, name: str | None) -> Context:
        """A context over ``kv`` whose SDK state is ``buffer`` and builder ``chat`` (its own copy,
        or None for a fresh one)."""
        self = cls.__new__(cls)
        self._model, self._ctx, self._kv, self.name = model, kv.handle, kv, name
        self._idle_depth = 0
        self._pending = Pending(buffer)
        self._chat = _model.chat_builder(model.name) if chat is None else chat
        return self

    @classmethod
    def _opened(cls, model: Model, found: Any, name: str) -> Context | None:
        if found is None:
            return None
        handle, buffer, chat = found
        return cls._wrap(model, KvCache(handle), buffer, chat, name)

    # -- snapshots and forks ---------------------------------------------------------------
    @staticmethod
    def open(model: Model, name: str) -> Context | None:
        """A new context cloned from the snapshot ``name``; None if there is none."""
        return Context._opened(model, _host.open_snapshot(model.name, name), name)

    @staticmethod
    def take(model: Model, name: str) -> Context | None:
        """Take ownership of the snapshot ``name`` (it is removed); None if there is none."""
        return Context._opened(model, _host.take_snapshot(model.name, name), name)

    @staticmethod
    def delete(model: Model, name: str) -> None:
        """Drop the snapshot ``name``."""
        _host.delete_snapshot(model.name, name)

    def fork(self, name: str | None = None) -> Context:
        """A copy-on-write clone: shares committed pages, copies the partial page and buffer."""
        kv = self._kv.clone(_host.fork(self._handle()))
        # a shallow copy: builders hold a few flags beside their (shared) format
        return Context._wrap(self._model, kv, self._pending.tokens(), _model.chat_copy(self._chat), name)

    def save(self, name: str) -> None:
        """Snapshot this context (KV and buffer) under ``name``; it outlives the inferlet."""
        _host.save(self._handle(), name, self._pending.tokens(), self._chat)

    def snapshot(self) -> str:
        """Snapshot under a runtime-generated name and return the name."""
        return _host.snapshot(self._handle(), self._pending.tokens(), self._chat)

    def inner(self) -> RawContext:
        """Raw page operations (the Rust SDK's ``ctx.inner()``); valid while this context is."""
        return RawContext(self._kv)

    # -- inspection ------------------------------------------------------------------------
    @property
    def model(self) -> Model:
        """The bound model."""
        return self._model

    @property
    def page_size(self) -> int:
        """Tokens per KV page."""
        return self._kv.page_size

    @property
    def seq_len(self) -> int:
        """Tokens in the KV cache, committed + working (excludes the SDK buffer)."""
        return self._kv.length

    def buffer(self) -> list[int]:
        """Tokens buffered in the SDK, not yet flushed."""
        return self._pending.tokens()

    # -- filling ---------------------------------------------------------------------------
    def system(self, text: str) -> Context:
        """Add a system message."""
        return self._extend(_model.chat_system(self._chat, text))

    def user(self, text: str) -> Context:
        """Add a user message."""
        return self._extend(_model.chat_user(self._chat, text))

    def assistant(self, text: str) -> Context:
        """Add a pre-filled (complete) assistant turn."""
        return self._extend(_model.chat_assistant(self._chat, text))

    def cue(self) -> Context:
        """Open the model's turn: generation starts after these tokens."""
        return self._extend(_model.chat_cue(self._chat))

    def seal(self) -> Context:
        """Close the current assistant turn."""
        return self._extend(_model.chat_seal(self._chat))

    def equip_tools(self, schemas: Iterable[Any], system: str | None = None) -> Context:
        """List tools for the model as its chat template does; call it before the first message.

        Args:
            schemas: One JSON Schema per tool, dicts or JSON text (see ``tools.equip_prefix``).
            system: System text to go with the tools (default: the template's own).

        Raises:
            InvalidInput: Malformed schemas, or (Llama 3) equipping after the first message.
            Unsupported: The model's chat template has no tool support.
        """
        return self._extend(_model.chat_equip(self._chat, _tools.normalize(schemas), system))

    def answer_tool(self, name: str, value: Any) -> Context:
        """Add a turn carrying tool ``name``'s result (a string, or a dict/list: JSON-encoded).

        Qwen's template writes consecutive tool results as one turn: there the results wait in
        the conversation builder until the next message or cue (``generate`` cues) writes it.
        """
        return self._extend(_model.chat_answer(self._chat, name, value))

    def append(self, tokens: Iterable[int]) -> Context:
        """Append raw token ids to the buffer."""
        return self._extend(tokens)

    def fill(self, text: str) -> Context:
        """Encode ``text`` with the model's tokenizer and append it."""
        return self._extend(_model.tokenize(self._model.name, text))

    def fill_tokens(self, tokens: Iterable[int]) -> Context:
        """Alias of :meth:`append`."""
        return self._extend(tokens)

    @_blocking.awaitable("ctx.flush()")
    async def flush(self) -> None:
        """Run prefill on the buffered tokens and commit the pages they fill.

        To read probes or samples over the buffered tokens while flushing them, build the
        pass with ``ctx.forward(flush=True)`` instead. Called from synchronous code where the
        runner lets an inferlet block, it blocks instead of returning a coroutine (see
        :meth:`generate_text`).
        """
        self._kv.check_live()
        if len(self._pending):
            await self.forward(flush=True).execute()

    def truncate(self, n: int) -> None:
        """Drop the trailing ``n`` working-page tokens (committed pages cannot be truncated)."""
        self._kv.changed()
        _host.truncate(self._handle(), n)
        self._kv.shrank(n)

    # -- generation ------------------------------------------------------------------------
    def forward(self, flush: bool = False) -> Forward:
        """A forward pass on this context.

        Args:
            flush: False (the reference's raw pass): the buffer is left alone and the pass
                holds only what ``fwd.input`` adds. True: the pass starts with the buffered
                tokens (input rows ``0 .. len(ctx.buffer()) - 1``), so probes and samples can
                read them; executing it flushes them, as :meth:`flush` does.
        """
        self._kv.check_live()
        return Forward(self._model.name, self._kv, self._pending, flush)

    @overload
    def generate(self, sampler: Sampler, *, decode: Literal[False] = False, **options: Any) -> Generator: ...

    @overload
    def generate(
        self, sampler: Sampler, *, decode: Literal[True], reasoning: bool = False, tool_use: bool = False, **options: Any
    ) -> EventStream: ...

    def generate(
        self, sampler: Sampler, *, decode: bool = False, reasoning: bool = False, tool_use: bool = False, **options: Any
    ) -> Generator | EventStream:
        """A token generator, or with ``decode=True`` a stream of text events.

        Args:
            sampler: How each step picks its token.
            decode: False: return a :class:`inferlet.Generator` (drive it step by step or with
                its collectors). True: return an :class:`inferlet.EventStream`; ``async for
                event in ...`` yields ``Event.Text`` chunks and ends with ``Event.Done``.
                Where the runner lets an inferlet block (``pie serve --isolation process``
                or ``--isolation wasm``), the readme's ``for event in ...`` and ``for tokens
                in ...`` work too.
            reasoning: With ``decode=True``, report the model's reasoning block as
                ``Event.Thinking`` / ``Event.ThinkingDone`` instead of text.
            tool_use: With ``decode=True``, report tool calls in the model's own syntax as
                ``Event.ToolCallStart`` / ``Event.ToolCall(name, arguments)`` instead of text.
            **options: The generator's keyword options (``max_tokens``, ``stop``,
                ``logit_mask``, ``horizon``, ``auto_flush``, ...).

        Raises:
            InvalidInput: ``reasoning``/``tool_use`` without ``decode=True``.
        """
        if not decode:
            if reasoning or tool_use:
                raise InvalidInput("reasoning= and tool_use= apply to event streams: pass decode=True too")
            return Generator(self, sampler, **options)
        decoder = Decoder(self._model, reasoning=reasoning, tool_use=tool_use)
        return EventStream(Generator(self, sampler, **options), decoder)

    @_blocking.awaitable("ctx.generate_text(...)")
    async def generate_text(self, sampler: Sampler | None = None, **options: Any) -> str:
        """Generate and return the decoded reply (the readme's one-shot form).

        A call cannot return something that is both a ``str`` and awaitable, so the caller
        decides which it gets. From coroutine code (``async def``: an event loop runs) it
        returns a coroutine: ``text = await ctx.generate_text(...)``. From synchronous code (a
        ``def main(input)``, which the process and wasm runners accept) it blocks and returns
        the text: ``text = ctx.generate_text(...)``, as in the readme. In-process, where
        nothing may block, synchronous code gets :class:`~inferlet.host.errors.Unsupported`.

        Args:
            sampler: How each step picks its token (default ``Sampler.top_p()``).
            **options: The generator's keyword options (see :meth:`generate`).

        Returns:
            The reply text (the stop token is not part of it).
        """
        return await self.generate(sampler or Sampler.top_p(), **options).collect_text()

    # -- the KV-page market (see inferlet.scheduling) ----------------------------------------
    def set_bid(self, value: float) -> None:
        """Bid ``value`` credits per page per tick for this context's next forward pass only;
        after it the SDK's default bid (paced by the generator's horizon) applies again.

        A higher bid keeps the context's pages on the device under contention (it is suspended
        last and restored first); rent is charged at the auction's clearing price, never above
        the bid.

        Raises:
            InvalidInput: ``value`` is not a finite number >= 0.
        """
        _market.set_bid(self._kv.handle_as_is(), value)

    @contextmanager
    def idle(self) -> Iterator[Context]:
        """Hold this context out of the auction for the ``with`` block: it bids 0, so under
        contention its pages are the first to go (its next pass brings them back). Use it
        around waits that run no pass, such as a tool call. Normal bidding resumes when the
        block ends, also when it raises; nested blocks resume it when the outermost ends.

        A pass run inside the block bids 0 as well, so under contention it waits for free pages.
        """
        handle = self._kv.handle_as_is()
        if self._idle_depth == 0:
            _market.set_idle(handle, True)
        self._idle_depth += 1
        try:
            yield self
        finally:
            self._idle_depth -= 1
            if self._idle_depth == 0 and not self._kv.released:
                _market.set_idle(handle, False)

    def suspend(self) -> None:
        """Give this context's pages back to the pool now (copied to host memory, or dropped
        and recomputed from its tokens later). Nothing else changes: its next pass restores it
        before running, so the same tokens come out.

        Raises:
            PieError: A pass on this context is running, or it can be neither copied to host
                memory nor recomputed (e.g. an adapter it ran with has since changed).
        """
        self._kv.changed()
        _market.suspend(self._handle())

    @property
    def suspended(self) -> bool:
        """True while this context's pages are off the device (by :meth:`suspend`, or because
        it lost an auction); its next pass restores it."""
        return _market.is_suspended(self._kv.handle_as_is())

    # -- lifecycle -------------------------------------------------------------------------
    def release(self) -> None:
        """Force-destroy this context now: its pages return to the pool."""
        self._kv.released = True
        self._kv.changed()
        _host.release(self._ctx)

    def __del__(self) -> None:
        # "KV pages release on drop" (the reference): a context nobody holds any more frees its
        # pages at once instead of when the inferlet ends. Releasing twice is harmless.
        handle = getattr(self, "_ctx", None)
        if handle is not None:
            try:
                _host.release_soon(handle)
            except Exception:  # never raise from a finaliser (e.g. at interpreter exit)
                pass

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    async def __aenter__(self) -> Context:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()

    def _handle(self) -> _types.Context:
        return self._kv.handle  # every host function on a context raises PieError once it is released

    def _extend(self, tokens: Iterable[int]) -> Context:
        self._kv.check_live()
        self._pending.extend(tokens)
        return self


class RawContext:
    """Page-level operations on a context, for custom loops, sliding windows and rollback."""

    def __init__(self, kv: KvCache) -> None:
        self._kv = kv

    def reserve_working_pages(self, n: int) -> None:
        """Pre-allocate ``n`` working pages."""
        self._kv.changed()
        _host.reserve_working_pages(self._kv.handle, n)

    def commit_working_pages(self, k: int) -> None:
        """Promote ``k`` full working pages to committed."""
        self._kv.changed()
        _host.commit_working_pages(self._kv.handle, k)

    def release_working_pages(self, n: int) -> None:
        """Free ``n`` empty working pages."""
        self._kv.changed()
        _host.release_working_pages(self._kv.handle, n)

    def truncate_working_page_tokens(self, n: int) -> None:
        """Drop the last ``n`` tokens (rollback)."""
        self._kv.changed()
        _host.truncate(self._kv.handle, n)
        self._kv.shrank(n)

    def committed_page_count(self) -> int:
        """Number of committed pages."""
        return _host.committed_page_count(self._kv.handle)

    def working_page_count(self) -> int:
        """Number of working pages."""
        return _host.working_page_count(self._kv.handle)

    def working_page_token_count(self) -> int:
        """Tokens in the working pages."""
        return _host.working_page_token_count(self._kv.handle)
