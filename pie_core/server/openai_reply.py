"""OpenAI response shapes from the ``openai-compat`` inferlet's messages: choices, logprobs, tool calls."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["Choice", "Logprobs", "tool_call", "chat_message", "usage"]

TokenBytes = Callable[[list[int]], list[bytes]]


class Logprobs:
    """Renders the inferlet's ``[id, logprob, [[id, logprob], ...]]`` entries with the model's token bytes."""

    def __init__(self, token_bytes: TokenBytes) -> None:
        self._bytes = token_bytes

    def _pieces(self, entries: list[list[Any]]) -> dict[int, bytes]:
        ids = sorted({int(e[0]) for e in entries} | {int(a[0]) for e in entries for a in e[2]})
        return dict(zip(ids, self._bytes(ids)))

    def chat(self, entries: list[list[Any]]) -> list[dict[str, Any]]:
        """``logprobs.content`` items: ``{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}``."""
        pieces = self._pieces(entries)

        def item(tok: int, lp: float) -> dict[str, Any]:
            raw = pieces[int(tok)]
            return {"token": _text(raw), "logprob": float(lp), "bytes": list(raw)}

        return [{**item(e[0], e[1]), "top_logprobs": [item(t, lp) for t, lp in e[2]]} for e in entries]

    def legacy(self, entries: list[list[Any]], offset: int) -> dict[str, Any]:
        """``/v1/completions`` logprobs: ``{tokens, token_logprobs, top_logprobs, text_offset}``;
        ``offset`` is where the first token's text starts in the choice's text."""
        pieces = self._pieces(entries)
        tokens, offsets = [], []
        for e in entries:
            text = _text(pieces[int(e[0])])
            tokens.append(text)
            offsets.append(offset)
            offset += len(pieces[int(e[0])].decode("utf-8", "ignore"))
        return {"tokens": tokens, "token_logprobs": [float(e[1]) for e in entries],
                "top_logprobs": [{_text(pieces[int(t)]): float(lp) for t, lp in e[2]} for e in entries],
                "text_offset": offsets}


def _text(raw: bytes) -> str:
    """A token's text; bytes that are not whole UTF-8 characters show as ``\\xNN`` (as OpenAI does)."""
    return raw.decode("utf-8", "backslashreplace")


def tool_call(name: str, args: str, index: int | None = None) -> dict[str, Any]:
    """One ``tool_calls`` item (``index`` for a streamed delta)."""
    call: dict[str, Any] = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                            "function": {"name": name, "arguments": args}}
    return call if index is None else {"index": index, **call}


@dataclass(slots=True)
class Choice:
    """What one choice has produced so far."""

    index: int
    text: list[str] = field(default_factory=list)
    entries: list[list[Any]] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    chars: int = 0  # characters of text so far (completions' text_offset)


def chat_message(choice: Choice) -> dict[str, Any]:
    """A whole chat choice's ``message``: content (null beside tool calls when there is no text)."""
    text = "".join(choice.text)
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if choice.calls:
        message["content"] = text or None
        message["tool_calls"] = choice.calls
    return message


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
