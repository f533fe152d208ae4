"""Engine-configured MCP servers: the ``[mcp.servers.NAME]`` tables of ``config.toml``.

Each entry starts a stdio server::

    [mcp.servers.calc]
    command = "python"
    args = ["-m", "calc_server"]
    env = { CALC_PRECISION = "10" }   # optional, merged over a minimal inherited environment
    cwd = "/srv/calc"                 # optional working directory
    timeout = 60                      # optional: seconds allowed per request (start-up: at least 30)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pie_core import config as pie_config
from pie_core.errors import InvalidInput

__all__ = ["StdioServerSpec", "configured_servers", "DEFAULT_TIMEOUT"]

DEFAULT_TIMEOUT = 60.0
_KEYS = ("command", "args", "env", "cwd", "timeout")


@dataclass(frozen=True, slots=True)
class StdioServerSpec:
    """How to start one configured MCP server as a subprocess speaking MCP on stdin/stdout."""

    name: str
    command: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    timeout: float = DEFAULT_TIMEOUT


def configured_servers(config: Any = None) -> dict[str, StdioServerSpec]:
    """Read every ``[mcp.servers.NAME]`` entry.

    Args:
        config: A loaded configuration document (default: :func:`pie_core.config.load_config`).

    Returns:
        Specs by server name (empty when the config names none).

    Raises:
        InvalidInput: An entry is malformed; the message names the entry, the key and the file.
    """
    doc = config if config is not None else pie_config.load_config()
    table = pie_config.get("mcp.servers", doc, {}) or {}
    if not isinstance(table, dict):
        raise _bad("mcp.servers", "must be a table of servers, e.g. [mcp.servers.NAME]")
    return {str(name): _spec(str(name), entry) for name, entry in table.items()}


def _spec(name: str, entry: Any) -> StdioServerSpec:
    where = f"mcp.servers.{name}"
    if not isinstance(entry, dict):
        raise _bad(where, "must be a table with at least 'command'")
    unknown = sorted(set(entry) - set(_KEYS))
    if unknown:
        raise _bad(where, f"has unknown keys {unknown}; allowed keys: {', '.join(_KEYS)}")
    command = entry.get("command")
    if not isinstance(command, str) or not command.strip():
        raise _bad(where, "needs 'command', the executable that starts the server (e.g. command = \"npx\")")
    args = entry.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise _bad(where, f"'args' must be a list of strings, got {args!r}")
    env = entry.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise _bad(where, f"'env' must be a table of string values, got {env!r}")
    cwd = entry.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise _bad(where, f"'cwd' must be a string path, got {cwd!r}")
    timeout = entry.get("timeout", DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise _bad(where, f"'timeout' must be a positive number of seconds, got {timeout!r}")
    return StdioServerSpec(name, command, tuple(args), dict(env), cwd, float(timeout))


def _bad(where: str, what: str) -> InvalidInput:
    return InvalidInput(f"[{where}] in {pie_config.config_path()} {what}")
