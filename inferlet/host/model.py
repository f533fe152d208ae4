"""Host interface ``model``: tokenizers and chat formats of loaded models.

A conversation's chat state is a :class:`~pie_core.models.chat_formats.base.ChatBuilder` made by
:func:`chat_builder`; the ``chat_*`` calls write its turns.
"""

from __future__ import annotations

from typing import Any

from inferlet.host._declare import host
from inferlet.host.types import ChatBuilder, Model

__all__ = ["chat_answer", "chat_assistant", "chat_builder", "chat_copy", "chat_cue", "chat_equip", "chat_seal",
           "chat_system", "chat_tokens", "chat_user", "detokenize", "reasoning_markers", "resolve",
           "special_tokens", "split_regex", "stop_tokens", "token_bytes", "tokenize", "vocab_size", "vocabs"]


@host
def chat_answer(b: ChatBuilder, name: str, value: Any) -> list[int]:
    """A turn carrying tool ``name``'s result (non-strings are JSON-encoded); a format that
    writes consecutive results as one turn may return ``[]`` and write them with the next turn.

    Raises:
        Unsupported: The model's chat template has no tool support.
    """


@host
def chat_assistant(b: ChatBuilder, text: str) -> list[int]:
    """Tokens of a complete (pre-filled) assistant turn."""


@host
def chat_builder(name: str) -> ChatBuilder:
    """A stateful per-conversation builder for the model's chat format (see the ``chat_*`` calls)."""


@host
def chat_copy(b: ChatBuilder) -> ChatBuilder:
    """An independent builder in ``b``'s state (a shallow copy: the format is shared)."""


@host
def chat_cue(b: ChatBuilder) -> list[int]:
    """Tokens that open the assistant's turn for generation."""


@host
def chat_equip(b: ChatBuilder, tools: list[dict[str, Any]], system: str | None = None) -> list[int]:
    """The opening system turn listing ``tools`` (JSON schemas) as the template writes it.

    Raises:
        InvalidInput: Malformed schemas, or equipping after the first message where the
            template forbids it.
        Unsupported: The model's chat template has no tool support.
    """


@host
def chat_seal(b: ChatBuilder) -> list[int]:
    """Tokens that close an assistant turn opened by :func:`chat_cue` after its content."""


@host
def chat_system(b: ChatBuilder, text: str) -> list[int]:
    """Tokens of a system message (may be empty when the format defers it)."""


@host
def chat_tokens(name: str, role: str, text: str = '') -> list[int]:
    """Token ids of one chat piece in the model's format, without conversation state.

    Args:
        name: Model name.
        role: ``system``, ``user``, ``assistant`` (take ``text``), ``cue`` or ``seal``.
        text: The message.

    Raises:
        InvalidInput: Unknown role.
    """


@host
def chat_user(b: ChatBuilder, text: str) -> list[int]:
    """Tokens of a complete user turn."""


@host
def detokenize(name: str, tokens: list[int]) -> str:
    """Token ids to text."""


@host
def reasoning_markers(name: str) -> tuple[int, int] | None:
    """Token ids that open and close a reasoning block in the model's format, or None."""


@host
def resolve(name: str) -> Model:
    """The loaded model called ``name``.

    Raises:
        NotFound: No such model is loaded (the message lists the loaded ones).
    """


@host
def special_tokens(name: str) -> tuple[list[int], list[bytes]]:
    """Special token ids and their bytes."""


@host
def split_regex(name: str) -> str:
    """The pre-tokenisation split regex."""


@host
def stop_tokens(name: str) -> list[int]:
    """Token ids that end an assistant turn in the model's chat format."""


@host
def token_bytes(name: str, tokens: list[int]) -> list[bytes]:
    """The raw bytes each token contributes (for UTF-8-safe incremental decoding)."""


@host
def tokenize(name: str, text: str) -> list[int]:
    """Text to token ids (special tokens written in the text are recognised; no BOS added)."""


@host
def vocab_size(name: str) -> int:
    """Rows of the model's output layer: valid token ids are ``0 <= id < vocab_size``."""


@host
def vocabs(name: str) -> tuple[list[int], list[bytes]]:
    """The full vocabulary as parallel lists of ids and token bytes."""
