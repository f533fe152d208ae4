"""Tool use: ``from inferlet import tools``.

- :func:`equip_prefix` / :func:`answer_prefix`: the tokens that list tools and carry a tool's
  result, exactly as the model's chat template writes them (``ctx.equip_tools`` and
  ``ctx.answer_tool`` do the same on a context's conversation).
- :class:`Decoder`: watches generated tokens for the model's tool calls.
- :func:`parse_call`: the first complete call in a finished reply.
- :func:`native_grammar` / :func:`native_matcher`: a grammar (or a matcher walking it) over the
  model's own call syntax, so calls always parse and their arguments follow the tools' schemas.

Call syntaxes: Qwen 2.5 and Qwen 3 write ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n
</tool_call>`` (several per reply allowed); Llama 3 writes a bare ``{"name": ..., "parameters":
{...}}``. Models with no known syntax get ``None`` from :func:`native_grammar` and
:func:`native_matcher` and no events from :class:`Decoder`: generate freely and parse the text
yourself.
"""

from __future__ import annotations

import codecs
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable

from inferlet.host import grammar as _grammar
from inferlet.host import model as _model
from inferlet.host import tools as _host
from inferlet._keywords import renamed
from inferlet.grammar import Grammar, Matcher
from inferlet.model import Model

__all__ = ["Event", "Decoder", "equip_prefix", "answer_prefix", "parse_call", "native_grammar", "native_matcher"]


class Event:
    """Events :meth:`Decoder.feed` returns (match on ``tools.Event.Call(name=n, args=a)``)."""

    @dataclass(frozen=True, slots=True)
    class Idle:
        """No tool-call boundary in this batch."""

    @dataclass(frozen=True, slots=True)
    class Start:
        """A tool call started assembling."""

    @dataclass(frozen=True, slots=True)
    class Call:
        """A complete call: the tool's ``name`` and its JSON-encoded ``args``."""

        name: str
        args: str


@renamed(schemas="tools")
def equip_prefix(model: Model, tools: Iterable[Any]) -> list[int]:
    """Tokens that register the tool schemas the way the model's chat template does.

    They open the conversation (system turn and tool list; for Llama 3 the system turn holds
    the tools): ``ctx.append`` them first, then the user's message with
    ``ctx.append(chat.user(model, text))``. ``ctx.equip_tools(schemas)`` does it on the
    context's own conversation.

    Args:
        model: The model.
        tools: One JSON Schema per tool (also accepted as ``schemas=``), as dicts or JSON
            text, either ``{"type": "function", "function": {"name", "description",
            "parameters"}}`` or the bare ``{"name", "description", "parameters"}``.

    Raises:
        InvalidInput: A schema without a name, or two tools with one name.
        Unsupported: The model's chat template has no tool support.
    """
    return _host.equip_prefix(model.name, list(tools))


def answer_prefix(model: Model, name: str, value: Any) -> list[int]:
    """Tokens of a turn that carries tool ``name``'s result to the model.

    Args:
        model: The model.
        name: The tool that was called.
        value: Its result: a string, or a dict/list (JSON-encoded as the template does).

    Raises:
        Unsupported: The model's chat template has no tool support.
    """
    return _host.answer_prefix(model.name, name, value)


def parse_call(model: Model, text: str) -> Event.Call | None:
    """The first complete tool call in ``text`` (a reply in the model's call syntax), or None.

    Raises:
        InvalidInput: A closed call block whose content is not a valid call.
    """
    calls = _host.parse_calls(model.name, text)
    return Event.Call(*calls[0]) if calls else None


@renamed(schemas="tools")
def native_grammar(model: Model, tools: Iterable[Any], *, choice: str = "auto") -> Grammar | None:
    """The grammar of the model's native tool-call syntax for these tools, or None.

    With ``choice="auto"`` the reply may be text or calls, and every call names one of the
    tools with arguments matching its ``parameters`` schema; ``"required"`` asks for at least
    one call; a tool's name forces a call to it. A Grammar is a Schema, so it constrains a
    generator as it is (``ctx.generate(s, constrain=grammar)``), each generator walking it
    with its own matcher; the grammar is compiled once per model however often it is used.

    Args:
        model: The model whose chat format writes the calls.
        tools: The tools' schemas, as for :func:`equip_prefix` (also accepted as ``schemas=``).
        choice: ``"auto"``, ``"required"`` or one tool's name.

    Returns:
        None when the model's chat format has no known tool-call syntax: generate freely and
        parse the reply yourself.

    Raises:
        InvalidInput: Malformed schemas or an unknown ``choice``.
    """
    source = _host.call_grammar(model.name, list(tools), choice)
    return None if source is None else Grammar(source)


@renamed(schemas="tools")
def native_matcher(
    model: Model, tools: Iterable[Any], *, choice: str = "auto", compile_timeout: float | None = None
) -> Matcher | None:
    """A Matcher over :func:`native_grammar` (same arguments), or None when that is None.

    Wrap it to constrain one generator:
    ``ctx.generate(s, constrain=GrammarConstraint(tools.native_matcher(model, tools)))``.

    Raises:
        InvalidInput: Malformed schemas, an unknown ``choice``, or a parameters schema that
            cannot be compiled.
    """
    grammar = native_grammar(model, tools, choice=choice)
    return None if grammar is None else Matcher(grammar, model, compile_timeout=compile_timeout)


class Decoder:
    """Turns generated token ids into tool-call events, safe across split UTF-8 sequences.

    Qwen-style calls start at ``<tool_call>`` (Start) and complete at ``</tool_call>`` (Call);
    a Llama-style call starts when the reply's text opens with ``{`` and completes when that
    JSON object closes. Text outside calls is ignored (use :class:`inferlet.chat.Decoder` for
    it). One event per :meth:`feed`; when a batch completes more than one call, the others are
    returned by the following feeds (``feed([])`` drains them).
    """

    def __init__(self, model: Model) -> None:
        self._model = model.name
        self._syntax = _host.syntax(model.name)
        self._stop = frozenset(_grammar.stop_ids(model.name))
        self.reset()

    def reset(self) -> None:
        """Forget everything fed so far."""
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._text = ""
        self._seen = 0  # calls already reported (or queued)
        self._started = False
        self._queue: deque[Event.Call] = deque()

    @property
    def inside(self) -> bool:
        """Whether a call has started and not yet completed."""
        return self._started

    def feed(self, tokens: Iterable[int]) -> Event.Idle | Event.Start | Event.Call:
        """Consume tokens; return Call when a call completes, Start when one begins, else Idle.

        Raises:
            InvalidInput: A call block closed with content that is not a valid call.
        """
        tokens = [int(t) for t in tokens]
        if self._syntax is None:
            return Event.Idle()
        visible = tokens[: next((i for i, t in enumerate(tokens) if t in self._stop), len(tokens))]
        if visible:
            pieces = _model.token_bytes(self._model, visible)
            self._text += "".join(self._utf8.decode(p) for p in pieces)
        calls = _host.parse_calls(self._model, self._text)
        for name, args in calls[self._seen :]:
            self._queue.append(Event.Call(name, args))
        self._seen = len(calls)
        opened = self._opened()
        if self._queue:
            self._started = opened
            return self._queue.popleft()
        if opened and not self._started:
            self._started = True
            return Event.Start()
        return Event.Idle()

    def _opened(self) -> bool:
        """Whether the text holds a call that has started but not completed."""
        assert self._syntax is not None
        if self._syntax.begin:
            return self._text.count(self._syntax.begin) > self._text.count(self._syntax.end)
        head = self._text.lstrip()
        return head.startswith("{") and self._seen == 0
