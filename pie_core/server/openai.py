"""OpenAI-compatible ``/v1/chat/completions`` and ``/v1/completions``, served by the built-in
``openai-compat`` inferlet (see ``builtin/openai-compat``).

A request is checked and turned into that inferlet's input; its Stdout events are the reply
text (one SSE chunk each when ``stream`` is true), its Return event carries the finish reason
and token counts. A client that disconnects cancels the process, so its pages return at once.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import TYPE_CHECKING, Any

import msgpack

from pie_core.errors import InvalidInput, NotFound, PieError
from pie_core.server.http import HttpRequest, HttpResponder, error_json

if TYPE_CHECKING:
    from pie_core.server.app import PieServer

__all__ = ["chat_completions", "completions", "error_body", "error_response", "status_of", "BadRequest",
           "BUILTIN_PROGRAM"]

BUILTIN_PROGRAM = "openai-compat"
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
MAX_JSON_DEPTH = 64  # nesting of the request body; JSON Schemas in response_format fit easily
MAX_PROMPT_BYTES = 1 << 20  # UTF-8 bytes of prompt or message text, before tokenising
MAX_TOKENS = 32768
_THREAD_PARSE_BYTES = 64 * 1024  # bigger bodies are parsed off the event loop
_UNSUPPORTED = {  # fields we would otherwise ignore silently, changing what the client asked for
    "tools": "tools are not supported yet",
    "tool_choice": "tools are not supported yet",
    "functions": "tools (functions) are not supported yet",
    "function_call": "tools (functions) are not supported yet",
    "logprobs": "logprobs are not supported yet",
    "top_logprobs": "logprobs are not supported yet",
    "logit_bias": "logit_bias is not supported yet",
    "presence_penalty": "presence_penalty is not supported yet",
    "frequency_penalty": "frequency_penalty is not supported yet",
    "best_of": "best_of is not supported yet",
    "echo": "echo is not supported yet",
    "suffix": "suffix is not supported yet",
}


class BadRequest(InvalidInput):
    """A request field is wrong: a 400 whose ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


class _Collector:
    """A process sink that decodes event frames into a queue."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    async def send(self, message: bytes) -> None:
        frame = msgpack.unpackb(message, raw=False)
        self.queue.put_nowait((frame["event"], frame["value"]))


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None) -> bytes:
    """An error in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""
    return error_json(message, kind, param, code)


def error_response(exc: PieError) -> tuple[int, bytes]:
    """The status and OpenAI-shaped body for an error raised while handling a request."""
    status, kind = status_of(exc)
    return status, error_body(str(exc), kind, getattr(exc, "param", None), getattr(exc, "code", None))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise BadRequest(f"'{name}' must be a number in [{low}, {high}], got {value!r}", name)
    return float(value)


def _optional(body: dict[str, Any], name: str, kind: type, what: str) -> Any:
    value = body.get(name)
    if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
        raise BadRequest(f"'{name}' must be {what}, got {value!r}", name)
    return value


def _common(server: PieServer, body: dict[str, Any]) -> dict[str, Any]:
    """The inferlet input shared by both endpoints (every field checked by type and range)."""
    for name, message in _UNSUPPORTED.items():
        value = body.get(name)
        if value not in (None, False, 0, "", [], {}):  # the "off" values clients send by default
            raise BadRequest(f"{message}; remove '{name}' from the request", name, "unsupported_parameter")
    model = _optional(body, "model", str, "a string naming a served model")
    if model is not None and model not in server.engine.models:
        raise NotFound(f"model {model!r} is not served here; GET /v1/models lists: {', '.join(server.engine.models)}")
    n = _optional(body, "n", int, "the integer 1")
    if n not in (None, 1):
        raise BadRequest(f"'n' must be 1 (one choice per request), got {n!r}", "n")
    max_tokens = 256
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if not _is_int(value) or not 1 <= value <= MAX_TOKENS:
            raise BadRequest(f"'{name}' must be an integer in [1, {MAX_TOKENS}], got {value!r}", name)
        max_tokens = value
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
    args: dict[str, Any] = {
        "max_tokens": max_tokens,
        "temperature": _number(body, "temperature", 1.0, 0.0, 2.0),
        "top_p": _number(body, "top_p", 1.0, 0.0, 1.0),
        "seed": seed & 0x7FFFFFFF,
        "stop": json.dumps(stops),
        "max_context": _context_tokens(server, model),
    }
    if model is not None:
        args["model"] = model
    fmt = body.get("response_format")
    if fmt is None:
        fmt = {"type": "text"}
    if not isinstance(fmt, dict):
        raise BadRequest("'response_format' must be an object like {\"type\": \"json_object\"}", "response_format")
    kind = fmt.get("type")
    if kind == "json_object":
        args["json_object"] = True
    elif kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise BadRequest("response_format json_schema needs json_schema.schema (a JSON Schema object)",
                             "response_format.json_schema")
        args["schema"] = json.dumps(schema)
    elif kind != "text":
        raise BadRequest(f"response_format type must be 'text', 'json_object' or 'json_schema', got {kind!r:.80}",
                         "response_format.type")
    return args


def _context_tokens(server: PieServer, model: str | None) -> int:
    """Tokens one sequence of ``model`` can hold: its positions, and at most the whole KV pool."""
    loaded = server.engine.models[model] if model is not None else next(iter(server.engine.models.values()))
    return int(min(loaded.spec.max_position, loaded.caps.num_pages * loaded.caps.page_size))


def _text_size(texts: list[str], param: str) -> None:
    size = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
    if size > MAX_PROMPT_BYTES:
        raise BadRequest(f"'{param}' holds {size} bytes of text; the limit is {MAX_PROMPT_BYTES} bytes: shorten it",
                         param, "context_length_exceeded")


def _chat_messages(body: dict[str, Any]) -> str:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list of {role, content}", "messages")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise BadRequest(f"messages[{i}] must be an object {{role, content}}, got {type(msg).__name__}", f"messages[{i}]")
        role = msg.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise BadRequest(f"messages[{i}].role must be one of {', '.join(_ROLES)}, got {role!r:.80}",
                             f"messages[{i}].role")
        if msg.get("tool_calls") or msg.get("function_call"):
            raise BadRequest(f"messages[{i}] carries tool calls; tools are not supported yet", f"messages[{i}].tool_calls",
                             "unsupported_parameter")
        content = msg.get("content")
        if isinstance(content, list):  # content parts: only text parts are supported
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
                raise BadRequest(f"messages[{i}].content parts must all be {{\"type\": \"text\", \"text\": string}}",
                                 f"messages[{i}].content")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise BadRequest(f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}].content")
        out.append({"role": _ROLES[role], "content": content})
    _text_size([m["content"] for m in out], "messages")
    return json.dumps(out)


async def chat_completions(server: PieServer, user: str, request: HttpRequest, respond: HttpResponder) -> None:
    body = await _json_body(request)
    args = {**_common(server, body), "mode": "chat", "messages": _chat_messages(body)}
    await _run(server, user, body, args, respond, chat=True)


async def completions(server: PieServer, user: str, request: HttpRequest, respond: HttpResponder) -> None:
    body = await _json_body(request)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise BadRequest("'prompt' must be a string (or a list of one string)", "prompt")
    _text_size([prompt], "prompt")
    args = {**_common(server, body), "mode": "completion", "prompt": prompt}
    await _run(server, user, body, args, respond, chat=False)


async def _json_body(request: HttpRequest) -> dict[str, Any]:
    if len(request.body) > _THREAD_PARSE_BYTES:
        return await asyncio.to_thread(_parse_json, request.body)
    return _parse_json(request.body)


def _parse_json(raw: bytes) -> dict[str, Any]:
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


async def _run(server: PieServer, user: str, body: dict[str, Any], args: dict[str, Any], respond: HttpResponder, *, chat: bool) -> None:
    manifest = server.store.resolve(user, BUILTIN_PROGRAM)
    payload = manifest.validate_input(args)
    sink = _Collector()
    proc = server.processes.launch(user, manifest, payload, sink)
    meta = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{proc.id}{uuid.uuid4().hex[:8]}",
        "created": int(time.time()),
        "model": body.get("model") or next(iter(server.engine.models)),
    }
    try:
        if body.get("stream"):
            await _stream(sink, respond, meta, chat, bool((body.get("stream_options") or {}).get("include_usage")))
        else:
            await _whole(sink, respond, meta, chat)
    finally:
        server.processes.connection_closed(sink)  # cancels the process if it still runs


async def _whole(sink: _Collector, respond: HttpResponder, meta: dict[str, Any], chat: bool) -> None:
    parts: list[str] = []
    while True:
        kind, value = await sink.queue.get()
        if kind == "stdout":
            parts.append(value)
        elif kind == "error":
            respond.send(500, error_body(f"generation failed: {value}", "server_error"), "application/json")
            return
        elif kind == "return":
            _refused(value)
            break
    text = "".join(parts)
    choice: dict[str, Any] = {"index": 0, "finish_reason": value["finish_reason"], "logprobs": None}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    result = {
        **meta,
        "object": "chat.completion" if chat else "text_completion",
        "choices": [choice],
        "usage": _usage(value),
    }
    respond.send(200, json.dumps(result).encode(), "application/json")


async def _stream(sink: _Collector, respond: HttpResponder, meta: dict[str, Any], chat: bool, include_usage: bool) -> None:
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(delta: str | None, finish: str | None, first: bool = False) -> bytes:
        if chat:
            d: dict[str, Any] = {"role": "assistant", "content": ""} if first else ({} if delta is None else {"content": delta})
            choice: dict[str, Any] = {"index": 0, "delta": d, "finish_reason": finish, "logprobs": None}
        else:
            choice = {"index": 0, "text": delta or "", "finish_reason": finish, "logprobs": None}
        return _sse({**meta, "object": obj, "choices": [choice]})

    kind, value = await sink.queue.get()  # the first event decides between a 400 and a stream
    if kind == "return":
        _refused(value)
    respond.start(200, "text/event-stream")
    if chat:
        await respond.write(chunk(None, None, first=True))
    while True:
        if kind == "stdout":
            await respond.write(chunk(value, None))
        elif kind == "error":
            await respond.write(_sse({"error": {"message": f"generation failed: {value}", "type": "server_error",
                                                "param": None, "code": None}}))
            break
        elif kind == "return":
            await respond.write(chunk(None, value["finish_reason"]))
            if include_usage:
                await respond.write(_sse({**meta, "object": obj, "choices": [], "usage": _usage(value)}))
            break
        kind, value = await sink.queue.get()
    await respond.write(b"data: [DONE]\n\n")
    respond.end()


def _refused(ret: Any) -> None:
    """The inferlet refused the request (its prompt is too long for the model): a 400."""
    if isinstance(ret, dict) and "error" in ret:
        raise BadRequest(str(ret["error"]), ret.get("param"), ret.get("code"))


def _sse(obj: Any) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


def _usage(ret: dict[str, Any]) -> dict[str, int]:
    p, c = int(ret.get("prompt_tokens", 0)), int(ret.get("completion_tokens", 0))
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def status_of(exc: BaseException) -> tuple[int, str]:
    """HTTP status and OpenAI error type for an exception raised while handling a request."""
    if isinstance(exc, NotFound):
        return 404, "not_found_error"
    if isinstance(exc, InvalidInput):
        return 400, "invalid_request_error"
    if isinstance(exc, PieError) and exc.kind == "unauthorized":
        return 401, "authentication_error"
    return 500, "server_error"
