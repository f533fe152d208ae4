"""How many KV pages a backend allocates, from the engine's :class:`~pie_core.hookspec.BackendOptions`.

Every backend sizes its pools the same way, so the same flags give the same pool on every
backend that can hold it: the device pool has ``kv_pages`` pages when the engine names a count,
else as many as fit in ``kv_memory_bytes``; the host pool (offload) has ``host_pages`` pages, or
:data:`DEFAULT_HOST_PAGES`.
"""

from __future__ import annotations

from pie_core.hookspec import BackendOptions

__all__ = ["MAX_BUDGET_PAGES", "DEFAULT_HOST_PAGES", "device_pool_pages", "host_pool_pages"]

MAX_BUDGET_PAGES = 1 << 16
"""Cap on a device pool sized from ``kv_memory_bytes`` (tiny models would otherwise get millions
of pages, and the core keeps per-page bookkeeping)."""
DEFAULT_HOST_PAGES = 64
"""Host pool size when ``BackendOptions.host_pages`` is 0."""


def device_pool_pages(options: BackendOptions, page_bytes: int, max_pages: int = MAX_BUDGET_PAGES) -> int:
    """Pages of the device KV pool.

    Args:
        options: What the engine asked for: ``kv_pages`` (0: size from memory) and
            ``kv_memory_bytes``.
        page_bytes: Bytes one page takes on this backend (K and V of every layer, in its dtype).
        max_pages: Cap on a pool sized from ``kv_memory_bytes`` (a count in ``kv_pages`` is
            taken as given).

    Returns:
        ``options.kv_pages`` when it is not 0, else ``min(kv_memory_bytes // page_bytes,
        max_pages)``.

    Raises:
        ValueError: ``kv_pages`` is negative, ``page_bytes`` is not positive, or
            ``kv_memory_bytes`` holds no page (the message says how many bytes one page needs).
    """
    if options.kv_pages < 0:
        raise ValueError(f"kv_pages must be >= 0 (0 sizes the pool from kv_memory_bytes), got {options.kv_pages}")
    if options.kv_pages:
        return options.kv_pages
    if page_bytes < 1:
        raise ValueError(f"page_bytes must be >= 1, got {page_bytes}")
    pages = min(options.kv_memory_bytes // page_bytes, max_pages)
    if pages < 1:
        raise ValueError(f"kv_memory_bytes={options.kv_memory_bytes} holds no page of {page_bytes} bytes; raise it")
    return pages


def host_pool_pages(options: BackendOptions) -> int:
    """Pages of the host KV pool (where offloaded pages go).

    Args:
        options: What the engine asked for: ``host_pages`` (0: the default).

    Returns:
        ``options.host_pages``, or :data:`DEFAULT_HOST_PAGES` when it is 0.

    Raises:
        ValueError: ``host_pages`` is negative.
    """
    if options.host_pages < 0:
        raise ValueError(f"host_pages must be >= 0 (0 takes the default {DEFAULT_HOST_PAGES}), got {options.host_pages}")
    return options.host_pages or DEFAULT_HOST_PAGES
