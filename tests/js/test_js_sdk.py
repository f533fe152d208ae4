"""The JS SDK's own tests (``sdk/javascript/test``: its event loop and UTF-8 decoder) under node,
bundled with the toolchain Pie installs in its cache."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pie_core.models.weights_cache import cache_dir
from pie_core.runtime.wasm import js_build

pytestmark = pytest.mark.js_build


def test_the_sdk_tests_pass_under_node() -> None:
    missing = js_build.js_toolchain_missing()
    if missing:
        pytest.skip(missing)
    tools = js_build._toolchain(cache_dir())
    esbuild = tools / "node_modules" / "esbuild" / "lib" / "main.js"
    runner = js_build.SDK_DIR / "test" / "run.mjs"
    done = subprocess.run(["node", str(runner), str(esbuild)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "# fail 0" in done.stdout


def test_the_sdk_and_the_ts_examples_type_check_strictly() -> None:
    missing = js_build.js_toolchain_missing()
    if missing:
        pytest.skip(missing)
    tsc = js_build._toolchain(cache_dir()) / "node_modules" / "typescript" / "bin" / "tsc"
    done = subprocess.run(["node", str(tsc), "-p", str(js_build.SDK_DIR / "tsconfig.json")], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
