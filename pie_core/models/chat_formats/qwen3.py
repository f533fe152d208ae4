"""Qwen 3: ChatML with thinking (``<think>\\n...\\n</think>\\n\\n`` before the answer).

Differences from Qwen 2.5's ChatML (:class:`ChatMLFormat`, which this extends):

- No default system prompt: a conversation without a system message starts with the user.
- The generation cue is ``<|im_start|>assistant\\n``; with thinking switched off
  (``enable_thinking=False``) the template appends an empty ``<think>\\n\\n</think>\\n\\n``
  so the model answers directly. With thinking on, the model writes ``<think>`` itself.
- The template rewrites assistant history: a turn that precedes the last user query loses its
  reasoning (only the text after ``</think>`` is kept), while a turn after it keeps a
  ``<think>`` block. The builder emits a pre-filled :meth:`assistant` turn in the history form
  (reasoning dropped), which is what the template renders once a user turn follows. A turn the
  model generated (``cue`` ... ``seal``) keeps in the context what the model wrote, which is
  what the template renders for the latest turn.
"""

from __future__ import annotations

from pie_core.errors import Unsupported
from pie_core.models.chat_formats.base import ChatBuilder
from pie_core.models.chat_formats.chatml import ChatMLFormat, _ChatMLBuilder
from pie_core.models.tokenizer import Tokenizer

__all__ = ["Qwen3Format", "QWEN3_TEMPLATE"]

# The chat template Qwen ships with the Qwen 3 checkpoints (``chat_template`` in
# Qwen/Qwen3-0.6B's tokenizer_config.json; the same text as llama.cpp's
# models/templates/Qwen-Qwen3-0.6B.jinja). Used when a checkpoint carries no template.
QWEN3_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""

_EMPTY_THINK = "<think>\n\n</think>\n\n"


def history_content(text: str) -> str:
    """What the template keeps of an assistant message in history: the text after ``</think>``."""
    if "</think>" not in text:
        return text
    return text.split("</think>")[-1].lstrip("\n")


class Qwen3Format(ChatMLFormat):
    """ChatML with Qwen 3's thinking switch and reasoning markers."""

    name = "qwen3"

    def __init__(self, tokenizer: Tokenizer, template: str | None, *, enable_thinking: bool = True) -> None:
        """Bind to ``tokenizer``; ``template`` defaults to :data:`QWEN3_TEMPLATE`.

        Args:
            tokenizer: The model's tokenizer.
            template: The checkpoint's template, if it ships one.
            enable_thinking: Default of the template's ``enable_thinking`` for :meth:`cue`.

        Raises:
            Unsupported: The vocabulary lacks ``<|im_start|>``/``<|im_end|>`` or the think tokens.
        """
        super().__init__(tokenizer, template if template is not None else QWEN3_TEMPLATE)
        if self.reasoning_markers is None:
            raise Unsupported("the Qwen 3 chat format needs <think> and </think> tokens in the vocabulary")
        self.enable_thinking = enable_thinking

    def builder(self, enable_thinking: bool | None = None) -> ChatBuilder:
        """A fresh builder; ``enable_thinking`` overrides the format's default for its cues."""
        thinking = self.enable_thinking if enable_thinking is None else enable_thinking
        return _Qwen3Builder(self, inject_default=True, thinking=thinking)

    def _stateless(self) -> ChatBuilder:
        return _Qwen3Builder(self, inject_default=False, thinking=self.enable_thinking)


class _Qwen3Builder(_ChatMLBuilder):
    fmt: Qwen3Format

    def __init__(self, fmt: Qwen3Format, inject_default: bool, thinking: bool) -> None:
        super().__init__(fmt, inject_default)
        self.thinking = thinking

    def assistant(self, text: str) -> list[int]:
        return self._open() + self.fmt.turn("assistant", history_content(text))

    def cue(self) -> list[int]:
        head = "assistant\n" if self.thinking else "assistant\n" + _EMPTY_THINK
        return self._open() + [self.fmt.start, *self.fmt.tokenizer.encode(head)]
