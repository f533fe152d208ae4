"""Backend discovery and binding: entry points in ``pie.backends`` -> a validated PluginManager.

Each backend gets its own ``pluggy.PluginManager`` (one loaded model per backend instance), so
cross-cutting plugins (metrics, tracing, fault injection) register beside it as hookwrappers.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import pluggy

from pie_core.errors import ContractError, NotFound
from pie_core.hookspec import CONTRACT_VERSION, BackendInfo, BackendSpec

__all__ = ["ENTRY_POINT_GROUP", "BackendEntry", "available_backends", "bind_backend", "bind_plugin"]

ENTRY_POINT_GROUP = "pie.backends"
_REQUIRED_HOOKS = (
    "pie_backend_info",
    "pie_backend_load_model",
    "pie_backend_capabilities",
    "pie_backend_forward",
    "pie_backend_copy_pages",
)


@dataclass(frozen=True, slots=True)
class BackendEntry:
    """An installed backend as found through its entry point."""

    name: str
    entry_point: EntryPoint

    @property
    def distribution(self) -> str:
        dist = self.entry_point.dist
        return f"{dist.name} {dist.version}" if dist is not None else "?"


def available_backends() -> dict[str, BackendEntry]:
    """Backends installed in this environment, by entry-point name."""
    return {ep.name: BackendEntry(ep.name, ep) for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _major(version: str) -> str:
    return str(version).split(".", 1)[0]


def bind_plugin(plugin: Any, name: str) -> pluggy.PluginManager:
    """Register a backend plugin object and validate it against the hook spec.

    Args:
        plugin: Object with ``PIE_CONTRACT_VERSION`` and ``@hookimpl`` methods.
        name: Name it is registered under (used in error messages).

    Returns:
        A PluginManager whose ``hook`` calls reach the backend.

    Raises:
        ContractError: The contract version differs in major number, a hook is missing, or a
            hookimpl's signature does not match its spec (the message names the hook).
    """
    version = getattr(plugin, "PIE_CONTRACT_VERSION", None)
    if version is None or _major(version) != _major(CONTRACT_VERSION):
        raise ContractError(
            f"backend {name!r} was written for contract version {version!r}; "
            f"this engine speaks {CONTRACT_VERSION} (major versions must match)"
        )
    pm = pluggy.PluginManager("pie")
    pm.add_hookspecs(BackendSpec)
    try:
        pm.register(plugin, name=name)
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise ContractError(f"backend {name!r} does not satisfy the hook spec: {exc}") from exc
    implemented = {hook.name for hook in pm.get_hookcallers(plugin) or ()}
    missing = [h for h in _REQUIRED_HOOKS if h not in implemented]
    if missing:
        raise ContractError(f"backend {name!r} does not implement {', '.join(missing)}")
    info: BackendInfo = pm.hook.pie_backend_info()
    if _major(info.contract_version) != _major(CONTRACT_VERSION):
        raise ContractError(
            f"backend {name!r} reports contract version {info.contract_version}; "
            f"this engine speaks {CONTRACT_VERSION}"
        )
    return pm


def bind_backend(name: str) -> pluggy.PluginManager:
    """Load the named backend through its entry point and bind it.

    Raises:
        NotFound: No backend of that name is installed (the message lists those that are).
        ContractError: See :func:`bind_plugin`.
    """
    backends = available_backends()
    if name not in backends:
        names = ", ".join(sorted(backends)) or "none"
        raise NotFound(f"unknown backend {name!r}; installed backends: {names}")
    factory = backends[name].entry_point.load()
    return bind_plugin(factory(), name)
