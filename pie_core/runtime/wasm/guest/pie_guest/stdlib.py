"""The guest's standard library: exported once at build time, mounted read-only at run time.

componentize-py mounts its CPython standard library at ``/python`` only while it builds the
component; an instance starts from the snapshot with nothing mounted there. So at build time,
and only when the build asks (a marker file in the staged folder), :func:`export_if_asked`
copies ``/python`` into the staged folder with bytecode compiled by this very interpreter,
less the modules the sandbox cannot run (:mod:`pie_guest.unavailable`); the host mounts that
copy at ``/python``, read-only, for every instance, and :mod:`pie_guest.stdlib_finder` finds
its modules without listing folders. :func:`preload` imports the small modules most
inferlets use, so they are in the snapshot and cost nothing per instance.
"""

import compileall
import os
import py_compile
import shutil

from pie_guest import stdlib_finder
from pie_guest.unavailable import UNAVAILABLE

__all__ = ["EXPORT_MARKER", "EXPORT_DIR", "PRELOAD", "STDLIB", "export_if_asked", "preload"]

EXPORT_MARKER = ".pie-export-stdlib"
"""The file ``build.py`` writes into the staged folder to ask for the export (same name there)."""

EXPORT_DIR = "pie-stdlib"
"""The folder of the staged folder the export goes to; ``build.py`` moves it beside the component."""

STDLIB = "/python"
"""Where componentize-py mounts the standard library at build time (``sys.path[0]``), and where
the host mounts the export at run time."""

PRELOAD = ("struct", "base64", "hashlib", "hmac", "datetime", "random", "bisect", "uuid", "string", "copy")
"""Imported at build time, into the snapshot: what the SDK's handlers and most inferlets use
(measured: no change in the component's size or an instance's start; each costs 5-8 ms at its
first import in an instance otherwise)."""


def export_if_asked(staged: str) -> bool:
    """Copy the standard library into ``staged/EXPORT_DIR`` with bytecode, if the build asked,
    and find its modules from an index from now on.

    Returns:
        Whether it exported (the marker ``staged/EXPORT_MARKER`` was there).

    Raises:
        RuntimeError: A module of the export did not compile.
    """
    if not os.path.exists(os.path.join(staged, EXPORT_MARKER)):
        return False
    dest = os.path.join(staged, EXPORT_DIR)
    shutil.copytree(STDLIB, dest, ignore=_ignore)
    # Unchecked hashes: the mount is read-only and never changes, so no source is read to
    # validate its bytecode, and moving the folder (new mtimes) cannot invalidate it.
    if not compileall.compile_dir(dest, quiet=2, workers=1,
                                  invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH):
        raise RuntimeError(f"a module of the exported standard library {dest} did not compile")
    stdlib_finder.install(stdlib_finder.index(dest, STDLIB))
    return True


def preload() -> None:
    """Import :data:`PRELOAD` (at build time: each module is then in the snapshot)."""
    for name in PRELOAD:
        __import__(name)


def _ignore(folder: str, names: list[str]) -> set[str]:
    """What not to export: bytecode of the build's own imports, and the unavailable modules."""
    rel = os.path.relpath(folder, STDLIB)
    package = "" if rel == "." else rel.replace(os.sep, ".") + "."
    return {n for n in names if n == "__pycache__" or package + n.removesuffix(".py") in UNAVAILABLE}
