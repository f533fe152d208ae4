"""Feeding a conversation through a chat builder, shared by the chat-format tests."""

from __future__ import annotations

from typing import Any

BASE_CONVERSATIONS = [
    [("user", "Hi there"), ("cue", None)],
    [("system", "You are terse."), ("user", "Hi there"), ("cue", None)],
    [("system", "Be exact.\n"), ("user", "  2+2? \n"), ("assistant", " 4 "), ("user", "and 3+3?"), ("cue", None)],
    [("user", "write code"), ("assistant", "```py\nprint('hi')\n```"), ("user", "中文 🤗\n\n\tok")],
    [("user", "one"), ("assistant", "two"), ("user", "three"), ("assistant", "four"), ("user", "five"), ("cue", None)],
]
"""Conversations every chat format must render exactly like its template."""


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
