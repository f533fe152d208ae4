"""Chat formatting helpers and the streaming chat decoder: ``from inferlet import chat``."""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import Iterable

from inferlet.host import model as _host
from inferlet._keywords import renamed
from inferlet.model import Model

__all__ = ["Event", "Decoder", "system", "user", "assistant", "cue", "seal", "stop_tokens"]


class Event:
    """Events :meth:`Decoder.feed` returns (match on ``chat.Event.Delta(text=t)`` etc.)."""

    @dataclass(frozen=True, slots=True)
    class Idle:
        """The batch had no semantic boundary and no new visible text."""

    @dataclass(frozen=True, slots=True)
    class Delta:
        """New visible text."""

        text: str

    @dataclass(frozen=True, slots=True)
    class Done:
        """End of turn: ``text`` is the full reply."""

        text: str

    @dataclass(frozen=True, slots=True)
    class Interrupt:
        """The model produced a control token that is not a stop token."""

        token: int


class Decoder:
    """Turns generated token ids into text events, safe across split UTF-8 sequences."""

    def __init__(self, model: Model) -> None:
        self._model = model.name
        self._stop = frozenset(_host.stop_tokens(model.name))
        self._special = frozenset(_host.special_tokens(model.name)[0])
        self.reset()

    def reset(self) -> None:
        """Forget everything fed so far."""
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._parts: list[str] = []

    def feed(self, tokens: Iterable[int]) -> Event.Idle | Event.Delta | Event.Done | Event.Interrupt:
        """Consume tokens; return Done at a stop token, Interrupt at another control token,
        else Delta with the newly complete text (Idle if none)."""
        tokens = list(tokens)
        delta: list[str] = []
        pieces = _host.token_bytes(self._model, tokens) if tokens else []
        for tok, piece in zip(tokens, pieces):
            if tok in self._stop:
                delta.append(self._utf8.decode(b"", final=True))
                self._parts.extend(delta)
                full = "".join(self._parts)
                self.reset()
                return Event.Done(full)
            if tok in self._special:
                self._parts.extend(delta)
                return Event.Interrupt(tok)
            delta.append(self._utf8.decode(piece))
        text = "".join(delta)
        self._parts.append(text)
        return Event.Delta(text) if text else Event.Idle()

    def text(self) -> str:
        """Everything decoded since the last Done or reset (incomplete bytes excluded)."""
        return "".join(self._parts)


@renamed(msg="message")
def system(model: Model, message: str) -> list[int]:
    """Token ids of a system message (``message`` is also accepted as ``msg=``)."""
    return _host.chat_tokens(model.name, "system", message)


@renamed(msg="message")
def user(model: Model, message: str) -> list[int]:
    """Token ids of a user message (``message`` is also accepted as ``msg=``)."""
    return _host.chat_tokens(model.name, "user", message)


@renamed(msg="message")
def assistant(model: Model, message: str) -> list[int]:
    """Token ids of a complete assistant turn (``message`` is also accepted as ``msg=``)."""
    return _host.chat_tokens(model.name, "assistant", message)


def cue(model: Model) -> list[int]:
    """Token ids that open the model's turn."""
    return _host.chat_tokens(model.name, "cue")


def seal(model: Model) -> list[int]:
    """Token ids that close an assistant turn."""
    return _host.chat_tokens(model.name, "seal")


def stop_tokens(model: Model) -> list[int]:
    """Token ids that end the model's turn."""
    return _host.stop_tokens(model.name)
