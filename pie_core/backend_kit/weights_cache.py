"""Where a backend may keep what it derives from a model's weights (packed, quantised copies)."""

from __future__ import annotations

from pathlib import Path

from pie_core.models.weights_cache import cache_dir

__all__ = ["weights_cache_dir"]


def weights_cache_dir() -> Path:
    """The user's Pie cache folder: ``$PIE_CACHE_DIR``, else ``~/.cache/pie``.

    A backend keeps its files in a subfolder named after itself (``<cache>/torch/``), keyed by
    ``BackendOptions.weights_key``; the folder may not exist yet.

    Returns:
        The folder the engine's own weights cache lives under.
    """
    return cache_dir()
