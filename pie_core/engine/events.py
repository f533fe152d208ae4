"""Events an inferlet instance emits to its client (DESIGN.md §7)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Event", "EVENT_KINDS"]

EVENT_KINDS = ("stdout", "stderr", "file", "return", "error")


@dataclass(frozen=True, slots=True)
class Event:
    """One event: ``stdout`` (session.send text), ``stderr``, ``file`` (bytes), ``return``
    (main's value, JSON-serialisable) or ``error`` (exception text)."""

    kind: str
    value: Any

    def __post_init__(self) -> None:
        if self.kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {self.kind!r}; kinds: {', '.join(EVENT_KINDS)}")

    @property
    def is_terminal(self) -> bool:
        return self.kind in ("return", "error")
