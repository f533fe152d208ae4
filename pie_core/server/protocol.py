"""The wire format of ``pie serve``: MessagePack frames over WebSocket binary messages.

Every frame is one MessagePack map. A client sends *requests* ``{"type": T, "id": N, ...}``;
the server answers each with one *response* ``{"type": "response", "id": N, "ok": true,
"result": ...}`` or ``{"type": "response", "id": N, "ok": false, "error": {"kind": K,
"message": M}}`` and pushes *events* ``{"type": "event", "process": P, "seq": S, "event": E,
"value": V}`` for the processes a connection is attached to. For MCP servers the client
registered (``mcp_register``) the server also sends ``{"type": "mcp_request", "call": C,
"process": P, "server": S, "method": M, "params": {...}}``; the client answers with an
``mcp_result`` request carrying the same ``call``. See docs/server.md.
"""

from __future__ import annotations

from typing import Any

import msgpack

from pie_core.errors import InvalidInput, PieError

__all__ = [
    "REQUEST_TYPES",
    "ProtocolError",
    "decode_frame",
    "request_id",
    "encode",
    "response_ok",
    "response_error",
    "event_frame",
    "mcp_request_frame",
    "field",
]

#: Every request type the server understands (docs/server.md describes each).
REQUEST_TYPES = (
    "auth",
    "ping",
    "list_models",
    "list_programs",
    "upload_begin",
    "upload_chunk",
    "upload_end",
    "launch",
    "attach",
    "detach",
    "send",
    "transfer_file",
    "signal",
    "terminate",
    "list_processes",
    "mcp_register",
    "mcp_unregister",
    "mcp_result",
)

_MAX_ID = 2**53


class ProtocolError(InvalidInput):
    """A frame the server cannot read; the response carries ``kind = "protocol_error"``."""

    kind = "protocol_error"


def encode(frame: dict[str, Any]) -> bytes:
    """One frame as MessagePack bytes (``bytes`` values stay binary)."""
    return msgpack.packb(frame, use_bin_type=True)


def decode_frame(data: bytes | str) -> dict[str, Any]:
    """Parse and check one client frame.

    Returns:
        The request map, with ``type`` a known request type and ``id`` an integer.

    Raises:
        ProtocolError: A text message, bytes that are not MessagePack, not a map, or a frame
            without a usable ``id``/``type`` (the message names what is wrong).
    """
    if isinstance(data, str):
        raise ProtocolError("frames must be binary WebSocket messages holding MessagePack, got a text message")
    try:
        frame = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise ProtocolError(f"frame is not valid MessagePack ({type(exc).__name__}: {exc})") from None
    if not isinstance(frame, dict):
        raise ProtocolError(f"a frame must be a MessagePack map, got {type(frame).__name__}")
    rid = frame.get("id")
    if not isinstance(rid, int) or isinstance(rid, bool) or not 0 <= rid < _MAX_ID:
        raise ProtocolError(f"a request needs an integer 'id' in [0, 2**53), got {rid!r}")
    kind = frame.get("type")
    if kind not in REQUEST_TYPES:
        raise ProtocolError(f"unknown request type {kind!r}; types: {', '.join(REQUEST_TYPES)}")
    return frame


def request_id(data: bytes | str) -> int | None:
    """Best-effort id of a frame that failed :func:`decode_frame` (None when unreadable)."""
    try:
        frame = msgpack.unpackb(data, raw=False) if isinstance(data, bytes) else None
    except Exception:
        return None
    rid = frame.get("id") if isinstance(frame, dict) else None
    return rid if isinstance(rid, int) and not isinstance(rid, bool) and 0 <= rid < _MAX_ID else None


def field(frame: dict[str, Any], name: str, kind: type | tuple[type, ...], *, default: Any = ...) -> Any:
    """Field ``name`` of a request, checked against ``kind``.

    Raises:
        InvalidInput: Missing (and no default) or of the wrong type, named in the message.
    """
    if name not in frame:
        if default is ...:
            raise InvalidInput(f"{frame.get('type')} request needs field {name!r}")
        return default
    value = frame[name]
    bad_bool = isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,))
    if not isinstance(value, kind) or bad_bool:
        want = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise InvalidInput(f"{frame.get('type')} field {name!r} must be {want}, got {type(value).__name__}")
    return value


def response_ok(rid: int, result: Any = None) -> bytes:
    return encode({"type": "response", "id": rid, "ok": True, "result": result})


def response_error(rid: int | None, exc: BaseException) -> bytes:
    """An error response; ``kind`` is the PieError kind (``internal`` for anything else)."""
    kind = exc.kind if isinstance(exc, PieError) else "internal"
    message = str(exc) if isinstance(exc, PieError) else f"{type(exc).__name__}: {exc}"
    return encode({"type": "response", "id": rid, "ok": False, "error": {"kind": kind, "message": message}})


def event_frame(process: str, seq: int, kind: str, value: Any) -> bytes:
    return encode({"type": "event", "process": process, "seq": seq, "event": kind, "value": value})


def mcp_request_frame(call: int, process: str, server: str, method: str, params: dict[str, Any]) -> bytes:
    """A relayed MCP request for the client; it answers with ``mcp_result`` and the same ``call``."""
    return encode({"type": "mcp_request", "call": call, "process": process, "server": server,
                   "method": method, "params": params})
