"""Find standard-library modules from an index made at build time, not by listing folders.

Listing a folder is slow in the guest (WASI's ``readdir`` hashes the metadata of every entry:
about 4 ms for ``/python`` alone), and ``FileFinder`` lists each folder again in every new
instance because its mtime differs from the build's. The standard library under ``/python``
is read-only and known at build time, so :func:`install` puts a finder that answers from the
index in ``sys.path_importer_cache`` for ``/python`` and each of its package folders: the
import system still walks ``sys.path`` in order (an inferlet's own module still shadows the
standard library's), it just never lists these folders.
"""

import os
import sys
from importlib.util import spec_from_file_location

__all__ = ["IndexedFinder", "index", "install"]


class IndexedFinder:
    """A path entry finder for one folder whose modules are known: ``names`` maps each module
    or package of ``folder`` to whether it is a package."""

    def __init__(self, folder: str, names: dict[str, bool]) -> None:
        self.folder = folder
        self.names = names

    def find_spec(self, fullname: str, target: object = None) -> object:
        tail = fullname.rpartition(".")[2]
        package = self.names.get(tail)
        if package is None:
            return None
        path = f"{self.folder}/{tail}"
        if package:
            return spec_from_file_location(fullname, f"{path}/__init__.py", submodule_search_locations=[path])
        return spec_from_file_location(fullname, f"{path}.py")

    def invalidate_caches(self) -> None:
        """Nothing to forget: the folder is read-only."""

    def iter_modules(self, prefix: str = "") -> object:
        """``(prefix + name, is_package)`` for each module, as ``pkgutil.iter_modules`` wants."""
        for name in sorted(self.names):
            yield prefix + name, self.names[name]

    def __repr__(self) -> str:
        return f"IndexedFinder({self.folder!r}, {len(self.names)} modules)"


def index(root: str, mount: str) -> dict[str, dict[str, bool]]:
    """The modules of the tree at ``root``, by folder as the guest sees it under ``mount``."""
    found: dict[str, dict[str, bool]] = {}
    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        guest = mount if rel == "." else f"{mount}/{rel}"
        # Any name, as FileFinder (sysconfig imports "_sysconfigdata__wasi_wasm32-wasi").
        names = {f[:-3]: False for f in files if f.endswith(".py") and f != "__init__.py"}
        for d in dirs:
            if os.path.isfile(os.path.join(folder, d, "__init__.py")):
                names[d] = True  # a package wins over a module of the same name, as with FileFinder
        if rel == "." or os.path.isfile(os.path.join(folder, "__init__.py")):
            found[guest] = names
        dirs[:] = [d for d in dirs if d != "__pycache__"]
    return found


def install(folders: dict[str, dict[str, bool]]) -> None:
    """Answer imports from each folder of :func:`index` without listing it."""
    for folder, names in folders.items():
        sys.path_importer_cache[folder] = IndexedFinder(folder, names)
