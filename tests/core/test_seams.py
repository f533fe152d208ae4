"""The SDK talks to the engine only through pie_core.host; the core imports no backend."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _imports(folder: Path) -> list[tuple[str, str]]:
    found = []
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.append((path.name, node.module))
            elif isinstance(node, ast.Import):
                found += [(path.name, alias.name) for alias in node.names]
    return found


def test_sdk_reaches_the_engine_only_through_host():
    bad = [(f, m) for f, m in _imports(ROOT / "inferlet") if m.startswith("pie_core") and not m.startswith("pie_core.host")]
    assert bad == []


def test_core_imports_no_backend_and_no_torch():
    bad = [(f, m) for f, m in _imports(ROOT / "pie_core") if m.split(".")[0] in ("pie_backend_cpu", "torch", "triton")]
    assert bad == []
