"""The grammar an OpenAI request asks for, checked off the event loop before the request runs.

A ``response_format`` JSON Schema or a ``tools`` list with a tool choice the reply must follow
becomes a grammar source in the built-in inferlet, and xgrammar turns each schema into a grammar
as the source is made: seconds for a schema such as ``{"pattern": "(a|b|c|d){1,2000}x"}``. Made
on the event loop (an in-process built-in inferlet runs there) that would stall every other
user's requests. So the handler makes the same source first, in an off-loop thread on the user's
turn (:func:`~pie_core.host.binding.run_off_loop_as`: one user holds at most one such thread),
within :data:`CHECK_TIMEOUT_S`; the built-in inferlet then finds it parsed (sources are cached
by value), and a bad or too slow grammar is a 400 before anything is launched.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from pie_core.errors import InvalidInput
from pie_core.host.binding import run_off_loop_as
from pie_core.server.openai_request import BadRequest

if TYPE_CHECKING:
    from pie_core.server.app import PieServer

__all__ = ["check_grammar", "CHECK_TIMEOUT_S"]

CHECK_TIMEOUT_S = 20.0
"""How long a request's grammar may take to parse before the request is refused."""


async def check_grammar(server: PieServer, user: str, args: dict[str, Any]) -> None:
    """Parse the grammar ``args`` (the built-in inferlet's input) asks for, off the loop.

    Raises:
        BadRequest: The schema or tools do not make a grammar, or not within
            :data:`CHECK_TIMEOUT_S` seconds.
    """
    if args.get("schema"):
        param, make = "response_format", _schema_source(args["schema"])
    elif args.get("parse_calls") and args.get("tools"):
        param, make = "tools", _tools_source(server, args)
    else:
        return
    try:
        await asyncio.wait_for(run_off_loop_as(user, make), CHECK_TIMEOUT_S)
    except InvalidInput as exc:
        raise BadRequest(str(exc), param) from None
    except TimeoutError:
        raise BadRequest(f"the {param} schema did not become a grammar within {CHECK_TIMEOUT_S:g} s: simplify it "
                         "(smaller repetition bounds in patterns, fewer alternatives)", param) from None


def _schema_source(schema: str) -> Any:
    from pie_core.grammar.source import json_schema

    return lambda: json_schema(json.loads(schema))  # as JsonSchema(...) in the built-in inferlet makes it


def _tools_source(server: PieServer, args: dict[str, Any]) -> Any:
    from pie_core.grammar.tool_calls import tool_call_source
    from pie_core.models.chat_formats.tool_calls import normalize_tools, tool_call_syntax

    syntax = tool_call_syntax(server.engine.models[args["model"]].chat)
    if syntax is None:
        return lambda: None
    tools, choice = json.loads(args["tools"]), args.get("tool_choice", "auto")
    return lambda: tool_call_source(syntax, normalize_tools(tools), choice)  # as tools.call_grammar makes it
