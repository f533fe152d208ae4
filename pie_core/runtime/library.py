"""Finding inferlets by folder path or by name (the bundled examples)."""

from __future__ import annotations

from pathlib import Path

from pie_core.bundled import examples_dir
from pie_core.errors import NotFound
from pie_core.runtime.manifest import Manifest, load_manifest

__all__ = ["example_dirs", "find_inferlet", "find_program", "list_examples"]


def example_dirs() -> list[Path]:
    """Folders searched for example inferlets by name: ``./examples``, then the bundled ones."""
    return [Path.cwd() / "examples", examples_dir()]


def list_examples() -> list[Manifest]:
    """The manifest of every example reachable by name, sorted by name (the first folder of
    :func:`example_dirs` that has a name wins, as in :func:`find_inferlet`)."""
    found: dict[str, Manifest] = {}
    for root in example_dirs():
        for toml in sorted(root.glob("*/Pie.toml")) if root.is_dir() else ():
            if toml.parent.name not in found:
                found[toml.parent.name] = load_manifest(toml.parent)
    return [found[name] for name in sorted(found)]


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


def find_program(ref: str) -> Manifest:
    """The manifest of a folder or example named ``ref`` (``name`` or ``name@version``): how
    ``runtime.spawn`` resolves names under ``pie run``.

    Raises:
        NotFound: No such inferlet (lists the examples), or it is at another version.
    """
    base, _, version = ref.partition("@")
    manifest = load_manifest(find_inferlet(base))
    if version and version != manifest.version:
        raise NotFound(f"{base} is installed at version {manifest.version}, not {version}")
    return manifest
