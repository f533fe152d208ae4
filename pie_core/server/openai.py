"""OpenAI-compatible ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/embeddings``, served
by the built-in ``openai-compat`` inferlet (see ``builtin/openai-compat``).

A request is checked (:mod:`pie_core.server.openai_request`) and turned into that inferlet's
input; its Stdout events are JSON messages (a choice's text, logprobs and tool calls, or an
embedding), joined into one reply or sent as SSE chunks when ``stream`` is true; its Return
event carries the finish reasons and token counts. A client that disconnects cancels the
process, so its pages return at once. Time to first token, inter-token latency and end-to-end
latency go to ``/metrics`` (:mod:`pie_core.server.latency`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import time
import uuid
from typing import TYPE_CHECKING, Any, AsyncIterator

import msgpack

from pie_core.errors import InvalidInput, NotFound, PieError
from pie_core.server.http import HttpRequest, HttpResponder, error_json
from pie_core.server.openai_grammar import check_grammar
from pie_core.server.openai_placement import demand_of
from pie_core.server.openai_reply import Choice, Logprobs, chat_message, tool_call, usage
from pie_core.server.openai_request import (MAX_PROMPT_BYTES, BadRequest, chat_args, completion_args, context_tokens,
                                            embedding_args, parse_json)

if TYPE_CHECKING:
    from pie_core.server.app import PieServer

__all__ = ["chat_completions", "completions", "embeddings", "error_body", "error_response", "status_of", "BadRequest",
           "BUILTIN_PROGRAM", "MAX_PROMPT_BYTES"]

BUILTIN_PROGRAM = "openai-compat"
_THREAD_PARSE_BYTES = 64 * 1024  # bigger bodies are parsed off the event loop
_QUEUED_EVENTS = 64  # events read ahead of the HTTP response; past it the process buffers (quota event_bytes)
_context_tokens = context_tokens  # the name tests and older callers use


class _Collector:
    """A process sink that decodes event frames into a bounded queue (backpressure to the process)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(_QUEUED_EVENTS)

    async def send(self, message: bytes) -> None:
        frame = msgpack.unpackb(message, raw=False)
        await self.queue.put((frame["event"], frame["value"]))


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None) -> bytes:
    """An error in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""
    return error_json(message, kind, param, code)


def error_response(exc: PieError) -> tuple[int, bytes]:
    """The status and OpenAI-shaped body for an error raised while handling a request."""
    status, kind = status_of(exc)
    return status, error_body(str(exc), kind, getattr(exc, "param", None), getattr(exc, "code", None))


def status_of(exc: BaseException) -> tuple[int, str]:
    """HTTP status and OpenAI error type for an exception raised while handling a request."""
    if isinstance(exc, NotFound):
        return 404, "not_found_error"
    if isinstance(exc, InvalidInput):
        return 400, "invalid_request_error"
    if isinstance(exc, PieError) and exc.kind == "unauthorized":
        return 401, "authentication_error"
    return 500, "server_error"


async def _json_body(request: HttpRequest) -> dict[str, Any]:
    if len(request.body) > _THREAD_PARSE_BYTES:
        return await asyncio.to_thread(parse_json, request.body)
    return parse_json(request.body)


async def _args(request: HttpRequest, make: Any, server: PieServer, body: dict[str, Any]) -> dict[str, Any]:
    """The built-in inferlet's input from ``body``: off the loop for a big body (a long tools
    list is re-encoded, its sizes counted)."""
    if len(request.body) > _THREAD_PARSE_BYTES:
        return await asyncio.to_thread(make, server, body)
    return make(server, body)


async def chat_completions(server: PieServer, user: str, request: HttpRequest, respond: HttpResponder) -> None:
    started = time.monotonic()
    body = await _json_body(request)
    args = await _args(request, chat_args, server, body)
    await check_grammar(server, user, args)
    await _Generation(server, body, args, started, chat=True).run(user, respond)


async def completions(server: PieServer, user: str, request: HttpRequest, respond: HttpResponder) -> None:
    started = time.monotonic()
    body = await _json_body(request)
    args = await _args(request, completion_args, server, body)
    await check_grammar(server, user, args)
    await _Generation(server, body, args, started, chat=False).run(user, respond)


async def embeddings(server: PieServer, user: str, request: HttpRequest, respond: HttpResponder) -> None:
    body = await _json_body(request)
    args = embedding_args(server, body)
    vectors: dict[int, list[float]] = {}
    async for kind, value in _events(server, user, args):
        if kind == "message" and "e" in value:
            vectors[int(value["i"])] = value["e"]
        elif kind == "error":
            respond.send(500, error_body(f"embedding failed: {value}", "server_error"), "application/json")
            return
        elif kind == "return":
            _refused(value)
            tokens = int(value.get("prompt_tokens", 0))
            reply = {"object": "list", "model": args["model"], "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
            b64 = body.get("encoding_format") == "base64"
            # up to 256 vectors of hidden_size floats: encoded off the event loop
            respond.send(200, await asyncio.to_thread(_embedding_reply, reply, vectors, b64), "application/json")
            return


def _embedding_reply(reply: dict[str, Any], vectors: dict[int, list[float]], b64: bool) -> bytes:
    data = [{"object": "embedding", "index": i,
             "embedding": base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode() if b64 else v}
            for i, v in sorted(vectors.items())]
    return json.dumps({**reply, "data": data}).encode()


async def _events(server: PieServer, user: str, args: dict[str, Any]) -> AsyncIterator[tuple[str, Any]]:
    """Run the built-in inferlet; yield ``("message", dict)`` per Stdout event, then ``("return",
    value)`` or ``("error", text)``. Leaving early cancels the process."""
    manifest = server.store.resolve(user, BUILTIN_PROGRAM)
    payload = manifest.validate_input(args)
    sink = _Collector()
    server.processes.launch(user, manifest, payload, sink, demand=demand_of(server, args))
    try:
        while True:
            kind, value = await sink.queue.get()
            if kind == "stdout":
                yield "message", json.loads(value)
            elif kind in ("return", "error"):
                yield kind, value
                return
    finally:
        server.processes.connection_closed(sink)  # cancels the process if it still runs


def _refused(ret: Any) -> None:
    """The inferlet refused the request (its prompt is too long for the model, ...): a 400."""
    if isinstance(ret, dict) and "error" in ret:
        raise BadRequest(str(ret["error"]), ret.get("param"), ret.get("code"))


def _sse(obj: Any) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


class _Generation:
    """One chat or text completion request: its choices as they come, its latencies, its reply."""

    def __init__(self, server: PieServer, body: dict[str, Any], args: dict[str, Any], started: float, *, chat: bool) -> None:
        self.server, self.body, self.args, self.chat, self.started = server, body, args, chat, started
        self.model = args["model"]
        self.choices = [Choice(i) for i in range(args["n"])]
        self.logprobs = Logprobs(server.engine.models[self.model].tokenizer.token_bytes)
        self.meta = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}", "created": int(time.time()),
                     "model": self.model}
        self.object = "chat.completion" if chat else "text_completion"
        self._first = True
        self._last: dict[int, float] = {}

    async def run(self, user: str, respond: HttpResponder) -> None:
        events = _events(self.server, user, self.args)
        try:
            if self.body.get("stream"):
                await self._stream(events, respond)
            else:
                await self._whole(events, respond)
        finally:
            await events.aclose()

    def _timing(self, value: dict[str, Any]) -> None:
        """TTFT at the first generated token, inter-token latency per choice (a step's tokens share its wait)."""
        n = int(value.get("n", 0))
        if n <= 0:
            return
        metrics = self.server.request_metrics
        now = time.monotonic()
        i = int(value["i"])
        if self._first:
            self._first = False
            metrics.ttft[self.model].observe(now - self.started)
        last = self._last.get(i)
        if last is not None:
            metrics.itl[self.model].observe((now - last) / n, n)
        self._last[i] = now

    def _take(self, value: dict[str, Any]) -> dict[str, Any] | None:
        """Fold a message into its choice; the delta to stream (None: nothing to show)."""
        self._timing(value)
        choice = self.choices[int(value["i"])]
        if "call" in value:
            name, args = value["call"]
            call = tool_call(name, args)
            choice.calls.append(call)
            return {"tool_calls": [{"index": len(choice.calls) - 1, **call}]}
        text, entries = value.get("text") or "", value.get("lp") or []
        if not text and not entries:
            return None
        offset = choice.chars
        choice.text.append(text)
        choice.chars += len(text)
        choice.entries.extend(entries)
        delta: dict[str, Any] = {"content": text}
        if self.args.get("logprobs"):
            delta["logprobs"] = self._render(entries, offset)
        return delta

    def _render(self, entries: list[list[Any]], offset: int) -> Any:
        if self.chat:
            return {"content": self.logprobs.chat(entries), "refusal": None}
        return self.logprobs.legacy(entries, offset)

    def _finish(self, ret: dict[str, Any]) -> tuple[list[str], dict[str, int]]:
        self.server.request_metrics.e2e[self.model].observe(time.monotonic() - self.started)
        finishes = [str(c["finish_reason"]) for c in ret["choices"]]
        completion = sum(int(c.get("completion_tokens", 0)) for c in ret["choices"])
        return finishes, usage(int(ret.get("prompt_tokens", 0)), completion)

    async def _whole(self, events: AsyncIterator[tuple[str, Any]], respond: HttpResponder) -> None:
        async for kind, value in events:
            if kind == "message":
                self._take(value)
            elif kind == "error":
                respond.send(500, error_body(f"generation failed: {value}", "server_error"), "application/json")
                return
            elif kind == "return":
                _refused(value)
                finishes, used = self._finish(value)
                out = []
                for choice, finish in zip(self.choices, finishes):
                    item: dict[str, Any] = {"index": choice.index, "finish_reason": finish, "logprobs": None}
                    if self.args.get("logprobs"):
                        item["logprobs"] = self._render(choice.entries, 0)
                    if self.chat:
                        item["message"] = chat_message(choice)
                    else:
                        item["text"] = "".join(choice.text)
                    out.append(item)
                reply = {**self.meta, "object": self.object, "choices": out, "usage": used}
                respond.send(200, json.dumps(reply).encode(), "application/json")
                return

    def _chunk(self, index: int, delta: dict[str, Any] | None, finish: str | None) -> bytes:
        delta = delta or {}
        logprobs = delta.pop("logprobs", None)
        if self.chat:
            choice: dict[str, Any] = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
            return _sse({**self.meta, "object": "chat.completion.chunk", "choices": [choice]})
        choice = {"index": index, "text": delta.get("content", ""), "finish_reason": finish, "logprobs": logprobs}
        return _sse({**self.meta, "object": "text_completion", "choices": [choice]})

    async def _stream(self, events: AsyncIterator[tuple[str, Any]], respond: HttpResponder) -> None:
        include_usage = bool((self.body.get("stream_options") or {}).get("include_usage"))
        first = await anext(events)  # the first event decides between a 400 and a stream
        if first[0] == "return":
            _refused(first[1])
        respond.start(200, "text/event-stream")
        if self.chat:
            for choice in self.choices:
                await respond.write(self._chunk(choice.index, {"role": "assistant", "content": ""}, None))
        async for kind, value in _chain(first, events):
            if kind == "message":
                delta = self._take(value)
                if delta is not None:
                    await respond.write(self._chunk(int(value["i"]), delta, None))
            elif kind == "error":
                await respond.write(_sse({"error": {"message": f"generation failed: {value}", "type": "server_error",
                                                    "param": None, "code": None}}))
                break
            elif kind == "return":
                finishes, used = self._finish(value)
                for choice, finish in zip(self.choices, finishes):
                    await respond.write(self._chunk(choice.index, None, finish))
                if include_usage:
                    await respond.write(_sse({**self.meta, "object": "chat.completion.chunk" if self.chat else
                                              "text_completion", "choices": [], "usage": used}))
                break
        await respond.write(b"data: [DONE]\n\n")
        respond.end()


async def _chain(first: tuple[str, Any], rest: AsyncIterator[tuple[str, Any]]) -> AsyncIterator[tuple[str, Any]]:
    yield first
    async for event in rest:
        yield event
