"""The packages of ``pie_core`` form layers, and an import only ever points down:

    server, cli          (pie serve, pie run)
    runtime              (the runners: in-process, process, wasm; manifests)
    host                 (the host API an inferlet calls)
    engine, kv, scheduler
    backend              (the worker: the one caller of a loaded backend's hooks)
    backend_kit          (what a backend imports: the contract and the pieces backends share)

Every ``import`` in a file counts: at the top, inside functions, under ``if TYPE_CHECKING:``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pie_core

ROOT = Path(pie_core.__file__).resolve().parent

RULES: dict[str, tuple[str, ...]] = {
    "host": ("pie_core.runtime", "pie_core.server", "pie_core.cli"),
    "engine": ("pie_core.host", "pie_core.runtime", "pie_core.server", "pie_core.cli"),
    "kv": ("pie_core.host", "pie_core.runtime", "pie_core.server", "pie_core.cli"),
    "scheduler": ("pie_core.host", "pie_core.runtime", "pie_core.server", "pie_core.cli"),
    "runtime": ("pie_core.server", "pie_core.cli"),
    "backend": ("pie_core.engine", "pie_core.kv", "pie_core.scheduler", "pie_core.host", "pie_core.runtime",
                "pie_core.server", "pie_core.cli"),
    "backend_kit": ("pie_core.engine", "pie_core.kv", "pie_core.scheduler", "pie_core.host", "pie_core.runtime",
                    "pie_core.server", "pie_core.cli", "pie_core.plugins"),
}

KIT_MAY_IMPORT = ("pie_core.backend_kit", "pie_core.hookspec", "pie_core.values", "pie_core.errors",
                  "pie_core.models.spec", "pie_core.models.weights_cache")
"""The backend kit sits at the bottom: besides itself, only the contract and what it is made of."""


def _module_of(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(source: str, package: str) -> list[tuple[int, str]]:
    """``(line, module)`` for every module ``source`` (a file of ``package``) imports, relative
    imports made absolute. ``from a import b`` yields ``a.b`` too (``b`` may be a submodule),
    and a constant ``importlib.import_module("...")`` counts as an import."""
    tree = ast.parse(source)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names if alias.name != "*"]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__")))):
            found.append((node.lineno, node.args[0].value))
    return found


def _breaks(module: str, forbidden: tuple[str, ...]) -> bool:
    return any(module == f or module.startswith(f + ".") for f in forbidden)


def _violations() -> list[str]:
    """Every upward import as ``file:line imports module``."""
    bad: list[str] = []
    for layer, forbidden in RULES.items():
        for path in sorted((ROOT / layer).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            package = _module_of(path) if path.name == "__init__.py" else _module_of(path).rpartition(".")[0]
            found = [(line, module) for line, module in _imports(path.read_text(), package) if _breaks(module, forbidden)]
            for line, module in found:
                if any(n == line and module.startswith(m + ".") for n, m in found):
                    continue  # ``from a import b`` where ``a`` itself is reported
                bad.append(f"pie_core/{rel}:{line} imports {module} (pie_core/{layer}/ may not import "
                           f"{', '.join(forbidden)})")
    return sorted(set(bad))


def test_every_import_in_pie_core_points_down_the_layers():
    bad = _violations()
    assert not bad, "imports that point up the layers (move the shared piece down instead):\n" + "\n".join(bad)


def _kit_may_import(module: str) -> bool:
    # ``pie_core`` and ``pie_core.models`` appear for ``from pie_core(.models) import x``; x is judged itself
    return (not module.startswith("pie_core.") or module == "pie_core.models"
            or _breaks(module, KIT_MAY_IMPORT))


def test_the_backend_kit_imports_only_the_contract_and_itself():
    bad = []
    for path in sorted((ROOT / "backend_kit").rglob("*.py")):
        package = _module_of(path) if path.name == "__init__.py" else _module_of(path).rpartition(".")[0]
        bad += [f"pie_core/backend_kit/{path.name}:{line} imports {module}"
                for line, module in _imports(path.read_text(), package) if not _kit_may_import(module)]
    assert not bad, f"the backend kit may import only {', '.join(KIT_MAY_IMPORT)}:\n" + "\n".join(bad)


def test_every_layer_named_in_the_rules_exists():
    assert [layer for layer in RULES if not (ROOT / layer).is_dir()] == []


def test_the_import_walk_sees_imports_inside_functions_and_type_checking_blocks():
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pie_core.runtime import manifest\n"
              "def f():\n    from ..server import app\n    import pie_core.cli.main\n"
              "    importlib.import_module('pie_core.runtime.instance')\n")
    modules = {m for _, m in _imports(source, "pie_core.host")}
    assert {"pie_core.runtime.manifest", "pie_core.server.app", "pie_core.cli.main", "pie_core.runtime.instance"} <= modules
