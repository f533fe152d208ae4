"""What placement knows of an OpenAI request before its inferlet starts: its prompt's pages.

With one replica nothing is computed. With several, the prompt is tokenized as the built-in
inferlet will (the completion text, or the chat turns through the model's chat format), so the
router can send it to the replica whose prefix cache holds its leading pages.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pie_core.engine.placement import Demand, prompt_keys

if TYPE_CHECKING:
    from pie_core.server.app import PieServer

__all__ = ["demand_of"]

_ROLES = ("system", "user", "assistant")


def demand_of(server: PieServer, args: dict[str, Any]) -> Demand | None:
    """The placement demand of the built-in inferlet's input ``args`` (None with one replica)."""
    replicas = server.engine.replicas.get(args["model"], [])
    if len(replicas) < 2:
        return None
    loaded = replicas[0]
    tokens = _prompt(loaded, args)
    ps = int(loaded.pool.page_size)
    reply = int(args.get("n", 1)) * int(args.get("max_tokens", 0))
    pages = max(1, -(-(len(tokens) + reply) // ps))
    return Demand(pages=pages, keys=prompt_keys(tokens, ps))


def _prompt(loaded: Any, args: dict[str, Any]) -> list[int]:
    """The tokens the inferlet puts in its context first, as far as they are known here."""
    if args.get("mode") != "chat":
        tokens: list[int] = loaded.tokenizer.encode(args.get("prompt") or "")
        return tokens[:-1] if int(args.get("n", 1)) > 1 else tokens  # n > 1 holds the last token back
    if args.get("tools"):
        return []  # the tool preamble comes first; its tokens are the chat format's business
    builder = loaded.chat.builder()
    out: list[int] = []
    for msg in json.loads(args.get("messages") or "[]"):
        role = msg.get("role")
        if role not in _ROLES or not isinstance(msg.get("content"), str):
            break  # a tool answer: the prefix known here ends before it
        out += getattr(builder, role)(msg["content"])
    return out
