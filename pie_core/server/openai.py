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
from pie_core.server.http import HttpRequest, HttpResponder

if TYPE_CHECKING:
    from pie_core.server.app import PieServer

__all__ = ["chat_completions", "completions", "error_body", "BUILTIN_PROGRAM"]

BUILTIN_PROGRAM = "openai-compat"
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


class _Collector:
    """A process sink that decodes event frames into a queue."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    async def send(self, message: bytes) -> None:
        frame = msgpack.unpackb(message, raw=False)
        self.queue.put_nowait((frame["event"], frame["value"]))


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None) -> bytes:
    """An error in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""
    return json.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}}).encode()


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise InvalidInput(f"'{name}' must be a number in [{low}, {high}], got {value!r}")
    return float(value)


def _common(server: PieServer, body: dict[str, Any]) -> dict[str, Any]:
    """The inferlet input shared by both endpoints."""
    model = body.get("model")
    if model is not None and model not in server.engine.models:
        raise NotFound(f"model {model!r} is not served here; GET /v1/models lists: {', '.join(server.engine.models)}")
    if body.get("n", 1) not in (1, None):
        raise InvalidInput("'n' must be 1 (one choice per request)")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens")) or 256
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= 32768:
        raise InvalidInput(f"'max_tokens' must be an integer in [1, 32768], got {max_tokens!r}")
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop or []
    if not isinstance(stops, list) or len(stops) > 4 or not all(isinstance(s, str) for s in stops):
        raise InvalidInput("'stop' must be a string or a list of up to 4 strings")
    seed = body.get("seed") or 0
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InvalidInput(f"'seed' must be an integer, got {seed!r}")
    args: dict[str, Any] = {
        "max_tokens": max_tokens,
        "temperature": _number(body, "temperature", 1.0, 0.0, 2.0),
        "top_p": _number(body, "top_p", 1.0, 0.0, 1.0),
        "seed": seed & 0x7FFFFFFF,
        "stop": json.dumps(stops),
    }
    if model is not None:
        args["model"] = model
    fmt = body.get("response_format") or {"type": "text"}
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "json_object":
        args["json_object"] = True
    elif kind == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema")
        if not isinstance(schema, dict):
            raise InvalidInput("response_format json_schema needs json_schema.schema (a JSON Schema object)")
        args["schema"] = json.dumps(schema)
    elif kind != "text":
        raise InvalidInput(f"response_format type must be 'text', 'json_object' or 'json_schema', got {kind!r}")
    return args


def _chat_messages(body: dict[str, Any]) -> str:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidInput("'messages' must be a non-empty list of {role, content}")
    out = []
    for i, msg in enumerate(messages):
        role = msg.get("role") if isinstance(msg, dict) else None
        if role not in _ROLES:
            raise InvalidInput(f"messages[{i}].role must be one of {', '.join(_ROLES)}, got {role!r}")
        content = msg.get("content")
        if isinstance(content, list):  # content parts: only text parts are supported
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise InvalidInput(f"messages[{i}].content parts must all be of type 'text'")
            content = "".join(str(p.get("text", "")) for p in content)
        if not isinstance(content, str):
            raise InvalidInput(f"messages[{i}].content must be a string or a list of text parts")
        out.append({"role": _ROLES[role], "content": content})
    return json.dumps(out)


async def chat_completions(server: PieServer, user: str, request: HttpRequest, respond: HttpResponder) -> None:
    body = _json_body(request)
    args = {**_common(server, body), "mode": "chat", "messages": _chat_messages(body)}
    await _run(server, user, body, args, respond, chat=True)


async def completions(server: PieServer, user: str, request: HttpRequest, respond: HttpResponder) -> None:
    body = _json_body(request)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise InvalidInput("'prompt' must be a string (or a list of one string)")
    args = {**_common(server, body), "mode": "completion", "prompt": prompt}
    await _run(server, user, body, args, respond, chat=False)


def _json_body(request: HttpRequest) -> dict[str, Any]:
    try:
        body = json.loads(request.body or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"the request body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidInput("the request body must be a JSON object")
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

    respond.start(200, "text/event-stream")
    if chat:
        await respond.write(chunk(None, None, first=True))
    while True:
        kind, value = await sink.queue.get()
        if kind == "stdout":
            await respond.write(chunk(value, None))
        elif kind == "error":
            await respond.write(_sse({"error": {"message": f"generation failed: {value}", "type": "server_error"}}))
            break
        elif kind == "return":
            await respond.write(chunk(None, value["finish_reason"]))
            if include_usage:
                await respond.write(_sse({**meta, "object": obj, "choices": [], "usage": _usage(value)}))
            break
    await respond.write(b"data: [DONE]\n\n")
    respond.end()


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
