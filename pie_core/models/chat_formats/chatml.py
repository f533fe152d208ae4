"""ChatML (Qwen 2 / 2.5): ``<|im_start|>{role}\\n{content}<|im_end|>\\n``.

Qwen's templates open every conversation with a system turn: the caller's, or a default one
when the first message is not a system message ("You are Qwen, created by Alibaba Cloud. ..."
for Qwen 2.5). The default is read from the template itself by rendering a one-message
conversation, so the builder injects exactly what the template would.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pie_core.errors import Unsupported
from pie_core.models.chat_formats.base import ChatBuilder, ChatFormat
from pie_core.models.chat_formats.template import render_chat_template
from pie_core.models.tokenizer import Tokenizer

__all__ = ["ChatMLFormat"]

_PROBE = "\x00probe\x00"


def default_system_prompt(template: str | None) -> str | None:
    """The system prompt a ChatML template injects when the conversation has none."""
    if template is None:
        return None
    text = render_chat_template(template, [{"role": "user", "content": _PROBE}])
    found = re.match(r"<\|im_start\|>system\n(.*?)<\|im_end\|>\n<\|im_start\|>user\n", text, re.S)
    return found.group(1) if found else None


def _tool_texts(template: str | None) -> tuple[str, str, str] | None:
    """The text a template puts before, between and after consecutive tool results (one turn
    holds them all), if it renders tool messages."""
    if template is None or "tool" not in template:
        return None
    tool = {"role": "tool", "content": _PROBE}
    text = render_chat_template(template, [{"role": "user", "content": _PROBE}, tool, tool])
    after_user = text.split(_PROBE + "<|im_end|>\n", 1)
    if len(after_user) != 2 or after_user[1].count(_PROBE) != 2:
        return None
    before, between, after = after_user[1].split(_PROBE)
    return before, between, after


class ChatMLFormat(ChatFormat):
    """ChatML with the template's default system prompt, tools as the template writes them."""

    name = "chatml"

    def __init__(self, tokenizer: Tokenizer, template: str | None) -> None:
        """Bind to ``tokenizer``; ``template`` supplies the default system prompt.

        Raises:
            Unsupported: The vocabulary lacks ``<|im_start|>``/``<|im_end|>``.
        """
        start, end = tokenizer.token_to_id("<|im_start|>"), tokenizer.token_to_id("<|im_end|>")
        if start is None or end is None:
            raise Unsupported("ChatML needs <|im_start|> and <|im_end|> tokens in the vocabulary")
        self.tokenizer = tokenizer
        self.template = template
        self.start, self.end = start, end
        self.newline = tokenizer.encode("\n")
        self.default_system = default_system_prompt(template)
        self.tool_texts = _tool_texts(template)
        if self.tool_texts is not None and tokenizer.token_to_id("<tool_call>") is not None:
            self.tool_call_markers = ("<tool_call>", "</tool_call>")
        if tokenizer.token_to_id("<think>") is not None:
            self.reasoning_markers = ("<think>", "</think>")
        eot = tokenizer.token_to_id("<|endoftext|>")
        self.stop_tokens = tuple(t for t in (end, eot) if t is not None)

    def turn(self, role: str, text: str) -> list[int]:
        """One complete message: ``<|im_start|>role\\ntext<|im_end|>\\n``."""
        return [self.start, *self.tokenizer.encode(f"{role}\n{text}"), self.end, *self.newline]

    def tools_system(self, tools: list[dict[str, Any]], system: str | None) -> list[int]:
        """The template's system turn for ``tools`` (and ``system`` text, else the default)."""
        if self.template is None or self.tool_texts is None:
            raise Unsupported("this model's chat template has no tool support")
        head = [{"role": "system", "content": system}] if system is not None else []
        text = render_chat_template(self.template, [*head, {"role": "user", "content": _PROBE}], tools=tools)
        return self.tokenizer.encode(text.split("<|im_start|>user\n" + _PROBE, 1)[0])

    def tool_answer(self, *values: Any) -> list[int]:
        """The template's turn carrying tool results ``values`` (one turn for all of them)."""
        if self.tool_texts is None:
            raise Unsupported("this model's chat template has no tool support")
        contents = [v if isinstance(v, str) else json.dumps(v, ensure_ascii=False) for v in values]
        before, between, after = self.tool_texts
        return self.tokenizer.encode(before + between.join(contents) + after)

    def builder(self) -> ChatBuilder:
        return _ChatMLBuilder(self, inject_default=True)

    def _stateless(self) -> ChatBuilder:
        return _ChatMLBuilder(self, inject_default=False)


class _ChatMLBuilder(ChatBuilder):
    def __init__(self, fmt: ChatMLFormat, inject_default: bool) -> None:
        self.fmt = fmt
        self.started = not inject_default
        self.stateless = not inject_default
        self.answers: tuple[Any, ...] = ()  # tool results waiting to be written as one turn

    def _open(self) -> list[int]:
        if self.answers:  # the turn of the tool results given so far, then what follows
            answers, self.answers = self.answers, ()
            return self.fmt.tool_answer(*answers)
        if self.started:
            return []
        self.started = True
        default = self.fmt.default_system
        return self.fmt.turn("system", default) if default is not None else []

    def system(self, text: str) -> list[int]:
        self.started = True
        return self.fmt.turn("system", text)

    def user(self, text: str) -> list[int]:
        return self._open() + self.fmt.turn("user", text)

    def assistant(self, text: str) -> list[int]:
        return self._open() + self.fmt.turn("assistant", text)

    def cue(self) -> list[int]:
        return self._open() + [self.fmt.start, *self.fmt.tokenizer.encode("assistant\n")]

    def seal(self) -> list[int]:
        return [self.fmt.end, *self.fmt.newline]

    def equip(self, tools: list[dict[str, Any]], system: str | None = None) -> list[int]:
        self.started = True
        return self.fmt.tools_system(tools, system)

    def answer(self, name: str, value: Any) -> list[int]:
        # Qwen's template writes consecutive tool results as one turn, so a builder keeps them
        # until the next message or cue writes that turn; out of conversation it is written now.
        if self.stateless:
            return self.fmt.tool_answer(value)
        if self.fmt.tool_texts is None:
            raise Unsupported("this model's chat template has no tool support")
        head = [] if self.answers else self._open()
        self.answers += (value,)
        return head
