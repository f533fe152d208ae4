"""``~/.pie/config.toml``: engine settings and named models, edited with comments preserved.

The folder is ``$PIE_HOME`` when set. A missing file reads as the defaults below (with their
comments); :func:`save_config` writes it. Keys are dotted paths: ``engine.page_size``,
``model.<name>.path``. Model names may contain dots (``qwen2.5-coder``): in a
``model.<name>.<field>`` key everything between the first and the last dot is the name
(``get("model.<name>")`` also finds a whole entry), and any segment may be quoted
(``model."a.b".path``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import tomlkit
from tomlkit.exceptions import TOMLKitError
from tomlkit.toml_document import TOMLDocument

from pie_core.errors import InvalidInput

__all__ = [
    "config_home",
    "config_path",
    "default_config",
    "load_config",
    "save_config",
    "get",
    "set",
    "split_key",
    "parse_value",
    "parse_bytes",
    "DEFAULTS",
]

DEFAULTS: dict[str, Any] = {
    "engine.default_model": "qwen2.5-coder-0.5b-instruct",
    "engine.default_backend": "auto",
    "engine.page_size": 16,
    "engine.kv_memory": "2GiB",
    "engine.kv_pages": 0,
    "engine.host_pages": -1,
    "engine.replicas": 1,
    "engine.ray": "off",
}

_DEFAULT_TEXT = '''\
# Pie configuration. Edit by hand or with `pie config set KEY VALUE` (comments are kept).

[engine]
# Model used when none is named: a built-in name or a [model.<name>] entry below.
default_model = "qwen2.5-coder-0.5b-instruct"
# Backend plugin ("auto" picks torch where installed, else cpu).
default_backend = "auto"
# Tokens per KV-cache page.
page_size = 16
# Memory for the KV cache ("2GiB", "512MiB", or a byte count).
kv_memory = "2GiB"
# KV pages in the device pool; 0 = as many as fit in kv_memory (`pie run --kv-pages N`).
kv_pages = 0
# Host-memory pages suspended contexts are offloaded to; 0 = none (they are replayed),
# -1 = the backend's default (`pie run --host-pages N`).
host_pages = -1

# Add models by name:
# [model.my-model]
# path = "/path/to/model.gguf"   # a .gguf file or a Hugging Face folder
# format = "gguf"                # optional: "gguf" or "hf" (guessed from the path)
'''


def config_home() -> Path:
    """The configuration folder: ``$PIE_HOME`` or ``~/.pie``."""
    env = os.environ.get("PIE_HOME")
    return Path(env).expanduser() if env else Path.home() / ".pie"


def config_path() -> Path:
    """The configuration file."""
    return config_home() / "config.toml"


def default_config() -> TOMLDocument:
    """A fresh document holding the defaults, with comments."""
    return tomlkit.parse(_DEFAULT_TEXT)


def load_config(path: str | Path | None = None) -> TOMLDocument:
    """Read the configuration.

    Args:
        path: The file (default :func:`config_path`).

    Returns:
        The parsed document (its comments and layout survive :func:`save_config`), or the
        defaults when the file does not exist.

    Raises:
        InvalidInput: The file is not valid TOML.
    """
    file = Path(path) if path is not None else config_path()
    if not file.is_file():
        return default_config()
    try:
        return tomlkit.parse(file.read_text(encoding="utf-8"))
    except TOMLKitError as e:
        raise InvalidInput(f"{file} is not valid TOML: {e}") from e


def save_config(config: TOMLDocument, path: str | Path | None = None) -> Path:
    """Write ``config`` atomically (a temporary file renamed over the old one); returns the path."""
    file = Path(path) if path is not None else config_path()
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_name(f".{file.name}.tmp-{os.getpid()}")
    tmp.write_text(tomlkit.dumps(config), encoding="utf-8")
    os.replace(tmp, file)
    return file


_SEGMENT = re.compile(r'"((?:[^"\\]|\\.)*)"|\'([^\']*)\'|([^.]+)')


def split_key(key: str) -> list[str]:
    """Split a dotted key into segments (see the module docstring for model names).

    Raises:
        InvalidInput: An empty key or segment.
    """
    parts: list[str] = []
    pos = 0
    quoted = False
    while pos < len(key):
        m = _SEGMENT.match(key, pos)
        if m is None:
            raise InvalidInput(f"bad config key {key!r}: empty segment at offset {pos}")
        quoted = quoted or m.group(3) is None
        parts.append(next(g for g in m.groups() if g is not None))
        pos = m.end()
        if pos < len(key):
            if key[pos] != ".":
                raise InvalidInput(f"bad config key {key!r} at offset {pos}")
            pos += 1
            if pos == len(key):
                raise InvalidInput(f"bad config key {key!r}: trailing dot")
    if not parts:
        raise InvalidInput("config key must not be empty")
    if parts[0] == "model" and len(parts) > 3 and not quoted:
        parts = ["model", ".".join(parts[1:-1]), parts[-1]]
    return parts


def get(key: str, config: TOMLDocument | None = None, default: Any = None) -> Any:
    """Value at dotted ``key`` as plain Python (tables become dicts).

    Falls back to :data:`DEFAULTS`, then to ``default``.
    """
    doc = config if config is not None else load_config()
    node: Any = doc
    parts = split_key(key)
    rest = key[len("model.") :] if key.startswith("model.") else None
    if rest and '"' not in key and "'" not in key and rest in doc.get("model", {}):
        parts = ["model", rest]  # the whole entry of a model whose name has dots
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            return DEFAULTS.get(key, default)
        node = node[part]
    return node.unwrap() if hasattr(node, "unwrap") else node


def set(key: str, value: Any, config: TOMLDocument | None = None, path: str | Path | None = None) -> TOMLDocument:  # noqa: A001
    """Set dotted ``key`` to ``value``, creating tables on the way.

    The value is not checked here (readers check what they read); ``pie config set`` checks it
    first against :mod:`pie_core.cli.config_schema`.

    Args:
        key: e.g. ``engine.page_size`` or ``model.my-model.path``.
        value: A TOML-representable value.
        config: Change this document in memory only; when ``None`` the file is loaded,
            changed and saved (comments preserved).
        path: The file when ``config`` is ``None`` (default :func:`config_path`).

    Returns:
        The changed document.

    Raises:
        InvalidInput: A segment on the way is a value, not a table.
    """
    doc = config if config is not None else load_config(path)
    parts = split_key(key)
    node: Any = doc
    for i, part in enumerate(parts[:-1]):
        if part not in node:
            # A table that only holds tables stays implicit, so entries read [model.x], [server.quotas].
            node[part] = tomlkit.table(is_super_table=i < len(parts) - 2)
        node = node[part]
        if not isinstance(node, dict):
            raise InvalidInput(f"cannot set {key!r}: {'.'.join(parts[: i + 1])} is a value, not a table")
    node[parts[-1]] = value
    if config is None:
        save_config(doc, path)
    return doc


def parse_value(text: str) -> Any:
    """Interpret command-line text as a TOML value (``16``, ``true``, ``"x"``), else a string."""
    try:
        return tomlkit.parse(f"v = {text}").unwrap()["v"]
    except TOMLKitError:
        return text


_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "tb": 10**12}


def parse_bytes(value: str | int) -> int:
    """``"2GiB"`` → 2147483648; integers pass through.

    Units: B, KB/MB/GB/TB (powers of 1000; K/M/G alone too) and KiB/MiB/GiB/TiB (powers of 1024),
    in any case.

    Raises:
        InvalidInput: Not a size (a string without a known unit, a float, a bool, ...).
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", value) if isinstance(value, str) else None
    if m is None or m.group(2).lower() not in _UNITS:
        raise InvalidInput(f"not a size: {value!r} (use e.g. 2GiB, 512MiB or a byte count)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
