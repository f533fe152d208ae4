"""Tool turns of the Llama 3 chat format, read from the template by rendering probe conversations.

Llama 3.2's template lists custom tools in one of two places, chosen by its
``tools_in_user_message`` variable (default true):

- in the first user message: the system block gains ``Environment: ipython``, and the first
  user turn opens with the tool instructions and the tools' JSON before the user's text;
- in the system message (``tools_in_user_message=False``): the system block carries them.

A conversation builder (``ctx.equip_tools``) follows the default: its ``equip`` returns the
opening up to where the first user message's text goes, and the next ``user`` call supplies
that text. A stateless opening (``tools.equip_prefix``) cannot rely on a following call, so it
uses the system placement, which is complete on its own. Tool results are ``ipython`` turns;
the template JSON-encodes any content that is not a number (strings get quoted).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pie_core.errors import Unsupported
from pie_core.models.chat_formats.template import render_chat_template

if TYPE_CHECKING:
    from pie_core.models.chat_formats.llama3 import Llama3Format

__all__ = ["tools_opening", "tool_answer"]

_PROBE = "\x00probe\x00"
_USER = "<|start_header_id|>user<|end_header_id|>\n\n"
_EOT = "<|eot_id|>"


def tools_opening(fmt: Llama3Format, tools: list[dict[str, Any]], system: str | None, in_user: bool) -> str:
    """The text that opens a conversation with ``tools`` (no BOS text).

    Args:
        fmt: The format (its template and fixed date).
        tools: Normalised tool schemas.
        system: The caller's system text, if any.
        in_user: True: up to the first user message's text (which must follow, then
            ``<|eot_id|>``). False: the complete system turn, tools included.

    Raises:
        Unsupported: The template does not list tools.
    """
    head = [{"role": "system", "content": system}] if system is not None else []
    text = render_chat_template(fmt.template, [*head, {"role": "user", "content": _PROBE}], tools=tools,
                                date_string=fmt.date_string, tools_in_user_message=in_user)
    opening, _, tail = text.partition(_PROBE if in_user else _USER + _PROBE)
    listed = all(json.dumps(t["function"]["name"]) in opening for t in tools)
    if tail != _EOT or not listed:
        raise Unsupported("this Llama chat template does not list tools the way Llama 3.2's does")
    return opening


def tool_answer(fmt: Llama3Format, value: Any) -> str:
    """The text of a tool-result (``ipython``) turn carrying ``value`` as the template writes it."""
    text = render_chat_template(fmt.template, [{"role": "user", "content": _PROBE}, {"role": "tool", "content": value}],
                                date_string=fmt.date_string)
    before, found, after = text.partition(_PROBE + _EOT)
    if not found or not after.endswith(_EOT):
        raise Unsupported("this Llama chat template does not write tool results as turns")
    return after
