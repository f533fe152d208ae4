"""Fixtures of the tensorrt backend tests (ONNX Runtime on the CPU provider).

The real-model fixtures (``default_gguf``, ``hf_model``) are the ones of
``tests/integration/conftest.py``, re-exported here. Without the plugin and ONNX Runtime
installed (``pip install -e './plugins/pie_backend_tensorrt[cpu]'``) the folder is not collected.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

_TESTS = Path(__file__).resolve().parents[2]

if importlib.util.find_spec("pie_backend_tensorrt") is None or importlib.util.find_spec("onnxruntime") is None:
    collect_ignore_glob = ["test_*.py"]
else:
    def _integration_fixtures():
        spec = importlib.util.spec_from_file_location("_pie_integration_fixtures", _TESTS / "integration" / "conftest.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    _integration = _integration_fixtures()
    default_gguf = _integration.default_gguf
    hf_model = _integration.hf_model
