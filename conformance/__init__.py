"""Pie's backend conformance suite: golden batch -> output checks through the hook spec alone.

A backend author runs it against an installed plugin::

    pie conformance --backend NAME [--device D] [--report json PATH]
    pytest --pyargs conformance --pie-backend NAME [--pie-device D] [--pie-report PATH]

Cases are grouped by surface (:data:`SURFACES`); the capabilities a backend declares decide
which run, and a case that does not run is reported as "not supported", never as passed.
Numeric cases compare against the suite's own float64 oracle (:mod:`conformance.oracle`, which
shares no code with any backend) on tiny random models of every supported architecture, within
the tolerances declared per dtype (:data:`TOLERANCES`). See ``docs/backend-authors.md``.

The names below are imported on first use, so that loading the pytest plugin
(``conformance.plugin``, active in every pytest run) costs nothing.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "SURFACES",
    "TOLERANCES",
    "KNOWN_FEATURES",
    "Tolerance",
    "Harness",
    "SuiteOptions",
    "SuiteReport",
    "run_suite",
    "tiny_spec",
    "random_weights",
]

_HOMES = {
    "SURFACES": "conformance.report",
    "SuiteReport": "conformance.report",
    "TOLERANCES": "conformance.tolerances",
    "Tolerance": "conformance.tolerances",
    "KNOWN_FEATURES": "conformance.harness",
    "Harness": "conformance.harness",
    "SuiteOptions": "conformance.harness",
    "run_suite": "conformance.runner",
    "tiny_spec": "conformance.models",
    "random_weights": "conformance.models",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'conformance' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
