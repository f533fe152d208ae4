"""The streaming reasoning decoder: ``from inferlet import reasoning``.

Models that think before they answer (Qwen 3: ``<think>\\n...\\n</think>\\n\\n``) write their
reasoning between two marker tokens. :class:`Decoder` watches generated tokens for them and
reports the reasoning as it streams; the answer after the end marker is left to
:class:`inferlet.chat.Decoder`.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import Iterable

from inferlet.host import model as _host
from inferlet.model import Model

__all__ = ["Event", "Decoder"]


class Event:
    """Events :meth:`Decoder.feed` returns (match on ``reasoning.Event.Delta(text=t)`` etc.)."""

    @dataclass(frozen=True, slots=True)
    class Idle:
        """Nothing new: outside reasoning, or no complete reasoning text in the batch."""

    @dataclass(frozen=True, slots=True)
    class Start:
        """The start marker was generated; reasoning follows."""

    @dataclass(frozen=True, slots=True)
    class Delta:
        """New reasoning text."""

        text: str

    @dataclass(frozen=True, slots=True)
    class End:
        """The end marker was generated: ``text`` is the full reasoning (markers excluded)."""

        text: str


class Decoder:
    """Turns generated token ids into reasoning events, safe across split UTF-8 sequences.

    One event per :meth:`feed`. When a batch holds more than one boundary the most final one
    is reported: End over Start; reasoning text that follows a Start in the same batch comes
    with the next Delta (and always in End's full text). Tokens after the end marker are not
    reasoning and are ignored until the next start marker. A model whose chat format has no
    reasoning markers never leaves Idle.
    """

    def __init__(self, model: Model, markers: tuple[int, int] | None = None) -> None:
        """Watch ``model``'s generations.

        Args:
            model: The model generating.
            markers: ``(start, end)`` token ids; default: the model's chat format's
                reasoning markers (``None`` when it has none).
        """
        self._model = model.name
        self._markers = markers if markers is not None else _host.reasoning_markers(model.name)
        self.reset()

    @property
    def markers(self) -> tuple[int, int] | None:
        """The ``(start, end)`` marker token ids watched for, or ``None``."""
        return self._markers

    @property
    def inside(self) -> bool:
        """Whether the decoder is between a start marker and its end marker."""
        return self._inside

    def reset(self) -> None:
        """Forget everything fed so far (back to outside reasoning)."""
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._inside = False
        self._parts: list[str] = []
        self._pending: list[str] = []

    def feed(self, tokens: Iterable[int]) -> Event.Idle | Event.Start | Event.Delta | Event.End:
        """Consume tokens; return End at the end marker, Start at the start marker, else
        Delta with the newly complete reasoning text (Idle if none)."""
        tokens = list(tokens)
        if self._markers is None or not tokens:
            return Event.Idle()
        start, end = self._markers
        if not self._inside and start not in tokens:
            return Event.Idle()
        pieces = _host.token_bytes(self._model, tokens)
        started = False
        for tok, piece in zip(tokens, pieces):
            if not self._inside:
                if tok == start:
                    self._inside, started = True, True
                continue
            if tok == end:
                self._pending.append(self._utf8.decode(b"", final=True))
                self._parts.extend(self._pending)
                full = "".join(self._parts)
                self.reset()
                return Event.End(full)
            if tok != start:  # a repeated start marker is not text
                self._pending.append(self._utf8.decode(piece))
        if started:
            return Event.Start()
        text = "".join(self._pending)
        self._parts.extend(self._pending)
        self._pending = []
        return Event.Delta(text) if text else Event.Idle()

    def text(self) -> str:
        """Reasoning decoded since the last start marker (incomplete bytes excluded)."""
        return "".join(self._parts + self._pending)
