"""Llama 3.x: ``<|begin_of_text|>`` once, then
``<|start_header_id|>{role}<|end_header_id|>\\n\\n{trimmed content}<|eot_id|>`` per turn.

The Llama 3.1/3.2 templates always open with a system block carrying two date lines,
``Cutting Knowledge Date: December 2023`` and ``Today Date: {date_string}``, followed by the
caller's system text (or nothing). The template computes ``date_string`` from the clock
(``strftime_now``); a prompt that changes every midnight would defeat prefix caching and make
runs irreproducible, so this format fixes it: ``date_string`` defaults to ``"26 Jul 2024"``
(the template's own fallback when no clock is available) and can be set per format. The
system block is read from the template by rendering probe conversations, so Llama 3.0's
template (no date lines) is reproduced as well.
"""

from __future__ import annotations

from typing import Any

from pie_core.errors import InvalidInput, Unsupported
from pie_core.models.chat_formats.base import ChatBuilder, ChatFormat
from pie_core.models.chat_formats.llama3_tools import tool_answer, tools_opening
from pie_core.models.chat_formats.template import render_chat_template
from pie_core.models.tokenizer import Tokenizer

__all__ = ["Llama3Format", "LLAMA3_TEMPLATE", "DEFAULT_DATE"]

# The chat template Meta ships with Llama 3.2 Instruct (``chat_template`` in
# meta-llama/Llama-3.2-3B-Instruct's tokenizer_config.json; the same text as llama.cpp's
# models/templates/meta-llama-Llama-3.2-3B-Instruct.jinja). Used when a checkpoint has none.
LLAMA3_TEMPLATE = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

DEFAULT_DATE = "26 Jul 2024"
_PROBE = "\x00probe\x00"
_USER = "<|start_header_id|>user<|end_header_id|>\n\n"


class Llama3Format(ChatFormat):
    """Llama 3's header/eot turns with the template's system block, date fixed."""

    name = "llama3"
    template: str

    def __init__(self, tokenizer: Tokenizer, template: str | None, *, date_string: str = DEFAULT_DATE) -> None:
        """Bind to ``tokenizer``; ``template`` defaults to :data:`LLAMA3_TEMPLATE`.

        Args:
            tokenizer: The model's tokenizer.
            template: The checkpoint's template, if it ships one.
            date_string: The ``Today Date`` the template writes (fixed, see the module doc).

        Raises:
            Unsupported: The vocabulary lacks the header or ``<|eot_id|>`` tokens, or the
                template does not render system and user turns the Llama 3 way.
        """
        ids = [tokenizer.token_to_id(t) for t in ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")]
        if None in ids:
            raise Unsupported("the Llama 3 chat format needs <|start_header_id|>, <|end_header_id|> and <|eot_id|>")
        self.tokenizer = tokenizer
        self.template = template if template is not None else LLAMA3_TEMPLATE
        self.date_string = date_string
        bos = tokenizer.token_to_id("<|begin_of_text|>")
        bos = bos if bos is not None else tokenizer.bos_id
        self.bos = [bos] if bos is not None and "bos_token" in self.template else []
        self.system_head, self.system_tail, self.default_system = self._probe()
        stops = [tokenizer.token_to_id(t) for t in ("<|eot_id|>", "<|end_of_text|>", "<|eom_id|>")]
        self.stop_tokens = tuple(t for t in stops if t is not None)

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
        """The template's text for ``messages`` (no BOS text, the fixed date)."""
        return render_chat_template(self.template, messages, add_generation_prompt=add_generation_prompt,
                                    date_string=self.date_string)

    def _probe(self) -> tuple[str, str, str]:
        """The system block around the caller's text, and the block written when there is none."""
        try:
            with_system = self.render([{"role": "system", "content": _PROBE}, {"role": "user", "content": _PROBE}])
            without = self.render([{"role": "user", "content": _PROBE}])
        except InvalidInput as e:
            raise Unsupported(f"this Llama template cannot be reproduced: {e}") from e
        head, _, rest = with_system.partition(_PROBE)
        tail = rest.partition(_USER + _PROBE)[0]
        default = without.partition(_USER + _PROBE)[0]
        if not rest or not with_system.endswith(_USER + _PROBE + "<|eot_id|>"):
            raise Unsupported("this Llama template does not write turns as <|start_header_id|>role<|end_header_id|>")
        return head, tail, default

    def turn(self, role: str, text: str) -> list[int]:
        """One complete turn; the template trims the content."""
        return self.tokenizer.encode(f"<|start_header_id|>{role}<|end_header_id|>\n\n{text.strip()}<|eot_id|>")

    def builder(self) -> ChatBuilder:
        return _Llama3Builder(self, fresh=True)

    def _stateless(self) -> ChatBuilder:
        return _Llama3Builder(self, fresh=False)


class _Llama3Builder(ChatBuilder):
    """Writes BOS and the system block (the caller's or the template's default) first."""

    def __init__(self, fmt: Llama3Format, fresh: bool) -> None:
        self.fmt = fmt
        self.fresh = fresh
        self.stateless = not fresh
        self.tools_pending = False  # equip opened the first user turn; user() supplies its text

    def _open(self) -> list[int]:
        if self.tools_pending:
            raise InvalidInput("Llama 3 lists the tools in the first user message: add it (user) right after equip")
        if not self.fresh:
            return []
        self.fresh = False
        return self.fmt.bos + self.fmt.tokenizer.encode(self.fmt.default_system)

    def system(self, text: str) -> list[int]:
        if not self.fresh:  # a later system message is an ordinary turn in the template
            return self.fmt.turn("system", text)
        self.fresh = False
        return self.fmt.bos + self.fmt.tokenizer.encode(self.fmt.system_head + text.strip() + self.fmt.system_tail)

    def user(self, text: str) -> list[int]:
        if self.tools_pending:
            self.tools_pending = False
            return self.fmt.tokenizer.encode(text.strip() + "<|eot_id|>")
        return self._open() + self.fmt.turn("user", text)

    def assistant(self, text: str) -> list[int]:
        return self._open() + self.fmt.turn("assistant", text)

    def cue(self) -> list[int]:
        return self._open() + self.fmt.tokenizer.encode("<|start_header_id|>assistant<|end_header_id|>\n\n")

    def seal(self) -> list[int]:
        return self.fmt.tokenizer.encode("<|eot_id|>")

    def equip(self, tools: list[dict[str, Any]], system: str | None = None) -> list[int]:
        if not self.stateless and not self.fresh:
            raise InvalidInput("equip tools first: Llama 3 lists them in the conversation's opening turns")
        text = tools_opening(self.fmt, tools, system, in_user=not self.stateless)
        self.fresh, self.tools_pending = False, not self.stateless
        return self.fmt.bos + self.fmt.tokenizer.encode(text)

    def answer(self, name: str, value: Any) -> list[int]:
        return self._open() + self.fmt.tokenizer.encode(tool_answer(self.fmt, value))
