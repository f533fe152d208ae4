"""The first use of the wasm sandbox builds its component (tens of seconds): ``pie serve`` and
``pie run --isolation wasm`` say so in one line on stderr before the build, and print nothing
once it is cached. The build and the compile are stubbed here: nothing is built."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from pie_core.cli.progress import wasm_build_notice
from pie_core.runtime.wasm import build
from pie_core.runtime.wasm import launcher as launcher_module
from pie_core.runtime.wasm.host import GuestResult
from pie_core.server import PieServer

NOTICE = "building the wasm sandbox (first use, ~30 s; cached in "


class _CompiledStub:
    """Stands in for :class:`WasmHost`: takes the component's path, runs nothing."""

    def __init__(self, component: Path) -> None:
        self.component = component

    def run(self, *args: Any, **kwargs: Any) -> GuestResult:
        return GuestResult(True, "ran in the stub sandbox")


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The components "built": an empty file and standard-library folder each, where a build puts them."""
    built: list[Path] = []

    def componentize(staged: Path, out: Path) -> None:
        build.stdlib_path(out).mkdir(parents=True)
        out.write_bytes(b"")
        built.append(out)

    monkeypatch.setattr(build, "_componentize", componentize)
    monkeypatch.setattr(launcher_module, "WasmHost", _CompiledStub)
    return built


@pytest.fixture
def serve_once(pie, tiny_model, monkeypatch: pytest.MonkeyPatch):
    """``pie serve --isolation wasm`` that stops as soon as it would wait for clients."""

    async def stop(self: PieServer) -> None:
        await self.close()

    monkeypatch.setattr(PieServer, "serve_until_signalled", stop)
    return lambda: pie("serve", "--dummy", "--no-auth", "--port", "0", "--isolation", "wasm", "--model", str(tiny_model))


def _notices(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith(NOTICE)]


def test_pie_serve_announces_the_first_build_once_and_the_cached_one_not_at_all(serve_once, builds):
    first = serve_once()
    assert first.code == 0, first.err
    assert len(builds) == 1 and _notices(first.err) == [f"{NOTICE}{builds[0].parent})..."]
    assert first.err.index(NOTICE) < first.err.index("pie serve on")  # before the server says it is ready
    again = serve_once()
    assert again.code == 0 and len(builds) == 1 and _notices(again.err) == []


def test_pie_run_isolation_wasm_announces_the_first_build_unless_quiet(pie, tiny_model, builds):
    quiet = pie("run", "hello-world", "--dummy", "--model", str(tiny_model), "--quiet", "--isolation", "wasm")
    assert quiet.code == 0 and quiet.err == "" and quiet.out.strip() == "ran in the stub sandbox"
    builds[0].unlink()  # uncached again
    build.stdlib_path(builds[0]).rmdir()
    loud = pie("run", "hello-world", "--dummy", "--model", str(tiny_model), "--isolation", "wasm")
    assert loud.code == 0 and len(_notices(loud.err)) == 1, loud.err
    cached = pie("run", "hello-world", "--dummy", "--model", str(tiny_model), "--isolation", "wasm")
    assert cached.code == 0 and _notices(cached.err) == [] and len(builds) == 2


def test_the_notice_names_the_cache_folder_under_home_with_a_tilde(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("PIE_CACHE_DIR", raising=False)
    out = io.StringIO()
    notice = wasm_build_notice(stream=out)
    assert notice is not None and wasm_build_notice(quiet=True) is None
    notice()
    assert out.getvalue() == f"{NOTICE}~/.cache/pie/wasm)...\n"
