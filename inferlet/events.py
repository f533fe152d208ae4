"""Decoded generation: ``async for event in ctx.generate(sampler, decode=True): ...`` (or,
where the runner lets an inferlet block, ``for event in ...``; see :mod:`inferlet._blocking`).

:class:`Decoder` turns generated token ids into :class:`Event` values, built on
:class:`inferlet.chat.Decoder` (visible text, end of turn) and, with ``reasoning=True``,
:class:`inferlet.reasoning.Decoder` (the model's thinking block). :class:`EventStream` drives a
:class:`~inferlet.generator.Generator` and yields those events, ending with ``Event.Done``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Union

from inferlet import _blocking, chat, reasoning as _reasoning
from inferlet._call_splitter import CallSplitter, Closed, Opened
from inferlet.generator import Generator
from inferlet.host import model as _host_model
from inferlet.host import tools as _host_tools
from inferlet.model import Model

__all__ = ["Event", "Decoder", "EventStream"]


class Event:
    """Events of a decoded generation (match on ``Event.Text(text=t)`` etc.)."""

    @dataclass(frozen=True, slots=True)
    class Text:
        """A chunk of the visible reply."""

        text: str

    @dataclass(frozen=True, slots=True)
    class Thinking:
        """A chunk of the model's reasoning (only with ``reasoning=True``)."""

        text: str

    @dataclass(frozen=True, slots=True)
    class ThinkingDone:
        """The reasoning block closed (or generation ended inside it): ``text`` is all of it."""

        text: str

    @dataclass(frozen=True, slots=True)
    class ToolCallStart:
        """A tool call started assembling (only with ``tool_use=True``)."""

    @dataclass(frozen=True, slots=True)
    class ToolCall:
        """A complete tool call: ``arguments`` is JSON text."""

        name: str
        arguments: str

    @dataclass(frozen=True, slots=True)
    class Done:
        """Generation finished: ``text`` is the whole visible reply (reasoning excluded)."""

        text: str


AnyEvent = Union[Event.Text, Event.Thinking, Event.ThinkingDone, Event.ToolCallStart, Event.ToolCall, Event.Done]


def _bare_call_decoder(model: Model) -> Any:
    """The detector of calls without markers (Llama 3's bare JSON reply) behind ``tool_use=True``
    (its Start/Call events become ToolCallStart/ToolCall)."""
    from inferlet import tools  # imported here: tools pulls in the grammar machinery

    return tools.Decoder(model)


class Decoder:
    """Turns generated token ids into :class:`Event` values, one batch at a time.

    Visible text streams as ``Event.Text``; a chat-format stop token (or :meth:`finish`) gives
    ``Event.Done`` with the whole reply. With ``reasoning=True`` the tokens between the chat
    format's reasoning markers (Qwen 3's ``<think>`` ... ``</think>``) stream as
    ``Event.Thinking`` and close with ``Event.ThinkingDone``; the newlines the format puts
    between ``</think>`` and the answer are not part of the reply. A model whose format has no
    reasoning markers never thinks. With ``tool_use=True`` a tool call in the model's own
    syntax (:mod:`inferlet.tools`) gives ``Event.ToolCallStart`` when it opens and
    ``Event.ToolCall(name, arguments)`` when it completes; its text (its markers, and the
    newline chat templates write before the opening one) is neither a Text event nor part of
    Done's reply. Text that may be the start of a call's
    marker (``<tool`` of ``<tool_call>``) is held back until the marker completes or turns out
    not to be one; a call cut off by the end of the reply is not text either.
    Text is UTF-8 safe: a character split across tokens comes out whole, once complete.
    """

    def __init__(self, model: Model, *, reasoning: bool = False, tool_use: bool = False) -> None:
        """Watch ``model``'s generations (``reasoning``/``tool_use``: also report those)."""
        self._model = model.name
        self._calls: CallSplitter | None = None  # calls between markers (Qwen's <tool_call>): cut out of the text
        self._tools: Any = None  # a bare JSON call (Llama 3): recognised token by token
        syntax = _host_tools.syntax(model.name) if tool_use else None
        if syntax is not None and syntax.begin:
            self._calls = CallSplitter(syntax.begin, syntax.end)
        elif syntax is not None:
            self._tools = _bare_call_decoder(model)
        self._chat = chat.Decoder(model)
        self._thinking = _reasoning.Decoder(model) if reasoning else None
        if self._thinking is not None and self._thinking.markers is None:
            self._thinking = None
        self.reset()

    def reset(self) -> None:
        """Forget everything fed so far."""
        self._chat.reset()
        if self._thinking is not None:
            self._thinking.reset()
        if self._tools is not None:
            self._tools.reset()
        if self._calls is not None:
            self._calls.reset()
        self._reply: list[str] = []
        self._after_thinking = False

    def feed(self, tokens: Iterable[int]) -> list[AnyEvent]:
        """Consume generated tokens; return the events they complete, in order (often none)."""
        events: list[AnyEvent] = []
        for tok in tokens:
            if self._thinks(tok):
                events.extend(self._feed_thinking(tok))
                continue
            in_call = self._feed_tools(tok, events)
            ev = self._chat.feed([tok])
            if isinstance(ev, chat.Event.Delta) and not in_call:
                events.extend(self._visible(ev.text))
            elif isinstance(ev, chat.Event.Done):
                events.extend(self._end())
            elif isinstance(ev, chat.Event.Interrupt) and self._calls is not None:
                events.extend(self._visible(self._marker_text(ev.token)))
            # Idle (an incomplete character) and Interrupt (another control token) add no text.
        return events

    def finish(self) -> list[AnyEvent]:
        """End the turn without a stop token (e.g. ``max_tokens`` reached): close an open
        reasoning block, then ``Done`` with the reply so far (an incomplete trailing
        character is dropped)."""
        events: list[AnyEvent] = []
        if self._thinking is not None and self._thinking.inside:
            events.append(Event.ThinkingDone(self._thinking.text()))
        return events + self._end()

    def _end(self) -> list[AnyEvent]:
        """The text held back (no marker after all), then ``Done``; the decoder starts afresh."""
        events: list[AnyEvent] = []
        if self._calls is not None:
            for piece in self._calls.finish():
                events.extend(self._text(piece))
        events.append(Event.Done("".join(self._reply)))
        self.reset()
        return events

    def _visible(self, text: str) -> list[AnyEvent]:
        """Events for newly decoded reply text: Text outside calls, ToolCallStart/ToolCall at
        the markers of a call."""
        if self._calls is None:
            return self._text(text)
        events: list[AnyEvent] = []
        for piece in self._calls.feed(text):
            if isinstance(piece, Opened):
                events.append(Event.ToolCallStart())
            elif isinstance(piece, Closed):
                begin, end = self._calls.markers
                for name, args in _host_tools.parse_calls(self._model, begin + piece.block + end):
                    events.append(Event.ToolCall(name, args))
            else:
                events.extend(self._text(piece))
        return events

    def _marker_text(self, token: int) -> str:
        """A control token's text where it is a call marker (a tokenizer may mark them special),
        else ""."""
        assert self._calls is not None
        text = _host_model.token_bytes(self._model, [token])[0].decode("utf-8", "replace")
        return text if text in self._calls.markers else ""

    def _feed_tools(self, tok: int, events: list[AnyEvent]) -> bool:
        """Feed the tool-call detector; True while ``tok`` belongs to a call."""
        tools = self._tools
        if tools is None:
            return False
        was_inside = tools.inside
        ev = tools.feed([tok])
        while True:
            name = type(ev).__name__
            if name == "Start":
                events.append(Event.ToolCallStart())
            elif name == "Call":
                events.append(Event.ToolCall(ev.name, ev.args))
            else:
                break
            ev = tools.feed([])  # a batch may complete several calls; they come one per feed
            was_inside = True
        return was_inside or tools.inside

    def _thinks(self, tok: int) -> bool:
        t = self._thinking
        return t is not None and (t.inside or (t.markers is not None and tok == t.markers[0]))

    def _feed_thinking(self, tok: int) -> list[AnyEvent]:
        assert self._thinking is not None
        ev = self._thinking.feed([tok])
        if isinstance(ev, _reasoning.Event.Delta):
            return [Event.Thinking(ev.text)]
        if isinstance(ev, _reasoning.Event.End):
            self._after_thinking = True
            return [Event.ThinkingDone(ev.text)]
        return []

    def _text(self, text: str) -> list[AnyEvent]:
        if self._after_thinking:  # the format's separator after </think>, not the reply
            text = text.lstrip("\n")
            self._after_thinking = not text
        if not text:
            return []
        self._reply.append(text)
        return [Event.Text(text)]


class EventStream:
    """A generator's output as events: ``async for event in ctx.generate(s, decode=True)``.

    Each iteration runs generator steps until they complete an event. The stream ends after
    ``Event.Done``, which always comes last: at the generator's stop token (not part of the
    text, nor of the accepted tokens) or when ``max_tokens`` ends it. Leaving the loop early
    (``break``) just stops generating; the context keeps what was generated so far.

    ``for event in stream`` (the readme's form) does the same, blocking, where the runner lets
    an inferlet block (the process and wasm runners); in-process it raises
    :class:`~inferlet.host.errors.Unsupported`. :meth:`text` and :meth:`tokens` called from
    synchronous code (``def main``) there return their values.
    """

    def __init__(self, generator: Generator, decoder: Decoder) -> None:
        self._gen = generator
        self._dec = decoder
        self._pending: deque[AnyEvent] = deque()
        self._ended = False

    @property
    def generator(self) -> Generator:
        """The underlying generator (builder methods, ``tokens_generated``, ``is_done``)."""
        return self._gen

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> AnyEvent:
        while not self._pending:
            if self._ended:
                raise StopAsyncIteration
            self._queue(await self._step())
        return self._pending.popleft()

    def __iter__(self) -> Iterator[AnyEvent]:
        """``for event in stream``: the same events, blocking for each.

        Raises:
            Unsupported: The runner cannot block (in-process): write ``async for``.
        """
        return _blocking.iterate(self, "for event in ctx.generate(..., decode=True)")

    @_blocking.awaitable("stream.text()")
    async def text(self) -> str:
        """Run to the end and return ``Event.Done``'s text (the whole visible reply)."""
        done = ""
        async for event in self:
            if isinstance(event, Event.Done):
                done = event.text
        return done

    @_blocking.awaitable("stream.tokens()")
    async def tokens(self) -> list[int]:
        """Run to the end and return every token the generator accepted (not the stop token)."""
        async for _ in self:
            pass
        return await self._gen.collect_tokens()  # already done: returns what it accepted

    async def _step(self) -> list[AnyEvent]:
        gen = self._gen
        if gen.is_done:
            return self._dec.finish()
        out = await (await gen.__anext__()).execute()
        events = self._dec.feed(out.tokens)  # a stop token is not among them
        if gen.is_done and not any(isinstance(e, Event.Done) for e in events):
            events += self._dec.finish()
        return events

    def _queue(self, events: list[AnyEvent]) -> None:
        for event in events:
            self._pending.append(event)
            if isinstance(event, Event.Done):
                self._ended = True
                return
