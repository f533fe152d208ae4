"""Host interface ``model``: tokenizers and chat formats of loaded models.

A conversation's chat state is a :class:`~pie_core.models.chat_formats.base.ChatBuilder` made by
:func:`chat_builder`; the ``chat_*`` calls write its turns.
"""

from __future__ import annotations

import copy
from typing import Any

from pie_core.engine.engine import LoadedModel
from pie_core.host.binding import any_thread, current
from pie_core.models.chat_formats.base import ChatBuilder

__all__ = [
    "resolve",
    "vocab_size",
    "tokenize",
    "detokenize",
    "token_bytes",
    "vocabs",
    "special_tokens",
    "split_regex",
    "chat_tokens",
    "chat_builder",
    "chat_system",
    "chat_user",
    "chat_assistant",
    "chat_cue",
    "chat_seal",
    "chat_equip",
    "chat_answer",
    "chat_copy",
    "stop_tokens",
    "reasoning_markers",
]


@any_thread
def resolve(name: str) -> LoadedModel:
    """The loaded model called ``name``: the replica of it the calling inferlet runs on.

    Raises:
        NotFound: No such model is loaded (the message lists the loaded ones).
        BackendError: The inferlet's replica died.
    """
    return current().model(name)


@any_thread
def vocab_size(name: str) -> int:
    """Rows of the model's output layer: valid token ids are ``0 <= id < vocab_size``."""
    return resolve(name).spec.vocab_size


@any_thread
def tokenize(name: str, text: str) -> list[int]:
    """Text to token ids (special tokens written in the text are recognised; no BOS added)."""
    return resolve(name).tokenizer.encode(text)


@any_thread
def detokenize(name: str, tokens: list[int]) -> str:
    """Token ids to text."""
    return resolve(name).tokenizer.decode(list(tokens))


@any_thread
def token_bytes(name: str, tokens: list[int]) -> list[bytes]:
    """The raw bytes each token contributes (for UTF-8-safe incremental decoding)."""
    return resolve(name).tokenizer.token_bytes(list(tokens))


@any_thread
def vocabs(name: str) -> tuple[list[int], list[bytes]]:
    """The full vocabulary as parallel lists of ids and token bytes."""
    return resolve(name).tokenizer.vocabs()


@any_thread
def special_tokens(name: str) -> tuple[list[int], list[bytes]]:
    """Special token ids and their bytes."""
    return resolve(name).tokenizer.special_tokens()


@any_thread
def split_regex(name: str) -> str:
    """The pre-tokenisation split regex."""
    return resolve(name).tokenizer.split_regex()


@any_thread
def chat_tokens(name: str, role: str, text: str = "") -> list[int]:
    """Token ids of one chat piece in the model's format, without conversation state.

    Args:
        name: Model name.
        role: ``system``, ``user``, ``assistant`` (take ``text``), ``cue`` or ``seal``.
        text: The message.

    Raises:
        InvalidInput: Unknown role.
    """
    return _piece(resolve(name).chat, role, text)


@any_thread
def chat_builder(name: str) -> ChatBuilder:
    """A stateful per-conversation builder for the model's chat format (see the ``chat_*`` calls)."""
    return resolve(name).chat.builder()


@any_thread
def chat_system(b: ChatBuilder, text: str) -> list[int]:
    """Tokens of a system message (may be empty when the format defers it)."""
    return list(b.system(text))


@any_thread
def chat_user(b: ChatBuilder, text: str) -> list[int]:
    """Tokens of a complete user turn."""
    return list(b.user(text))


@any_thread
def chat_assistant(b: ChatBuilder, text: str) -> list[int]:
    """Tokens of a complete (pre-filled) assistant turn."""
    return list(b.assistant(text))


@any_thread
def chat_cue(b: ChatBuilder) -> list[int]:
    """Tokens that open the assistant's turn for generation."""
    return list(b.cue())


@any_thread
def chat_seal(b: ChatBuilder) -> list[int]:
    """Tokens that close an assistant turn opened by :func:`chat_cue` after its content."""
    return list(b.seal())


@any_thread
def chat_equip(b: ChatBuilder, tools: list[dict[str, Any]], system: str | None = None) -> list[int]:
    """The opening system turn listing ``tools`` (JSON schemas) as the template writes it.

    Raises:
        InvalidInput: Malformed schemas, or equipping after the first message where the
            template forbids it.
        Unsupported: The model's chat template has no tool support.
    """
    return list(b.equip(tools, system))


@any_thread
def chat_answer(b: ChatBuilder, name: str, value: Any) -> list[int]:
    """A turn carrying tool ``name``'s result (non-strings are JSON-encoded); a format that
    writes consecutive results as one turn may return ``[]`` and write them with the next turn.

    Raises:
        Unsupported: The model's chat template has no tool support.
    """
    return list(b.answer(name, value))


@any_thread
def chat_copy(b: ChatBuilder) -> ChatBuilder:
    """An independent builder in ``b``'s state (a shallow copy: the format is shared)."""
    return copy.copy(b)


@any_thread
def stop_tokens(name: str) -> list[int]:
    """Token ids that end an assistant turn in the model's chat format."""
    return list(resolve(name).chat.stop_tokens)


def _piece(fmt: Any, role: str, text: str) -> list[int]:
    from pie_core.errors import InvalidInput

    if role in ("system", "user", "assistant"):
        return list(getattr(fmt, role)(text))
    if role in ("cue", "seal"):
        return list(getattr(fmt, role)())
    raise InvalidInput(f"unknown chat role {role!r}; use system, user, assistant, cue or seal")


@any_thread
def reasoning_markers(name: str) -> tuple[int, int] | None:
    """Token ids that open and close a reasoning block in the model's format, or None."""
    markers: tuple[int, int] | None = resolve(name).chat.reasoning_marker_ids
    return markers
