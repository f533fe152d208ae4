"""The JS SDK's own tests (``sdk/javascript/test``: its event loop and UTF-8 decoder) under node,
bundled with the toolchain Pie installs in its cache; its host types are what ``wit/`` generates,
and its public declarations type-check the TypeScript examples."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from pie_core.bundled import wit_dir
from pie_core.models.weights_cache import cache_dir
from pie_core.runtime.wasm import js_build

pytestmark = pytest.mark.js_build

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TS_EXAMPLES = sorted(EXAMPLES.glob("*-ts/index.ts"))


def _tsc() -> Path:
    missing = js_build.js_toolchain_missing()
    if missing:
        pytest.skip(missing)
    return js_build._toolchain(cache_dir()) / "node_modules" / "typescript" / "bin" / "tsc"


def _files(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


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
    tsc = _tsc()
    done = subprocess.run(["node", str(tsc), "-p", str(js_build.SDK_DIR / "tsconfig.json")], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_the_host_types_are_what_wit_generates(tmp_path: Path) -> None:
    """``src/host`` is jco-transpile's output for ``wit/`` mapped to componentize-qjs's values,
    regenerated here with the pinned generator (``sdk/javascript/typegen``): a WIT change without
    regenerating fails."""
    missing = js_build.js_toolchain_missing()
    if missing:
        pytest.skip(missing)
    typegen = js_build.SDK_DIR / "typegen"
    tools = js_build._toolchain(cache_dir(), typegen)
    out = tmp_path / "host"
    done = subprocess.run(["node", str(typegen / "gen-host-types.mjs"), str(wit_dir()), str(out)], cwd=tools,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    generated, committed = _files(out), _files(js_build.SDK_DIR / "src" / "host")
    assert sorted(generated) == sorted(committed)
    stale = [name for name in generated if generated[name] != committed[name]]
    assert not stale, f"src/host is stale ({', '.join(stale)}): run sdk/javascript/typegen/gen-host-types.mjs"
    assert "export function forward(ctx: Context, tokens: number[]" in generated["interfaces/pie-inferlet-inference.d.ts"]


def test_the_ts_examples_type_check_against_the_sdks_public_declarations(tmp_path: Path) -> None:
    """What ``import ... from 'inferlet'`` gives an author: the SDK's declarations
    (``tsc --declaration --stripInternal``) and the generated host types, no SDK sources."""
    tsc = _tsc()
    pkg = tmp_path / "inferlet"
    shutil.copytree(js_build.SDK_DIR / "src", pkg / "src")
    (pkg / "tsconfig.json").write_text(json.dumps({
        "extends": str(js_build.SDK_DIR / "tsconfig.json"),
        "compilerOptions": {"noEmit": False, "declaration": True, "emitDeclarationOnly": True, "stripInternal": True,
                            "rootDir": "src", "outDir": "types", "paths": {}},
        "include": ["src/**/*.ts"]}))
    done = subprocess.run(["node", str(tsc), "-p", str(pkg / "tsconfig.json")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    for source in (pkg / "src").glob("*.ts"):
        source.unlink()  # only the declarations and src/host (the host types) are left
    assert TS_EXAMPLES
    (tmp_path / "tsconfig.json").write_text(json.dumps({
        "compilerOptions": {"target": "ES2022", "module": "ESNext", "moduleResolution": "Bundler", "strict": True,
                            "noEmit": True, "types": [], "lib": ["ES2022", "ESNext.Disposable", "ESNext.AsyncIterable"],
                            "paths": {"inferlet": [str(pkg / "types" / "index.d.ts")]}},
        "files": [str(p) for p in TS_EXAMPLES]}))
    done = subprocess.run(["node", str(tsc), "-p", str(tmp_path / "tsconfig.json")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    # and a misuse is a type error, not silently `any`
    bad = tmp_path / "bad.ts"
    bad.write_text("import { Model, Sampler } from 'inferlet';\n"
                   "export const s: Sampler = Sampler.topP('hot');\nModel.load(3);\n")
    config = json.loads((tmp_path / "tsconfig.json").read_text())
    config["files"] = [str(bad)]
    (tmp_path / "tsconfig.json").write_text(json.dumps(config))
    done = subprocess.run(["node", str(tsc), "-p", str(tmp_path / "tsconfig.json")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode != 0 and done.stdout.count("error TS2345") == 2, done.stdout[-2000:]
