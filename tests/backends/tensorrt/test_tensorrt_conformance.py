"""``pie conformance --backend tensorrt --backend-option provider=cpu``: the ONNX graph passes every
case the cpu backend passes, and reports adapters (which it does not offer) as not supported. The
float16 graph (what the GPU providers run by default) is checked the same way at float16's tolerance."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SURFACES = ("contract", "forward", "kv_paging", "batching", "chunked_prefill", "attention_masks", "logit_masks",
            "samplers", "probes", "copy_pages", "speculation", "limits")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_onnx_graph_on_the_cpu_provider_passes_the_conformance_suite(tmp_path, dtype):
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pie_core.cli.main", "conformance", "--backend", "tensorrt",
         "--backend-option", "provider=cpu", "--dtype", dtype, "--report", "json", str(report)],
        cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    data = json.loads(report.read_text())
    assert data["totals"]["failed"] == 0 and data["numerics"] == "on" and data["dtype"] == dtype
    for surface in SURFACES:
        assert data["surfaces"][surface]["passed"] > 0, f"{surface}: nothing ran on tensorrt"
    for case in data["cases"]:
        if case["outcome"] == "not_supported":
            assert "adapters" in case["reason"] or "'zo'" in case["reason"] or "max_mask_bytes" in case["reason"], case
    assert data["surfaces"]["adapters"]["passed"] == 0
