"""The engine options of ``pie run`` and ``pie serve``: ``--dtype``, ``--backend-option KEY=VALUE``,
``--kv-pages``, ``--host-pages`` and the ``[engine]`` keys of ``config.toml`` they override."""

from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Iterable

from tomlkit.toml_document import TOMLDocument

from pie_core import config
from pie_core.errors import InvalidInput
from pie_core.hookspec import BackendOptions

__all__ = [
    "EngineOptions",
    "add_backend_arguments",
    "engine_options",
    "parse_backend_options",
    "HOST_PAGES_BACKEND_DEFAULT",
]

HOST_PAGES_BACKEND_DEFAULT = -1
"""``engine.host_pages`` value that leaves the host pool at the backend's own size."""


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """What the flags and the configuration ask of the engine.

    ``host_pages`` is ``None`` for the backend's own host pool, else the pages the core may
    offload suspended contexts to (0: none; they are rebuilt by replaying their tokens).
    """

    backend: BackendOptions
    host_pages: int | None = None
    backend_name: str | None = None
    """The backend plugin: ``--backend``, else ``engine.default_backend``; ``None`` for ``auto``
    (the engine's :func:`~pie_core.engine.engine.default_backend_name`)."""
    replicas: int = 1
    """Replicas per model: ``--replicas`` (``pie serve``), else ``engine.replicas``."""
    ray: str | None = None
    """Replicas on Ray (``Engine(ray=...)``): ``--ray-address``, else ``""`` under ``--ray``
    (``RAY_ADDRESS``, else a local Ray), else ``engine.ray``; None keeps backends in-process."""

    def engine_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :class:`~pie_core.engine.engine.Engine` (``host_pages``,
        ``replicas`` and ``ray`` only when set)."""
        kwargs: dict[str, Any] = {"options": self.backend}
        if self.host_pages is not None:
            kwargs["host_pages"] = self.host_pages
        if self.replicas != 1:
            kwargs["replicas"] = self.replicas
        if self.ray is not None:
            kwargs["ray"] = self.ray
        return kwargs


def add_backend_arguments(p: argparse.ArgumentParser) -> None:
    """Add ``--device``, ``--dtype``, the repeatable ``--backend-option``, ``--kv-pages`` and ``--host-pages`` to a command."""
    p.add_argument("--device", default="cpu",
                   help="where the backend computes: cpu (default), cuda (with replicas: replica i on cuda:i, or "
                   "one GPU each under pie serve --ray), cuda:N")
    p.add_argument("--dtype", default="auto", help="weights and activations: auto (the backend's best), float32, bfloat16, float16")
    p.add_argument(
        "--backend-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a backend-specific option, e.g. quant=int8 or threads=2 for torch, step_ms=10 for the dummy "
        "(repeatable; true/false and integers are converted)",
    )
    p.add_argument("--kv-pages", metavar="N",
                   help="KV pages in the device pool, N >= 1 (default: engine.kv_pages, or as many as fit in engine.kv_memory)")
    p.add_argument("--host-pages", metavar="N",
                   help="host-memory pages suspended contexts are offloaded to; 0: none, they are replayed "
                   "(default: engine.host_pages, or the backend's)")


def engine_options(args: argparse.Namespace, doc: TOMLDocument | None = None) -> EngineOptions:
    """The options the flags ask for, with ``engine.default_backend``, ``engine.page_size``,
    ``engine.kv_memory``, ``engine.kv_pages``, ``engine.host_pages``, ``engine.replicas`` and ``engine.ray`` from the configuration
    where no flag is given (``--dummy`` picks the dummy backend whatever the configuration says).

    Args:
        args: Parsed flags of a command that called :func:`add_backend_arguments`.
        doc: The configuration (default: ``~/.pie/config.toml``, or the defaults when absent).

    Raises:
        InvalidInput: A ``--backend-option`` is not ``KEY=VALUE``, or a flag or key is out of
            range or not a number (the message names it).
        Unsupported: Replicas on Ray are asked for and Ray is not installed.
    """
    doc = doc if doc is not None else config.load_config()
    extra = parse_backend_options(args.backend_option)

    page_size = _config_int(doc, "engine.page_size", 1, "tokens per KV page")
    kv_memory = _config_bytes(doc, "engine.kv_memory")
    if args.kv_pages is not None:
        kv_pages = _flag_int("--kv-pages", args.kv_pages, 1, "the device pool's size in pages")
    else:
        kv_pages = _config_int(doc, "engine.kv_pages", 0, "pages in the device pool; 0 sizes it from engine.kv_memory")
    if args.host_pages is not None:
        host_pages: int | None = _flag_int("--host-pages", args.host_pages, 0, "host pages; 0 turns offload off")
    else:
        host_pages = _config_int(doc, "engine.host_pages", HOST_PAGES_BACKEND_DEFAULT,
                                 f"host pages; 0 turns offload off, {HOST_PAGES_BACKEND_DEFAULT} keeps the backend's")
        if host_pages == HOST_PAGES_BACKEND_DEFAULT:
            host_pages = None
    backend = BackendOptions(device=str(getattr(args, "device", "cpu")), dtype=args.dtype, extra=extra,
                             page_size=page_size, kv_pages=kv_pages, kv_memory_bytes=kv_memory)
    if host_pages:  # the backend's host_pages 0 means "its default", so 0 (no offload) stays with the core
        backend = dataclasses.replace(backend, host_pages=host_pages)
    if getattr(args, "replicas", None) is not None:
        replicas = _flag_int("--replicas", args.replicas, 1, "replicas per model")
    else:
        replicas = _config_int(doc, "engine.replicas", 1, "replicas per model (data parallel)")
    return EngineOptions(backend=backend, host_pages=host_pages, backend_name=_backend_name(args, doc), replicas=replicas,
                         ray=_ray(args, doc))


def _ray(args: argparse.Namespace, doc: TOMLDocument) -> str | None:
    """Where replicas run: ``--ray-address``, ``--ray``, else ``engine.ray`` ("off", "on", or an
    address). Checks that Ray is installed when it is asked for.

    Raises:
        InvalidInput: ``engine.ray`` is not a string.
        Unsupported: Ray is asked for and not installed.
    """
    address = getattr(args, "ray_address", None)
    if address is not None:
        chosen: str | None = str(address)
    elif getattr(args, "ray", False):
        chosen = ""
    else:
        value = config.get("engine.ray", doc)
        if not isinstance(value, str):
            raise InvalidInput(f"config engine.ray = {value!r}: expected 'off', 'on' or a Ray address; "
                               "fix it with 'pie config set engine.ray off'")
        chosen = None if value.strip().lower() in ("", "off") else "" if value.strip().lower() == "on" else value.strip()
    if chosen is not None:
        from pie_core.scaleout.ray_cluster import import_ray

        import_ray()  # a missing package stops us before anything loads
    return chosen


def _backend_name(args: argparse.Namespace, doc: TOMLDocument) -> str | None:
    if getattr(args, "dummy", False):
        return "dummy"
    if getattr(args, "backend", None):
        return str(args.backend)
    from pie_core.plugins import available_backends

    name = config.get("engine.default_backend", doc)
    installed = sorted(available_backends())
    if name == "auto":
        return None
    if not isinstance(name, str) or name not in installed:
        raise InvalidInput(f"config engine.default_backend = {name!r} is not an installed backend ({', '.join(installed)}); "
                           "fix it with 'pie config set engine.default_backend auto'")
    return name


def parse_backend_options(items: Iterable[str], flag: str = "--backend-option") -> dict[str, Any]:
    """``KEY=VALUE`` flags as ``BackendOptions.extra`` (true/false become bools, integers ints).

    Args:
        items: The flag's values, in order (a later key wins).
        flag: The flag's name, for the error message.

    Raises:
        InvalidInput: An item is not ``KEY=VALUE`` (the message names it).
    """
    extra: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InvalidInput(f"{flag} {item!r}: expected KEY=VALUE, e.g. quant=int8")
        extra[key.strip()] = _value(value.strip())
    return extra


def _flag_int(flag: str, text: str, minimum: int, meaning: str) -> int:
    if not re.fullmatch(r"\s*[0-9]+\s*", text) or int(text) < minimum:
        raise InvalidInput(f"{flag} {text!r}: expected a whole number >= {minimum} ({meaning})")
    return int(text)


def _config_int(doc: TOMLDocument, key: str, minimum: int, meaning: str) -> int:
    value = config.get(key, doc)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidInput(f"config {key} = {value!r}: expected a whole number >= {minimum} ({meaning}); "
                           f"fix it with 'pie config set {key} N'")
    return value


def _config_bytes(doc: TOMLDocument, key: str) -> int:
    value = config.get(key, doc)
    try:
        size = config.parse_bytes(value)
    except InvalidInput as exc:
        raise InvalidInput(f"config {key}: {exc}; fix it with 'pie config set {key} 2GiB'") from None
    if size < 1:
        raise InvalidInput(f"config {key} = {value!r}: the KV cache needs at least one byte; "
                           f"fix it with 'pie config set {key} 2GiB'")
    return size


def _value(text: str) -> Any:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return int(text)
    except ValueError:
        return text
