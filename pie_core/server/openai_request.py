"""Checking an OpenAI request body and turning it into the ``openai-compat`` inferlet's input.

Every field is checked by type and range before anything runs; a wrong one is a
:class:`BadRequest` (a 400 whose ``param`` names it). Fields we do not implement are refused
rather than ignored, so a client never silently gets something other than what it asked for.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pie_core.errors import InvalidInput, NotFound
from pie_core.grammar.source import MAX_SOURCE_BYTES
from pie_core.models.chat_formats.tool_calls import format_tool_call, tool_call_syntax

if TYPE_CHECKING:
    from pie_core.server.app import PieServer

__all__ = ["BadRequest", "parse_json", "chat_args", "completion_args", "embedding_args", "context_tokens",
           "MAX_JSON_DEPTH", "MAX_PROMPT_BYTES", "MAX_TOKENS", "MAX_N", "MAX_TOP_LOGPROBS", "MAX_TOOLS",
           "MAX_EMBED_INPUTS"]

MAX_JSON_DEPTH = 64  # nesting of the request body; JSON Schemas in response_format fit easily
MAX_PROMPT_BYTES = 1 << 20  # UTF-8 bytes of prompt, message or embedding text, before tokenising
MAX_TOKENS = 32768
MAX_N = 16  # choices per request
MAX_TOP_LOGPROBS = 20  # OpenAI's own bound
MAX_TOOLS = 128
MAX_EMBED_INPUTS = 256
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
_UNSUPPORTED = {  # fields we would otherwise ignore silently, changing what the client asked for
    "functions": "the legacy 'functions' field is not supported; send 'tools'",
    "function_call": "the legacy 'function_call' field is not supported; send 'tool_choice'",
    "logit_bias": "logit_bias is not supported yet",
    "presence_penalty": "presence_penalty is not supported yet",
    "frequency_penalty": "frequency_penalty is not supported yet",
    "best_of": "best_of is not supported yet",
    "echo": "echo is not supported yet",
    "suffix": "suffix is not supported yet",
    "parallel_tool_calls": None,  # checked in _tools: only its default (true) is honoured
}


class BadRequest(InvalidInput):
    """A request field is wrong: a 400 whose ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


def parse_json(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object nested at most ``MAX_JSON_DEPTH`` deep."""
    try:
        body = json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the request body is not JSON: {exc}") from None
    except RecursionError:
        raise BadRequest(f"the request body nests deeper than {MAX_JSON_DEPTH} levels; flatten it") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:  # iterative: a recursive walk is what deep nesting attacks
        value, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise BadRequest(f"the request body nests deeper than {MAX_JSON_DEPTH} levels; flatten it")
        items = value.values() if isinstance(value, dict) else value
        stack.extend((v, depth + 1) for v in items if isinstance(v, (dict, list)))
    return body


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(body: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = body.get(name)
    if value is None:
        return default
    if not _is_int(value) or not low <= value <= high:
        raise BadRequest(f"'{name}' must be an integer in [{low}, {high}], got {value!r:.80}", name)
    return int(value)


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise BadRequest(f"'{name}' must be a number in [{low}, {high}], got {value!r:.80}", name)
    return float(value)


def _optional(body: dict[str, Any], name: str, kind: type, what: str) -> Any:
    value = body.get(name)
    if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
        raise BadRequest(f"'{name}' must be {what}, got {value!r:.80}", name)
    return value


def model_of(server: PieServer, body: dict[str, Any]) -> str:
    """The served model the request names (default: the first loaded)."""
    model = _optional(body, "model", str, "a string naming a served model")
    if model is not None and model not in server.engine.models:
        raise NotFound(f"model {model!r:.80} is not served here; GET /v1/models lists: {', '.join(server.engine.models)}")
    return model if model is not None else next(iter(server.engine.models))


def context_tokens(server: PieServer, model: str | None) -> int:
    """Tokens one sequence of ``model`` can hold: its positions, and at most the whole KV pool."""
    loaded = server.engine.models[model] if model is not None else next(iter(server.engine.models.values()))
    return int(min(loaded.spec.max_position, _pool_tokens(loaded)))


def _pool_tokens(loaded: Any) -> int:
    return int(loaded.caps.num_pages * loaded.caps.page_size)


def _common(server: PieServer, body: dict[str, Any]) -> dict[str, Any]:
    """The inferlet input shared by both generating endpoints."""
    for name, message in _UNSUPPORTED.items():
        value = body.get(name)
        if message and value not in (None, False, 0, "", [], {}):  # the "off" values clients send by default
            raise BadRequest(f"{message}; remove '{name}' from the request", name, "unsupported_parameter")
    model = model_of(server, body)
    n = _int(body, "n", 1, 1, MAX_N)
    max_tokens = 256
    for name in ("max_tokens", "max_completion_tokens"):
        if body.get(name) is not None:
            max_tokens = _int(body, name, 256, 1, MAX_TOKENS)
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else [] if stop is None else stop
    if not isinstance(stops, list) or len(stops) > 4 or not all(isinstance(s, str) and len(s) <= 256 for s in stops):
        raise BadRequest(f"'stop' must be a string or a list of up to 4 strings of up to 256 characters, got {stop!r:.80}",
                         "stop")
    seed = _optional(body, "seed", int, "an integer") or 0
    _optional(body, "stream", bool, "true or false")
    options = _optional(body, "stream_options", dict, "an object like {\"include_usage\": true}") or {}
    if not isinstance(options.get("include_usage", False), bool):
        raise BadRequest("'stream_options.include_usage' must be true or false", "stream_options")
    loaded = server.engine.models[model]
    args: dict[str, Any] = {
        "model": model,
        "n": n,
        "max_tokens": max_tokens,
        "temperature": _number(body, "temperature", 1.0, 0.0, 2.0),
        "top_p": _number(body, "top_p", 1.0, 0.0, 1.0),
        "seed": seed & 0x7FFFFFFF,
        "stop": json.dumps(stops),
        "max_context": context_tokens(server, model),
        "pool_tokens": _pool_tokens(loaded),
    }
    args.update(_response_format(body))
    return args


def _response_format(body: dict[str, Any]) -> dict[str, Any]:
    fmt = body.get("response_format")
    if fmt is None:
        return {}
    if not isinstance(fmt, dict):
        raise BadRequest("'response_format' must be an object like {\"type\": \"json_object\"}", "response_format")
    kind = fmt.get("type")
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise BadRequest("response_format json_schema needs json_schema.schema (a JSON Schema object)",
                             "response_format.json_schema")
        return {"schema": json.dumps(schema)}
    if kind != "text":
        raise BadRequest(f"response_format type must be 'text', 'json_object' or 'json_schema', got {kind!r:.80}",
                         "response_format.type")
    return {}


def _text_size(texts: list[str], param: str) -> None:
    size = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
    if size > MAX_PROMPT_BYTES:
        raise BadRequest(f"'{param}' holds {size} bytes of text; the limit is {MAX_PROMPT_BYTES} bytes: shorten it",
                         param, "context_length_exceeded")


def chat_args(server: PieServer, body: dict[str, Any]) -> dict[str, Any]:
    """The inferlet input for ``/v1/chat/completions``."""
    args = {**_common(server, body), "mode": "chat"}
    logprobs = _optional(body, "logprobs", bool, "true or false") or False
    top = _int(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS)
    if top and not logprobs:
        raise BadRequest("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    args.update(logprobs=logprobs, top_logprobs=top)
    tools, choice = _tools(body)
    if tools and ("schema" in args or "json_object" in args) and choice != "none":
        raise BadRequest("'response_format' and 'tools' cannot be combined (both constrain the reply); "
                         "send one, or tool_choice 'none'", "response_format")
    syntax = tool_call_syntax(server.engine.models[args["model"]].chat)
    args["messages"] = json.dumps(_chat_messages(body, syntax))
    if tools:
        args["tools"] = json.dumps(tools)
        if len(args["tools"]) > MAX_SOURCE_BYTES:  # its grammar could not be made: say so before any work
            raise BadRequest(f"'tools' may be at most {MAX_SOURCE_BYTES} bytes as JSON, got {len(args['tools'])}; "
                             "send fewer or shorter tools", "tools")
        if choice != "none":
            if syntax is None and choice != "auto":
                raise BadRequest(f"model {args['model']!r} has no known tool-call syntax, so tool_choice {choice!r} "
                                 "cannot be enforced; use 'auto' or 'none'", "tool_choice")
            args.update(parse_calls=syntax is not None, tool_choice=choice)
            if syntax is not None:
                args["call_begin"] = syntax.begin
    return args


def _tools(body: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """The request's tools (OpenAI shape) and its tool choice: 'none', 'auto', 'required' or a tool name."""
    tools = body.get("tools")
    if tools is None:
        tools = []
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise BadRequest(f"'tools' must be a list of up to {MAX_TOOLS} {{\"type\": \"function\", \"function\": {{...}}}}",
                         "tools")
    names: list[str] = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not 0 < len(fn["name"]) <= 64:
            raise BadRequest(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": 1-64 characters, "
                             "\"parameters\": {...}}}", f"tools[{i}]")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise BadRequest(f"tools[{i}].function.parameters must be a JSON Schema object", f"tools[{i}].function.parameters")
        if fn["name"] in names:
            raise BadRequest(f"two tools are named {fn['name']!r}; tool names must be unique", f"tools[{i}]")
        names.append(fn["name"])
    if body.get("parallel_tool_calls") not in (None, True):
        raise BadRequest("parallel_tool_calls false is not supported (the model may make several calls); "
                         "remove it", "parallel_tool_calls", "unsupported_parameter")
    choice = body.get("tool_choice")
    if choice is None:
        return tools, "auto" if tools else "none"
    if isinstance(choice, dict):
        fn = choice.get("function") if choice.get("type") == "function" else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if name not in names:
            raise BadRequest(f"tool_choice names no tool in 'tools' ({', '.join(names) or 'none given'})", "tool_choice")
        return tools, str(name)
    if choice not in ("none", "auto", "required"):
        raise BadRequest(f"tool_choice must be 'none', 'auto', 'required' or {{\"type\": \"function\", "
                         f"\"function\": {{\"name\": ...}}}}, got {choice!r:.80}", "tool_choice")
    if choice == "required" and not tools:
        raise BadRequest("tool_choice 'required' needs 'tools'", "tool_choice")
    return tools, choice


def _chat_messages(body: dict[str, Any], syntax: Any) -> list[dict[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list of {role, content}", "messages")
    out: list[dict[str, str]] = []
    calls: dict[str, str] = {}  # tool_call_id -> tool name, from the assistant turns so far
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise BadRequest(f"messages[{i}] must be an object {{role, content}}, got {type(msg).__name__}", f"messages[{i}]")
        role = msg.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise BadRequest(f"messages[{i}].role must be one of {', '.join(_ROLES)}, got {role!r:.80}",
                             f"messages[{i}].role")
        if msg.get("function_call"):
            raise BadRequest(f"messages[{i}].function_call is the legacy form; send tool_calls", f"messages[{i}].function_call",
                             "unsupported_parameter")
        content = _content(msg, i, allow_null=role == "assistant" and bool(msg.get("tool_calls")))
        if role == "tool":
            call_id = msg.get("tool_call_id")
            if not calls:
                raise BadRequest(f"messages[{i}].role 'tool' must follow an assistant message with tool_calls",
                                 f"messages[{i}].role")
            if call_id not in calls:
                raise BadRequest(f"messages[{i}].tool_call_id must be the id of an earlier tool call "
                                 f"({', '.join(calls)}), got {call_id!r:.80}", f"messages[{i}].tool_call_id")
            out.append({"role": "tool", "name": calls[call_id], "content": content})
            continue
        if role == "assistant" and msg.get("tool_calls"):
            content += _rendered_calls(msg["tool_calls"], i, syntax, calls)
        out.append({"role": _ROLES[role], "content": content})
    _text_size([m["content"] for m in out], "messages")
    return out


def _content(msg: dict[str, Any], i: int, allow_null: bool) -> str:
    content = msg.get("content")
    if content is None and allow_null:
        return ""
    if isinstance(content, list):  # content parts: only text parts are supported
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise BadRequest(f"messages[{i}].content parts must all be {{\"type\": \"text\", \"text\": string}}",
                             f"messages[{i}].content")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise BadRequest(f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}].content")
    return content


def _rendered_calls(tool_calls: Any, i: int, syntax: Any, calls: dict[str, str]) -> str:
    """An assistant turn's tool calls as the model's template writes them (and their ids, remembered)."""
    param = f"messages[{i}].tool_calls"
    if syntax is None:
        raise BadRequest("this model has no known tool-call syntax, so earlier tool calls cannot be replayed; "
                         "send them as text", param, "unsupported_parameter")
    if not isinstance(tool_calls, list) or len(tool_calls) > MAX_TOOLS:
        raise BadRequest(f"{param} must be a list of up to {MAX_TOOLS} calls", param)
    texts = []
    for k, call in enumerate(tool_calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(call.get("id"), str) or not isinstance(fn.get("name"), str) \
                or not isinstance(fn.get("arguments"), str):
            raise BadRequest(f"{param}[{k}] must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", "
                             "\"arguments\": JSON text}}}}", f"{param}[{k}]")
        try:
            arguments = json.loads(fn["arguments"])
        except ValueError:
            raise BadRequest(f"{param}[{k}].function.arguments is not JSON text", f"{param}[{k}].function.arguments") from None
        calls[call["id"]] = fn["name"]
        texts.append(format_tool_call(syntax, fn["name"], arguments))
    return "\n".join(texts)


def completion_args(server: PieServer, body: dict[str, Any]) -> dict[str, Any]:
    """The inferlet input for ``/v1/completions``."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise BadRequest("'prompt' must be a non-empty string (or a list of one string)", "prompt")
    _text_size([prompt], "prompt")
    args = {**_common(server, body), "mode": "completion", "prompt": prompt}
    top = _int(body, "logprobs", -1, 0, MAX_TOP_LOGPROBS) if body.get("logprobs") is not None else None
    if top is not None:
        args.update(logprobs=True, top_logprobs=top)
    return args


def embedding_args(server: PieServer, body: dict[str, Any]) -> dict[str, Any]:
    """The inferlet input for ``/v1/embeddings``: ``input`` is a string, a list of strings, a list
    of token ids or a list of such lists."""
    model = model_of(server, body)
    value = body.get("input")
    vocab = int(server.engine.models[model].spec.vocab_size)
    items: list[Any] = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    if items and all(_is_int(t) for t in items):
        items = [items]  # one list of token ids
    if not items or len(items) > MAX_EMBED_INPUTS:
        raise BadRequest(f"'input' must be a string, or a list of 1 to {MAX_EMBED_INPUTS} strings or token-id lists", "input")
    for k, item in enumerate(items):
        ok = (isinstance(item, str) and item) or (isinstance(item, list) and item and
                                                  all(_is_int(t) and 0 <= t < vocab for t in item))
        if not ok:
            raise BadRequest(f"input[{k}] must be a non-empty string or a non-empty list of token ids in [0, {vocab})",
                             "input")
    _text_size([t for t in items if isinstance(t, str)], "input")
    if sum(len(t) for t in items if isinstance(t, list)) > MAX_PROMPT_BYTES // 4:
        raise BadRequest(f"'input' holds more than {MAX_PROMPT_BYTES // 4} token ids; send fewer", "input")
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise BadRequest(f"'encoding_format' must be 'float' or 'base64', got {fmt!r:.80}", "encoding_format")
    if body.get("dimensions") is not None:
        raise BadRequest("'dimensions' is not supported: embeddings have the model's hidden size; remove it",
                         "dimensions", "unsupported_parameter")
    return {"mode": "embed", "model": model, "inputs": json.dumps(items), "max_context": context_tokens(server, model)}
