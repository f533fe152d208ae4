"""The chat-format contract: per-role token builders that reproduce a model's chat template."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from pie_core.errors import Unsupported
from pie_core.models.tokenizer import Tokenizer

__all__ = ["ChatBuilder", "ChatFormat"]


class ChatBuilder(ABC):
    """Stateful builder for one conversation (one context).

    Feeding a conversation through ``system``/``user``/``assistant`` and ending with ``cue``
    yields exactly the token ids of rendering the model's chat template (with
    ``add_generation_prompt=True``) and encoding the text. After the model has generated its
    reply (its stop token not appended), ``seal`` closes the turn as the template closes an
    assistant message, so the conversation can go on.
    """

    @abstractmethod
    def system(self, text: str) -> list[int]:
        """Tokens for a system message (may be empty when the format defers it)."""

    @abstractmethod
    def user(self, text: str) -> list[int]:
        """Tokens for a complete user turn."""

    @abstractmethod
    def assistant(self, text: str) -> list[int]:
        """Tokens for a complete (pre-filled) assistant turn."""

    @abstractmethod
    def cue(self) -> list[int]:
        """Tokens that open the assistant's turn for generation."""

    @abstractmethod
    def seal(self) -> list[int]:
        """Tokens that close an assistant turn opened by :meth:`cue` after its content."""

    def equip(self, tools: list[dict[str, Any]], system: str | None = None) -> list[int]:
        """The opening system turn that lists ``tools`` (JSON schemas), as the template writes it.

        Raises:
            Unsupported: The model's template has no tool support.
        """
        raise Unsupported("this model's chat format has no tool support")

    def answer(self, name: str, value: Any) -> list[int]:
        """A turn carrying the result of tool ``name`` (non-strings are JSON-encoded).

        Raises:
            Unsupported: The model's template has no tool support.
        """
        raise Unsupported("this model's chat format has no tool support")


class ChatFormat(ABC):
    """A model family's chat format.

    Attributes:
        name: Family name (``"chatml"``, ``"gemma"``, ``"template"``).
        tokenizer: The model's tokenizer.
        stop_tokens: Ids that end an assistant turn.
        template: The Jinja chat template it reproduces, if known.
        tool_call_markers: Text around a tool call the model writes (``<tool_call>``), if any.
        reasoning_markers: Text around reasoning the model writes (``<think>``), if any.
    """

    name: str
    tokenizer: Tokenizer
    stop_tokens: tuple[int, ...]
    template: str | None
    tool_call_markers: tuple[str, str] | None = None
    reasoning_markers: tuple[str, str] | None = None

    @property
    def reasoning_marker_ids(self) -> tuple[int, int] | None:
        """Token ids of :attr:`reasoning_markers` when each marker is one token, else ``None``."""
        if self.reasoning_markers is None:
            return None
        start, end = (self.tokenizer.token_to_id(m) for m in self.reasoning_markers)
        return None if start is None or end is None else (start, end)

    @abstractmethod
    def builder(self) -> ChatBuilder:
        """A fresh builder for one conversation."""

    def system(self, text: str) -> list[int]:
        """A system turn out of conversation context (no BOS, no default system prompt)."""
        return self._stateless().system(text)

    def user(self, text: str) -> list[int]:
        """A user turn out of conversation context (no BOS, no default system prompt)."""
        return self._stateless().user(text)

    def assistant(self, text: str) -> list[int]:
        """An assistant turn out of conversation context."""
        return self._stateless().assistant(text)

    def cue(self) -> list[int]:
        """The generation cue out of conversation context."""
        return self._stateless().cue()

    def seal(self) -> list[int]:
        """The end of an assistant turn."""
        return self._stateless().seal()

    def equip(self, tools: list[dict[str, Any]], system: str | None = None) -> list[int]:
        """The system turn listing ``tools`` (see :meth:`ChatBuilder.equip`)."""
        return self._stateless().equip(tools, system)

    def answer(self, name: str, value: Any) -> list[int]:
        """A tool-result turn (see :meth:`ChatBuilder.answer`)."""
        return self._stateless().answer(name, value)

    @abstractmethod
    def _stateless(self) -> ChatBuilder:
        """A builder positioned mid-conversation (nothing pending, nothing injected)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, stop_tokens={self.stop_tokens})"
