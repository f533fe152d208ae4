"""Build a JavaScript or TypeScript inferlet into a component: esbuild, then componentize-qjs.

Unlike a Python inferlet (one component for all, :mod:`.build`), each JS inferlet is its own
component: QuickJS snapshots the bundle at build time (Wizer), so start-up parses nothing.

1. The toolchain (``js_toolchain/package.json`` + ``package-lock.json``: esbuild and
   componentize-qjs, pinned with their integrity hashes) is installed once with
   ``npm ci --ignore-scripts`` into ``<cache>/js-toolchain/<lock hash>/``, never into the repo
   or an inferlet's folder.
2. The inferlet's folder is hostile. Only its ``.ts/.js/.mjs/.mts/.json`` files are staged
   (no links, at most :data:`MAX_FILES` files and :data:`MAX_SOURCE_BYTES` bytes); its
   ``package.json`` may depend on ``inferlet`` only, which resolves to this engine's SDK
   (``sdk/javascript``); npm never runs on it, so none of its scripts run.
3. esbuild bundles ``__pie_entry.js`` (the ``run`` export calling the inferlet's ``main``
   through the SDK) for ES2016: TypeScript is stripped, ``using`` lowered, and async code lowered
   onto generators and the SDK's own ``Promise`` (``sdk/javascript/src/loop.ts`` says why).
4. componentize-qjs compiles the bundle against ``wit/`` (world ``inferlet``, the non-async
   runtime) under :data:`BUILD_TIMEOUT_S`.

The component is cached under ``<cache>/wasm/js-<key>.wasm``; the key hashes the staged
sources, the SDK, the WIT package, the toolchain lock and the layout, like Python's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from pie_core.bundled import js_sdk_dir, wit_dir
from pie_core.errors import InvalidInput, Unsupported

__all__ = ["is_js_entry", "js_component_path", "js_toolchain_missing", "stage_js", "SDK_DIR"]

_HERE = Path(__file__).resolve().parent
TOOLCHAIN = _HERE / "js_toolchain"
SDK_DIR = js_sdk_dir()
_LAYOUT = b"js-1"
JS_SUFFIXES = (".ts", ".js", ".mjs", ".mts")
_STAGED = JS_SUFFIXES + (".json",)
MAX_FILES = 512
MAX_SOURCE_BYTES = 4 * 2**20
MAX_COMPONENT_BYTES = 64 * 2**20
BUILD_TIMEOUT_S = 120.0
INSTALL_TIMEOUT_S = 300.0
_ALLOWED_DEPENDENCIES = {"inferlet"}
_lock = threading.Lock()


def is_js_entry(entry: str) -> bool:
    """Whether a manifest's entry is a JavaScript or TypeScript module."""
    return entry.endswith(JS_SUFFIXES)


def js_toolchain_missing() -> str | None:
    """Why JS inferlets cannot be built here (a one-line fix), or None when they can."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            return (f"JavaScript inferlets need Node.js 18+ with npm to build ({tool} is not on PATH): "
                    "install them, e.g. `apt install nodejs npm` or https://nodejs.org")
    if not (SDK_DIR / "src" / "index.ts").is_file():
        return f"the JavaScript SDK {SDK_DIR} is missing: reinstall pie-engine"
    return None


def stage_js(folder: Path, entry: str, dest: Path) -> None:
    """Copy the inferlet's sources into ``dest`` and write the entry glue.

    Raises:
        InvalidInput: A link, too many files or bytes, or a dependency other than ``inferlet``.
    """
    root = folder.resolve()
    files, total = 0, 0
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if "node_modules" in rel.parts or any(p.startswith(".") for p in rel.parts):
            continue
        if path.is_symlink():
            raise InvalidInput(f"{rel} is a symbolic link; a JS inferlet's folder holds plain files only")
        if not path.is_file() or not path.name.endswith(_STAGED):
            continue
        files += 1
        total += path.stat().st_size
        if files > MAX_FILES or total > MAX_SOURCE_BYTES:
            raise InvalidInput(f"the inferlet's sources pass {MAX_FILES} files or {MAX_SOURCE_BYTES} bytes; "
                               "a JS inferlet is bundled from its own sources only")
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest / rel)
    _check_package(dest / "package.json")
    target = "./" + entry
    (dest / "__pie_entry.js").write_text(
        "import { __run } from 'inferlet';\n"
        f"import * as inferlet from {json.dumps(target)};\n"
        "export function run(request) { return __run(inferlet.main, request); }\n")


def _check_package(path: Path) -> None:
    if not path.is_file():
        return
    try:
        data = json.loads(path.read_text("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInput(f"package.json is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidInput("package.json must be a JSON object")
    for field in ("dependencies", "devDependencies", "peerDependencies", "optionalDependencies", "bundledDependencies"):
        deps = data.get(field) or {}
        names = set(deps) if isinstance(deps, (dict, list)) else {str(deps)}
        refused = sorted(names - _ALLOWED_DEPENDENCIES)
        if refused:
            raise InvalidInput(f"package.json {field} lists {', '.join(refused[:5])}: a JS inferlet may depend only on "
                               "'inferlet' (Pie's SDK); the engine cannot vet other npm packages, so it does not "
                               "install them: copy the code you need into the inferlet's folder")


def js_component_path(folder: Path, entry: str, cache: Path, on_build: Callable[[], None] | None = None) -> Path:
    """The component of the JS inferlet at ``folder``, built now unless cached.

    Raises:
        Unsupported: node/npm are missing, or the toolchain install or the build failed.
        InvalidInput: The folder is refused (see :func:`stage_js`) or its code does not bundle.
    """
    missing = js_toolchain_missing()
    if missing:
        raise Unsupported(missing)
    with tempfile.TemporaryDirectory(prefix="pie-js-stage-") as tmp:
        staged = Path(tmp) / "app"
        staged.mkdir()
        stage_js(folder, entry, staged)
        key = _key(staged)
        out = cache / "wasm" / f"js-{key}.wasm"
        if out.is_file():
            return out
        with _lock:
            if not out.is_file():
                if on_build is not None:
                    on_build()
                tools = _toolchain(cache)
                _build(tools, staged, out)
    return out


def _hash_tree(digest: "hashlib._Hash", root: Path) -> None:
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "node_modules" not in p.parts):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")


def _key(staged: Path) -> str:
    digest = hashlib.sha256(_LAYOUT)
    for root in (staged, SDK_DIR / "src", wit_dir(), TOOLCHAIN):
        digest.update(b"\1" + str(root.name).encode())
        _hash_tree(digest, root)
    return digest.hexdigest()[:32]


def _toolchain(cache: Path, lock_dir: Path = TOOLCHAIN) -> Path:
    """The installed toolchain folder (``npm ci --ignore-scripts`` on first use).

    ``lock_dir`` holds the ``package.json`` and ``package-lock.json`` to install: the build's
    toolchain by default, or another pinned set (the SDK's type generator, in the tests).
    """
    lock = (lock_dir / "package-lock.json").read_bytes()
    dest = cache / "js-toolchain" / hashlib.sha256(lock).hexdigest()[:16]
    if (dest / "node_modules" / ".package-lock.json").exists():
        return dest
    part = dest.with_name(f"{dest.name}.{os.getpid()}.part")
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(parents=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copyfile(lock_dir / name, part / name)
    _run(["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"], part, INSTALL_TIMEOUT_S,
         f"npm ci (the JS tools pinned in {lock_dir.name})")
    try:
        part.rename(dest)
    except OSError:  # another process installed it first
        shutil.rmtree(part, ignore_errors=True)
    return dest


def _build(tools: Path, staged: Path, out: Path) -> None:
    bin_ = tools / "node_modules" / ".bin"
    bundle = staged.parent / "bundle.js"
    _run([str(bin_ / "esbuild"), str(staged / "__pie_entry.js"), "--bundle", "--format=esm", "--platform=neutral",
          "--target=es2016", "--external:pie:*", f"--alias:inferlet={SDK_DIR / 'src' / 'index.ts'}",
          "--main-fields=module,main", "--log-level=error", f"--outfile={bundle}"],
         staged, BUILD_TIMEOUT_S, "esbuild could not bundle the inferlet", invalid=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(f"{out.name}.{os.getpid()}.part")
    _run([str(bin_ / "componentize-qjs"), "--wit", str(wit_dir()), "--world", "inferlet", "--js", str(bundle),
          "--sync", "-o", str(part)], staged.parent, BUILD_TIMEOUT_S, "componentize-qjs could not build the component")
    if part.stat().st_size > MAX_COMPONENT_BYTES:
        part.unlink(missing_ok=True)
        raise InvalidInput(f"the built component passes {MAX_COMPONENT_BYTES} bytes")
    part.replace(out)


def _run(cmd: list[str], cwd: Path, timeout: float, what: str, invalid: bool = False) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("npm_")}
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise Unsupported(f"{what}: it ran past {timeout:g}s") from None
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-20:])
        raise (InvalidInput if invalid else Unsupported)(f"{what}:\n{tail}")
