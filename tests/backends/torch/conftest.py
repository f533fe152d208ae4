"""Fixtures of the torch backend tests.

``TRITON_INTERPRET=1`` is set before anything imports Triton, so the Triton kernels run on CPU
tensors through Triton's interpreter (the CUDA path, checked without a GPU). The shared
``backend_testkit`` sits one folder up; the real-model fixtures (``default_gguf``, ``hf_model``)
are the ones of ``tests/integration/conftest.py``, re-exported here. Without the plugin
installed (``pip install -e plugins/pie_backend_torch``) the folder is not collected.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")

_TESTS = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(_TESTS / "backends"))

if importlib.util.find_spec("pie_backend_torch") is None:
    collect_ignore_glob = ["test_*.py"]


def _integration_fixtures():
    spec = importlib.util.spec_from_file_location("_pie_integration_fixtures", _TESTS / "integration" / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_integration = _integration_fixtures()
default_gguf = _integration.default_gguf
hf_model = _integration.hf_model
cpu_engine = _integration.cpu_engine


@pytest.fixture(scope="session")
def default_torch():
    """The torch backend on the default model with the options a user gets (``dtype`` auto: on a
    CPU with the backend's kernels, quant fit), driven through its hooks; loaded once a session."""
    from pie_backend_torch import TorchBackend
    from pie_core.hookspec import BackendOptions
    from pie_core.models.registry import resolve_model

    source = resolve_model(None)
    backend = TorchBackend()
    backend.pie_backend_load_model(
        source.spec,
        source.weights(),
        BackendOptions(page_size=16, kv_pages=256, host_pages=4, dtype="auto", weights_key=source.cache_key),
    )
    return source, backend
