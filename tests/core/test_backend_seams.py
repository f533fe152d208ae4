"""A backend reaches the engine core only through its public face, ``pie_core.backend_kit``.

Every backend folder (``plugins/*/`` and ``examples/backends/*/``) is walked, so a backend that
lands later is held to the rule without editing this test. Every import counts: at the top,
inside functions, under ``if TYPE_CHECKING:``, and constant ``importlib.import_module(...)``
calls. The kit's submodules are private to it: ``from pie_core.backend_kit import lora`` is fine,
``from pie_core.backend_kit.lora import TARGETS`` is not.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BACKEND_ROOTS = ("plugins", "examples/backends")
KIT = "pie_core.backend_kit"
_SKIPPED_DIRS = {"build", "dist", "__pycache__"}


def _backend_folders(repo: Path = REPO) -> list[Path]:
    return sorted(p for root in BACKEND_ROOTS if (repo / root).is_dir() for p in (repo / root).iterdir()
                  if p.is_dir() and not p.name.startswith("."))


def _python_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py")
                  if not any(part in _SKIPPED_DIRS or part.startswith(".") or part.endswith(".egg-info")
                             for part in p.relative_to(folder).parts[:-1]))


def _is_import_call(node: ast.AST) -> bool:
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)):
        return False
    func = node.func
    return ((isinstance(func, ast.Attribute) and func.attr == "import_module")
            or (isinstance(func, ast.Name) and func.id in ("import_module", "__import__")))


def _core_imports(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` for every import of ``pie_core`` in ``source`` other than the kit itself."""
    bad: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            bad += [(node.lineno, f"import {a.name}") for a in node.names
                    if a.name.split(".")[0] == "pie_core" and a.name != KIT]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "pie_core" or node.module == KIT:
                continue
            names = [a.name for a in node.names]
            if node.module == "pie_core" and names == ["backend_kit"]:
                continue
            bad.append((node.lineno, f"from {node.module} import {', '.join(names)}"))
        elif _is_import_call(node):
            name = node.args[0].value  # type: ignore[attr-defined]
            if name.split(".")[0] == "pie_core" and name != KIT:
                bad.append((node.lineno, f"import_module({name!r})"))
    return sorted(bad)


def _violations(repo: Path = REPO) -> list[str]:
    bad: list[str] = []
    for folder in _backend_folders(repo):
        for path in _python_files(folder):
            rel = path.relative_to(repo).as_posix()
            bad += [f"{rel}:{line}: {what}" for line, what in _core_imports(path.read_text())]
    return bad


def test_backends_import_nothing_of_pie_core_but_the_backend_kit():
    bad = _violations()
    assert not bad, (f"a backend may import from pie_core only `{KIT}` (add what it needs to the kit's "
                     "__init__ instead):\n" + "\n".join(bad))


def test_every_backend_folder_is_walked():
    names = {p.name for p in _backend_folders()}
    assert {"pie_backend_cpu", "pie_backend_torch", "pie_backend_example"} <= names
    assert all(_python_files(folder) for folder in _backend_folders() if (folder / "pyproject.toml").exists())


def test_the_walk_sees_lazy_type_checking_and_submodule_imports():
    source = (
        "from typing import TYPE_CHECKING\n"
        "from pie_core.backend_kit import ForwardBatch, lora\n"
        "import pie_core.backend_kit\n"
        "from pie_core import backend_kit\n"
        "if TYPE_CHECKING:\n    from pie_core.hookspec import BatchOutput\n"
        "def f():\n    from pie_core.backend_kit.lora import TARGETS\n    import pie_core.sampling\n"
        "    from pie_core import lora\n    importlib.import_module('pie_core.models.spec')\n"
        "import pie_core\n"
    )
    assert [line for line, _ in _core_imports(source)] == [6, 8, 9, 10, 11, 12]
