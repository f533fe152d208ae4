"""Feeding a conversation through a chat builder, shared by the chat-format tests."""

from __future__ import annotations

from typing import Any


def build_conversation(builder: Any, conversation: list) -> tuple[list[int], list[dict[str, str]], bool]:
    """Ids from the builder, the messages a template renders, and whether it ended with a cue."""
    ids: list[int] = []
    messages: list[dict[str, str]] = []
    cue = False
    for role, text in conversation:
        if role == "cue":
            ids += builder.cue()
            cue = True
        else:
            ids += getattr(builder, role)(text)
            messages.append({"role": role, "content": text})
    return ids, messages, cue
