"""The suite's numerical oracle and its expected values import no backend's code: neither a
backend plugin nor ``pie_core.backend_kit`` (whose sampling and RoPE code the backends share)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import conformance

ROOT = Path(conformance.__file__).resolve().parent
INDEPENDENT = ["oracle.py", "reference.py", "ties.py", "models.py", "loaded.py", "tolerances.py",
               "cases/test_forward.py", "cases/test_probes.py", "cases/test_samplers.py", "cases/test_batching.py"]
FORBIDDEN = ("pie_backend_", "pie_core.backend_kit")


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


@pytest.mark.parametrize("module", INDEPENDENT)
def test_the_oracle_and_the_expected_values_import_no_backend_code(module):
    shared = [name for name in _imports(ROOT / module) if name.startswith(FORBIDDEN)]
    assert not shared, f"conformance/{module} imports {shared}: the oracle must not share a backend's code"
