"""Gemma 3: ``<bos>`` once, ``<start_of_turn>{user|model}\\n{content}<end_of_turn>\\n``.

Gemma has no system role: the template prepends the system text and a blank line to the
first turn, and trims the content of every turn. Base checkpoints (like Gemma 3 270M) ship
no template; :data:`GEMMA3_TEMPLATE` is the instruction-tuned Gemma 3 template, used then.
"""

from __future__ import annotations

from pie_core.errors import Unsupported
from pie_core.models.chat_formats.base import ChatBuilder, ChatFormat
from pie_core.models.tokenizer import Tokenizer

__all__ = ["GemmaFormat", "GEMMA3_TEMPLATE"]

# The chat template of the instruction-tuned Gemma 3 checkpoints (text parts).
GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""


class GemmaFormat(ChatFormat):
    """Gemma's turn format."""

    name = "gemma"

    def __init__(self, tokenizer: Tokenizer, template: str | None) -> None:
        """Bind to ``tokenizer``.

        Raises:
            Unsupported: The vocabulary lacks ``<start_of_turn>``/``<end_of_turn>``.
        """
        start, end = tokenizer.token_to_id("<start_of_turn>"), tokenizer.token_to_id("<end_of_turn>")
        if start is None or end is None:
            raise Unsupported("the Gemma chat format needs <start_of_turn> and <end_of_turn> tokens")
        self.tokenizer = tokenizer
        self.template = template if template is not None else GEMMA3_TEMPLATE
        self.start, self.end = start, end
        self.newline = tokenizer.encode("\n")
        bos = tokenizer.bos_id
        self.bos = [bos] if bos is not None else []
        eos = tokenizer.token_to_id("<eos>")
        self.stop_tokens = tuple(t for t in (end, eos) if t is not None)

    def turn(self, role: str, text: str, prefix: str = "") -> list[int]:
        """One complete turn; ``prefix`` (a system message) goes before the trimmed text."""
        body = self.tokenizer.encode(f"{role}\n{prefix}{text.strip()}")
        return [self.start, *body, self.end, *self.newline]

    def builder(self) -> ChatBuilder:
        return _GemmaBuilder(self, fresh=True)

    def _stateless(self) -> ChatBuilder:
        return _GemmaBuilder(self, fresh=False)


class _GemmaBuilder(ChatBuilder):
    """Tracks BOS and the pending system prefix.

    A system message is held back and written at the start of the next turn (the template's
    ``first_user_prefix``). The template allows a system message only first; a later one is
    carried into the next turn the same way rather than refused.
    """

    def __init__(self, fmt: GemmaFormat, fresh: bool) -> None:
        self.fmt = fmt
        self.need_bos = fresh
        self.prefix = ""
        self.fresh = fresh

    def _bos(self) -> list[int]:
        if not self.need_bos:
            return []
        self.need_bos = False
        return list(self.fmt.bos)

    def system(self, text: str) -> list[int]:
        if not self.fresh:  # out of context: a user turn carrying the system text
            return self.fmt.turn("user", text)
        self.prefix += text + "\n\n"
        return self._bos()

    def _turn(self, role: str, text: str) -> list[int]:
        out = self._bos() + self.fmt.turn(role, text, self.prefix)
        self.prefix = ""
        return out

    def user(self, text: str) -> list[int]:
        return self._turn("user", text)

    def assistant(self, text: str) -> list[int]:
        return self._turn("model", text)

    def cue(self) -> list[int]:
        return self._bos() + [self.fmt.start, *self.fmt.tokenizer.encode("model\n")]

    def seal(self) -> list[int]:
        return [self.fmt.end, *self.fmt.newline]
