"""The JS SDK's own tests (``sdk/javascript/test``: its event loop and UTF-8 decoder) under node,
bundled with the toolchain Pie installs in its cache; its host types are what ``wit/`` generates,
and its public declarations type-check the TypeScript examples and name everything the JS
reference lists."""

from __future__ import annotations

import json
import re
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


def _public_declarations(tsc: Path, tmp_path: Path) -> Path:
    """What ``import ... from 'inferlet'`` gives an author: the SDK's declarations
    (``tsc --declaration --stripInternal``) and the generated host types, no SDK sources; the
    path of its ``index.d.ts``."""
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
    return pkg / "types" / "index.d.ts"


def _type_check(tsc: Path, declarations: Path, files: list[Path]) -> subprocess.CompletedProcess[str]:
    """``tsc --noEmit --strict`` on ``files``, with ``inferlet`` resolving to ``declarations``."""
    config = files[0].parent / "tsconfig.check.json"
    config.write_text(json.dumps({
        "compilerOptions": {"target": "ES2022", "module": "ESNext", "moduleResolution": "Bundler", "strict": True,
                            "noEmit": True, "types": [], "lib": ["ES2022", "ESNext.Disposable", "ESNext.AsyncIterable"],
                            "paths": {"inferlet": [str(declarations)]}},
        "files": [str(p) for p in files]}))
    try:
        return subprocess.run(["node", str(tsc), "-p", str(config)], capture_output=True, text=True, timeout=300)
    finally:
        config.unlink()


def test_the_ts_examples_type_check_against_the_sdks_public_declarations(tmp_path: Path) -> None:
    tsc = _tsc()
    declarations = _public_declarations(tsc, tmp_path)
    assert TS_EXAMPLES
    done = _type_check(tsc, declarations, TS_EXAMPLES)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    # and a misuse is a type error, not silently `any`
    bad = tmp_path / "bad.ts"
    bad.write_text("import { Model, Sampler } from 'inferlet';\n"
                   "export const s: Sampler = Sampler.topP('hot');\nModel.load(3);\n")
    done = _type_check(tsc, declarations, [bad])
    assert done.returncode != 0 and done.stdout.count("error TS2345") == 2, done.stdout[-2000:]


REFERENCE = js_build.SDK_DIR / "reference.txt"  # Pie's JS reference (sdk-javascript-reference.txt), as given
# the reference's shorthand for an instance of each class
_INSTANCES = {"a": "Adapter", "ctx": "Context", "fwd": "Forward", "g": "Generator", "m": "Matcher", "out": "Output",
              "s": "McpSession", "step": "GenStep", "sub": "Subscription", "tk": "Tokenizer"}


def _reference_surface(text: str) -> str:
    """A TypeScript file that names every export, namespace member, static and instance member
    and generate option the reference lists: it type-checks only if the SDK has them all."""
    values, types = set(), {"GenerateOptions"}
    for kind, names in re.findall(r"import\s+(type\s+)?\{([^}]*)\}\s*from\s*'inferlet'", text):
        (types if kind else values).update(n.strip() for n in names.split(",") if n.strip())
    lines = [f"import {{ {', '.join(sorted(values))} }} from 'inferlet';",
             f"import type {{ {', '.join(sorted(types))} }} from 'inferlet';"]
    spaces = set(re.findall(r"\b(chat|reasoning|tools|runtime|scheduling|session|messaging|mcp)\.([A-Za-z]\w*)", text))
    spaces |= {("tools", "Decoder")}  # "all three [decoders] follow the same shape"
    lines += [f"void {ns}.{name};" for ns, name in sorted(spaces)]
    statics = set(re.findall(r"\b(Model|Context|Sampler|Adapter|Grammar|GrammarConstraint)\.([a-z]\w*)\(", text))
    lines += [f"void {cls}.{name};" for cls, name in sorted(statics)]
    members = set(re.findall(r"(?<![\w.])(" + "|".join(_INSTANCES) + r"|dec)\.([a-zA-Z]\w*)", text))
    for i, (var, name) in enumerate(sorted(members)):
        owners = ([_INSTANCES[var]] if var != "dec"
                  else [f"InstanceType<typeof {ns}.Decoder>" for ns in ("chat", "reasoning", "tools")])
        lines += [f"type _m{i}_{j} = {owner}['{name}'];" for j, owner in enumerate(owners)]
    options = text.split("GenerateOptions", 1)[1].split("speculator and systemSpeculation are mutually exclusive")[0]
    lines += [f"type _o{i} = GenerateOptions['{name}'];"
              for i, name in enumerate(re.findall(r"^(\w+) \| ", options, re.M))]
    assert len(lines) > 120, "the reference's surface was not found: has its layout changed?"
    return "\n".join(lines) + "\nexport {};\n"


def test_the_sdk_exports_every_name_the_js_reference_lists(tmp_path: Path) -> None:
    """Every name of the JS reference (exports, ``chat.``/``tools.``/... members,
    statics, instance members, GenerateOptions fields) exists in the SDK's public declarations."""
    text = REFERENCE.read_text()
    tsc = _tsc()
    surface = tmp_path / "surface.ts"
    surface.write_text(_reference_surface(text))
    done = _type_check(tsc, _public_declarations(tsc, tmp_path), [surface])
    missing = re.findall(r"error TS\d+: (.*)", done.stdout)
    assert done.returncode == 0 and not missing, "\n".join(missing[:40]) or done.stdout[-2000:]
