"""Rendering a model's Jinja chat template the way transformers does.

Used as the oracle the family builders are tested against, to probe a template for facts
(Qwen's default system prompt), and by :class:`TemplateFormat` for families without a
hand-written builder.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from pie_core.errors import InvalidInput

__all__ = ["render_chat_template", "Message"]

Message = dict[str, Any]


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(template)


def render_chat_template(
    template: str,
    messages: list[Message],
    *,
    add_generation_prompt: bool = False,
    bos_token: str = "",
    eos_token: str = "",
    tools: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> str:
    """Render ``messages`` through a chat template.

    Args:
        template: Jinja source (GGUF ``tokenizer.chat_template`` or ``tokenizer_config.json``).
        messages: ``{"role": ..., "content": ...}`` dicts.
        add_generation_prompt: Append the cue that starts the assistant's turn.
        bos_token: Text of the BOS token (templates that write it use ``{{ bos_token }}``).
        eos_token: Text of the EOS token.
        tools: Tool schemas for templates that support them.
        **extra: Further template variables (e.g. ``enable_thinking``).

    Returns:
        The rendered prompt text.

    Raises:
        InvalidInput: The template rejects the conversation (``raise_exception``) or fails.
    """
    try:
        return _compile(template).render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
            tools=tools,
            **extra,
        )
    except jinja2.exceptions.TemplateError as e:
        raise InvalidInput(f"chat template rejected the conversation: {e}") from e
