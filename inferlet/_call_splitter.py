"""Streamed reply text split at tool-call markers (Qwen's ``<tool_call>`` ... ``</tool_call>``),
for :class:`inferlet.events.Decoder`: the user's text on one side, each call's block on the other.

A marker can arrive in pieces (``<t``, ``ool_c``, ``all>``), so text that may be the start of the
opening marker is held back until it is one (then it is not text) or turns out not to be one
(then it is released, with the text after it). Nothing of a marker or of a call's block is ever
text. One newline right before an opening marker goes with it: it is the separator chat
templates write between a reply's text and its calls, and between calls (``\\n<tool_call>``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CallSplitter", "Opened", "Closed", "Piece"]

_SEPARATOR = "\n"


@dataclass(frozen=True, slots=True)
class Opened:
    """The opening marker completed: a call's block follows."""


@dataclass(frozen=True, slots=True)
class Closed:
    """The closing marker completed: ``block`` is the text between the markers."""

    block: str


Piece = str | Opened | Closed
"""What :meth:`CallSplitter.feed` returns, in order: text outside calls (a ``str``), or a
call's boundary."""


class CallSplitter:
    """Splits reply text fed in chunks into text outside calls and the calls' blocks.

    Args:
        begin: The opening marker (``"<tool_call>"``), not empty.
        end: The closing marker (``"</tool_call>"``), not empty.
    """

    def __init__(self, begin: str, end: str) -> None:
        if not begin or not end:
            raise ValueError(f"a call splitter needs both markers, got begin={begin!r} and end={end!r}")
        self._begin, self._end = begin, end
        self.reset()

    @property
    def markers(self) -> tuple[str, str]:
        """The opening and closing markers."""
        return self._begin, self._end

    @property
    def inside(self) -> bool:
        """Whether a call's opening marker came and its closing marker has not yet."""
        return self._inside

    def reset(self) -> None:
        """Forget everything fed so far (back to outside a call, nothing held)."""
        self._buf = ""  # outside: the held tail that may start a marker; inside: the block so far
        self._scanned = 0  # inside: where the search for the closing marker resumes
        self._inside = False

    def feed(self, text: str) -> list[Piece]:
        """Add ``text``; return what it completes, in order (text may be held back, see the
        module docstring)."""
        self._buf += text
        out: list[Piece] = []
        while True:
            if self._inside:
                at = self._buf.find(self._end, self._scanned)
                if at < 0:
                    self._scanned = max(0, len(self._buf) - len(self._end) + 1)
                    return out
                out.append(Closed(self._buf[:at]))
                self._buf, self._inside = self._buf[at + len(self._end):], False
                continue
            at = self._buf.find(self._begin)
            if at < 0:
                held = max(_partial(self._buf, self._begin), _partial(self._buf, _SEPARATOR + self._begin))
                if len(self._buf) > held:
                    out.append(self._buf[:len(self._buf) - held])
                    self._buf = self._buf[len(self._buf) - held:]
                return out
            before = self._buf[:at].removesuffix(_SEPARATOR)
            if before:
                out.append(before)
            self._buf, self._inside, self._scanned = self._buf[at + len(self._begin):], True, 0
            out.append(Opened())

    def finish(self) -> list[Piece]:
        """The reply ended: text held back was no marker after all and comes out; the block of a
        call that never closed is dropped (it is no text either). Then :meth:`reset`."""
        held = "" if self._inside else self._buf
        self.reset()
        return [held] if held else []


def _partial(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that ``marker`` starts with (shorter than it)."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
