"""Finding inferlets by folder path or by name (the bundled examples)."""

from __future__ import annotations

from pathlib import Path

import pie_core
from pie_core.errors import NotFound

__all__ = ["example_dirs", "find_inferlet"]


def example_dirs() -> list[Path]:
    """Folders searched for example inferlets by name."""
    here = Path(pie_core.__file__).resolve().parents[1] / "examples"
    return [Path.cwd() / "examples", here]


def find_inferlet(target: str) -> Path:
    """Resolve a folder path or an example name to an inferlet folder.

    Raises:
        NotFound: Neither a folder with Pie.toml nor a known example (lists the examples).
    """
    path = Path(target)
    if (path / "Pie.toml").is_file():
        return path
    for root in example_dirs():
        if (root / target / "Pie.toml").is_file():
            return root / target
    names = sorted({p.parent.name for root in example_dirs() if root.is_dir() for p in root.glob("*/Pie.toml")})
    raise NotFound(f"{target!r} is not an inferlet folder or example; examples: {', '.join(names) or 'none'}")
