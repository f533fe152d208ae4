"""Every key ``pie config set`` accepts, with its type and range, checked before the file is written.

A key is one of the fixed keys of :data:`SETTINGS` (``engine.*``, ``server.worker_*``, ``server.cors_origins``), a model
entry field (``model.<name>.path`` / ``.format``), or a key of a table whose own reader checks it
(``server.quotas.*`` through :class:`~pie_core.server.quotas.Quotas`, ``mcp.servers.*`` through
:func:`~pie_core.mcp.servers.configured_servers`). Anything else is refused with one line that
lists the keys that exist.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomlkit
from tomlkit.toml_document import TOMLDocument

from pie_core import config
from pie_core.errors import InvalidInput, PieError

__all__ = ["Setting", "SETTINGS", "check_setting", "known_keys", "is_known", "unknown_key_message", "describe", "MODEL_FIELDS"]


class _Bad(Exception):
    """A value that does not fit; ``str()``, when not empty, says what is wrong with it."""


class _Expected(_Bad):
    """A value that does not fit; ``str()`` says what the key takes (instead of ``Setting.expected``)."""


Parse = Callable[[str, TOMLDocument], Any]


@dataclass(frozen=True, slots=True)
class Setting:
    """One settable key.

    Attributes:
        key: Dotted key (``<name>`` stands for any model name).
        expected: What a value must be, for error messages (``a whole number from 1 to 1024``).
        parse: ``parse(text, doc)`` → the value to store; raises ``_Bad`` naming the problem.
        help: What the key does.
    """

    key: str
    expected: str
    parse: Parse
    help: str


def _whole(low: int, high: int | None = None) -> Parse:
    def parse(text: str, doc: TOMLDocument) -> int:
        t = text.strip()
        if not re.fullmatch(r"[+-]?[0-9]+", t) or int(t) < low or (high is not None and int(t) > high):
            raise _Bad()
        return int(t)

    return parse


def _seconds(text: str, doc: TOMLDocument) -> int | float:
    try:
        value = float(text)
    except ValueError:
        raise _Bad() from None
    if not value >= 0 or value == float("inf"):
        raise _Bad()
    return int(value) if value.is_integer() else value


def _size(text: str, doc: TOMLDocument) -> int | str:
    t = text.strip().strip("\"'")
    try:
        size = config.parse_bytes(int(t) if t.isdigit() else t)
    except InvalidInput:
        raise _Bad() from None
    if size < 1:
        raise _Bad("the size must be at least one byte")
    return int(t) if t.isdigit() else t


def _string(text: str) -> str:
    value = config.parse_value(text)  # a quoted TOML string loses its quotes; anything else stays as typed
    return value if isinstance(value, str) else text


def _backend(text: str, doc: TOMLDocument) -> str:
    from pie_core.plugins import available_backends

    name = _string(text).strip()
    installed = sorted(available_backends())
    if name != "auto" and name not in installed:
        raise _Expected(f"'auto' or an installed backend: {', '.join(installed)} (see 'pie backends')")
    return name


def _absolute(text: str) -> str:
    path = os.path.expanduser(text)
    return text if os.path.isabs(path) or text.startswith("~") else os.path.abspath(path)


def _origins(text: str, doc: TOMLDocument) -> list[str]:
    from pie_core.server.cors import CorsPolicy

    value = config.parse_value(text)
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _Bad()
    try:
        CorsPolicy(tuple(v.rstrip("/").lower() if v != "*" else v for v in value))
    except PieError as exc:
        raise _Bad(str(exc)) from None
    return value


def _ray_setting(text: str, doc: TOMLDocument) -> str:
    value = _string(text).strip()
    if not value:
        raise _Bad()
    return value.lower() if value.lower() in ("on", "off") else value


def _model(text: str, doc: TOMLDocument) -> str:
    from pie_core.models.registry import check_model_name

    name = _string(text).strip()
    try:
        kind = check_model_name(name, doc)
    except PieError as exc:
        raise _Bad(str(exc)) from None
    return _absolute(name) if kind == "path" else name


def _model_path(text: str, doc: TOMLDocument) -> str:
    from pie_core.models.registry import guess_format

    path = _string(text).strip()
    try:
        guess_format(Path(os.path.expanduser(path)))
    except PieError as exc:
        raise _Bad(str(exc)) from None
    return _absolute(path)


def _model_format(text: str, doc: TOMLDocument) -> str:
    fmt = _string(text).strip()
    if fmt not in ("gguf", "hf"):
        raise _Bad()
    return fmt


SETTINGS: dict[str, Setting] = {s.key: s for s in (
    Setting("engine.default_model", "a model name (see 'pie model list'), a .gguf file, a Hugging Face folder or repo id",
            _model, "the model used when --model is not given"),
    Setting("engine.default_backend", "'auto' or an installed backend", _backend,
            "the backend used when --backend is not given; auto is torch where installed, else cpu"),
    Setting("engine.page_size", "a whole number from 1 to 1024", _whole(1, 1024), "tokens per KV-cache page"),
    Setting("engine.kv_memory", "a size such as 2GiB, 512MiB or a byte count", _size,
            "memory for the KV cache when engine.kv_pages is 0"),
    Setting("engine.kv_pages", "a whole number >= 0", _whole(0),
            "KV pages in the device pool; 0 sizes it from engine.kv_memory"),
    Setting("engine.host_pages", "a whole number >= -1", _whole(-1),
            "host pages suspended contexts are offloaded to; 0 is none, -1 the backend's default"),
    Setting("engine.replicas", "a whole number >= 1", _whole(1),
            "replicas of each model the engine loads, each its own backend, KV pool and batcher (pie serve --replicas)"),
    Setting("engine.ray", "'off', 'on', or a Ray address such as 'auto' or 'ray://head:10001'", _ray_setting,
            "run each replica's backend in a Ray actor (pie serve --ray): 'on' joins RAY_ADDRESS or starts a local Ray"),
    Setting("model.<name>.path", "an existing .gguf file or Hugging Face folder", _model_path,
            "where the model <name> is; a relative path is stored absolute"),
    Setting("model.<name>.format", "'gguf' or 'hf'", _model_format, "the checkpoint format, guessed from the path when unset"),
    Setting("server.worker_wall_s", "a number of seconds >= 0", _seconds, "wall-clock limit of a worker; 0 is none"),
    Setting("server.worker_start_s", "a number of seconds >= 0", _seconds, "time a worker may take to start"),
    Setting("server.worker_cpu_s", "a whole number of seconds >= 0", _whole(0), "CPU-time limit of a worker; 0 is none"),
    Setting("server.worker_memory", "a size such as 4GiB", _size, "address-space limit of a worker"),
    Setting("server.cors_origins", "a list of web origins such as '[\"https://app.example.com\"]', or '*'",
            _origins, "web pages allowed to call the HTTP API from a browser; none by default"),
)}
MODEL_FIELDS = ("path", "format")
_TABLES = ("server.quotas.<quota>", "server.quotas.users.<user>.<quota>",
           "mcp.servers.<name>.<command|args|env|cwd|timeout>")


def known_keys() -> list[str]:
    """Every key ``pie config set`` takes, in the order ``config set --help`` lists them."""
    return [*SETTINGS, *_TABLES]


def check_setting(key: str, text: str, doc: TOMLDocument) -> Any:
    """The value to store for ``pie config set KEY TEXT``, checked against the key's schema.

    Args:
        key: The dotted key as typed.
        text: The value as typed (a TOML literal or plain text).
        doc: The configuration being changed (tables the value is checked with, model entries).

    Returns:
        The typed value to store (``16``, ``"2GiB"``, an absolute path, ...).

    Raises:
        InvalidInput: An unknown key (the message lists the valid keys) or a value of the wrong
            type or out of range (the message says what the key takes). One line.
    """
    parts = config.split_key(key)
    kind = _kind(parts)
    if isinstance(kind, Setting):
        try:
            return kind.parse(text, doc)
        except _Expected as bad:
            raise InvalidInput(f"{key} takes {bad}, got {text!r}: {kind.help}") from None
        except _Bad as bad:
            if str(bad):
                raise InvalidInput(f"{key}: {bad}") from None
            raise InvalidInput(f"{key} takes {kind.expected}, got {text!r}: {kind.help}") from None
    if kind == "quotas":
        return _checked_by_reader(key, text, doc, _quotas)
    if kind == "mcp":
        return _checked_by_reader(key, text, doc, _mcp)
    if kind == "auth":
        raise InvalidInput(f"{key}: users are kept by 'pie auth add NAME' and 'pie auth remove NAME', not 'pie config set'")
    raise InvalidInput(unknown_key_message(key))


def is_known(key: str) -> bool:
    """Whether ``key`` names a key of the schema (its value unchecked)."""
    return _kind(config.split_key(key)) is not None


def _kind(parts: list[str]) -> Setting | str | None:
    if parts[0] == "model" and len(parts) == 3 and parts[2] in MODEL_FIELDS:
        return SETTINGS[f"model.<name>.{parts[2]}"]
    if len(parts) == 2 and ".".join(parts) in SETTINGS:
        return SETTINGS[".".join(parts)]
    if parts[:2] == ["server", "quotas"] and len(parts) >= 3:
        return "quotas"
    if parts[:2] == ["mcp", "servers"] and len(parts) >= 4:
        return "mcp"
    return "auth" if parts[0] == "auth" else None


def unknown_key_message(key: str) -> str:
    """One line: the key is unknown, the nearest fixed key, and every valid key."""
    close = difflib.get_close_matches(key, [k for k in SETTINGS if "<" not in k], n=1, cutoff=0.8)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"unknown config key {key!r}{hint}; valid keys: {', '.join(known_keys())}"


def _checked_by_reader(key: str, text: str, doc: TOMLDocument, read: Callable[[TOMLDocument, list[str]], None]) -> Any:
    value = config.parse_value(text)
    probe = tomlkit.parse(doc.as_string())  # a copy: the reader sees the table as it would be saved
    config.set(key, value, config=probe)
    read(probe, config.split_key(key))
    return value


def _quotas(probe: TOMLDocument, parts: list[str]) -> None:
    from pie_core.server.quotas import Quotas

    Quotas.from_config(probe)  # raises InvalidInput naming an unknown quota or a bad value


def _mcp(probe: TOMLDocument, parts: list[str]) -> None:
    from pie_core.mcp.servers import configured_servers

    entry = probe["mcp"]["servers"][parts[2]]  # type: ignore[index]
    if isinstance(entry, dict) and "command" not in entry:
        entry["command"] = "placeholder"  # fields may be set before 'command'; each is checked alone
    configured_servers(probe)


def describe() -> str:
    """The keys with what each takes, one per line (``pie config set --help``)."""
    lines = [f"  {s.key}: {s.expected}; {s.help}" for s in SETTINGS.values()]
    lines += [f"  {t}: checked as the server reads it" for t in _TABLES]
    return "\n".join(lines)
