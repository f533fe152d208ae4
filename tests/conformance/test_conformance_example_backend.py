"""The out-of-tree example backend installs into a fresh environment, is found by name through
its entry point, and passes the suite (its undeclared features reported as not supported)."""

from __future__ import annotations

import json
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from conformance_runs import run_suite

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "backends" / "pie_backend_example"


def _sh(cmd: list[str], cwd: Path) -> str:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def example_venv(tmp_path_factory) -> Path:
    """A new venv with the example installed in it (no network: --no-deps, no build isolation)."""
    root = tmp_path_factory.mktemp("example")
    source = root / "src"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    venv = root / "venv"
    _sh([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], root)
    python = venv / "bin" / "python"
    target = Path(_sh([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], root).strip())
    # Inside a venv, "system" site-packages means the base interpreter's; bridge to this one's
    # (numpy, pie-engine, pytest), running its .pth files (editable installs).
    bridge = "".join(f"import site; site.addsitedir({d!r})\n" for d in site.getsitepackages())
    (target / "_pie_parent_env.pth").write_text(bridge)
    _sh([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", str(source)], root)
    return python


def test_example_is_discovered_by_name_through_its_entry_point(example_venv, tmp_path):
    out = _sh([str(example_venv), "-c",
               "import json; from pie_core.plugins import available_backends, bind_backend\n"
               "b = available_backends()\n"
               "info = bind_backend('example').hook.pie_backend_info()\n"
               "print(json.dumps({'names': sorted(b), 'value': b['example'].entry_point.value,"
               " 'dist': b['example'].distribution, 'features': sorted(info.features)}))"], tmp_path)
    found = json.loads(out)
    assert "example" in found["names"]
    assert found["value"] == "pie_backend_example:ExampleBackend"
    assert found["dist"] == "pie-backend-example 0.1.0"
    assert found["features"] == ["logit_mask", "probes"]


def test_example_passes_the_suite(example_venv, tmp_path):
    run = run_suite(tmp_path, "example", python=str(example_venv))
    assert run.returncode == 0, run.output[-4000:]
    assert run.report["totals"]["failed"] == 0
    for surface in ("forward", "kv_paging", "samplers", "probes", "limits"):
        assert run.surface(surface)["passed"] > 0, surface
    masks = run.surface("attention_masks")
    assert masks["passed"] == 0 and masks["not_supported"] > 0
    reasons = {c["reason"] for c in run.report["cases"] if c["outcome"] == "not_supported"}
    assert any("'custom_mask'" in r for r in reasons) and any("'offload'" in r for r in reasons)
