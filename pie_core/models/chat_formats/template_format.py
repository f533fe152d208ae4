"""A chat format driven by the model's own Jinja template, for families without a builder.

The builder keeps the conversation as messages and, on each call, renders the template for
the conversation so far and for it plus the new message, and emits the tokens of the text
that was added. This matches the template exactly whenever it renders earlier messages the
same way regardless of what follows (true of ChatML, llama 3, Gemma ...); a template that
rewrites history raises instead of emitting wrong tokens.
"""

from __future__ import annotations

from typing import Any

from pie_core.errors import InvalidInput
from pie_core.models.chat_formats.base import ChatBuilder, ChatFormat
from pie_core.models.chat_formats.template import Message, render_chat_template
from pie_core.models.tokenizer import Tokenizer

__all__ = ["TemplateFormat"]

_SENTINEL = "\x00reply\x00"


class TemplateFormat(ChatFormat):
    """Any chat template, by incremental rendering."""

    name = "template"
    template: str

    def __init__(self, tokenizer: Tokenizer, template: str, stop_tokens: tuple[int, ...], **variables: Any) -> None:
        """Bind ``template`` to ``tokenizer``; ``variables`` are extra template inputs."""
        self.tokenizer = tokenizer
        self.template = template
        self.stop_tokens = stop_tokens
        bos, eos = tokenizer.bos_id, (tokenizer.eos_ids[0] if tokenizer.eos_ids else None)
        self.variables: dict[str, Any] = {
            "bos_token": (tokenizer.id_to_token(bos) or "") if bos is not None else "",
            "eos_token": (tokenizer.id_to_token(eos) or "") if eos is not None else "",
            **variables,
        }

    def render(self, messages: list[Message], add_generation_prompt: bool = False) -> str:
        """The template's text for ``messages`` ("" for none)."""
        if not messages and not add_generation_prompt:
            return ""
        return render_chat_template(self.template, messages, add_generation_prompt=add_generation_prompt, **self.variables)

    def builder(self) -> ChatBuilder:
        return _TemplateBuilder(self)

    def _stateless(self) -> ChatBuilder:
        return _TemplateBuilder(self)


class _TemplateBuilder(ChatBuilder):
    def __init__(self, fmt: TemplateFormat) -> None:
        self.fmt = fmt
        self.messages: list[Message] = []
        self.text = ""  # what has been emitted, as template text

    def _extend(self, rendered: str) -> list[int]:
        if not rendered.startswith(self.text):
            raise InvalidInput("this chat template rewrites earlier turns; it cannot be built incrementally")
        added, self.text = rendered[len(self.text) :], rendered
        return self.fmt.tokenizer.encode(added)

    def _add(self, role: str, text: str) -> list[int]:
        self.messages.append({"role": role, "content": text})
        return self._extend(self.fmt.render(self.messages))

    def system(self, text: str) -> list[int]:
        return self._add("system", text)

    def user(self, text: str) -> list[int]:
        return self._add("user", text)

    def assistant(self, text: str) -> list[int]:
        return self._add("assistant", text)

    def cue(self) -> list[int]:
        return self._extend(self.fmt.render(self.messages, add_generation_prompt=True))

    def seal(self) -> list[int]:
        # The template's text after an assistant message's content closes the turn.
        rendered = self.fmt.render([*self.messages, {"role": "assistant", "content": _SENTINEL}])
        closing = rendered[rendered.index(_SENTINEL) + len(_SENTINEL) :]
        self.messages.append({"role": "assistant", "content": _SENTINEL})
        self.text = rendered
        return self.fmt.tokenizer.encode(closing)
