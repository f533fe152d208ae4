"""The standard library in the wasm sandbox: every module the guest is meant to have imports and
works, each it cannot have fails with a one-line reason, an inferlet's vendored package imports,
and the library's mount is read-only and the only host path besides the inferlet's own."""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import struct
import uuid
from pathlib import Path
from typing import Any

import pytest
from wasm_helpers import run_wasm, shared_launcher

from pie_core.errors import Unsupported
from pie_core.runtime.manifest import load_manifest
from pie_core.runtime.wasm import build
from pie_core.runtime.wasm.host import WasmHost

_GUEST = Path(build.__file__).resolve().parent / "guest" / "pie_guest"


def _guest_module(name: str) -> Any:
    """A stdlib-only module of the guest runtime, imported here to read its tables."""
    spec = importlib.util.spec_from_file_location(f"_guest_{name}", _GUEST / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


unavailable = _guest_module("unavailable")

STDLIB_TOUR = r'''
import importlib, os, sys

import vendored
from vendored.shapes import area


def attempt(fn):
    try:
        return ["ok", fn()]
    except BaseException as exc:
        return [type(exc).__name__, str(exc)]


def imports(unavailable):
    meant = sorted(set(sys.stdlib_module_names) - set(unavailable))
    missing = {}
    for name in meant:
        try:
            importlib.import_module(name)
        except BaseException as exc:
            missing[name] = f"{type(exc).__name__}: {exc}"
    refused = {}
    for name in unavailable:
        sys.modules.pop(name, None)
        refused[name] = attempt(lambda: importlib.import_module(name) and "imported")
    return {"meant": len(meant), "missing": missing, "refused": refused}


def works():
    import base64, csv, datetime, decimal, fractions, gzip, hashlib, hmac, io, json, pickle, sqlite3
    import statistics, struct, tomllib, uuid, zlib, zoneinfo
    import xml.etree.ElementTree as ET
    from email.message import EmailMessage
    from urllib.parse import urlsplit

    def sqlite():
        db = sqlite3.connect(":memory:")
        db.execute("create table t (x integer)")
        db.executemany("insert into t values (?)", [(1,), (2,), (3,)])
        return db.execute("select sum(x) from t").fetchone()[0]

    def csv_rows():
        out = io.StringIO()
        csv.writer(out).writerows([["a", "b,c"], ["1", "2"]])
        return list(csv.reader(io.StringIO(out.getvalue())))

    def email():
        msg = EmailMessage()
        msg["Subject"] = "pie"
        msg.set_content("hello")
        return msg["Subject"]

    blob = b"pie " * 1000
    return {
        "struct_f32": attempt(lambda: struct.unpack("<4f", struct.pack("<4f", 0.5, -1.25, 3.0, 1e-3)).__repr__()),
        "struct_native": attempt(lambda: struct.calcsize("=f") + struct.calcsize("P")),
        "sha256": attempt(lambda: hashlib.sha256(b"pie").hexdigest()),
        "hmac": attempt(lambda: hmac.new(b"key", b"pie", "sha256").hexdigest()),
        "datetime": attempt(lambda: (datetime.datetime(2024, 2, 28) + datetime.timedelta(days=2)).isoformat()),
        "decimal": attempt(lambda: str(decimal.Decimal("0.1") + decimal.Decimal("0.2"))),
        "fractions": attempt(lambda: str(fractions.Fraction(1, 3) + fractions.Fraction(1, 6))),
        "statistics": attempt(lambda: statistics.median([3, 1, 4, 1, 5])),
        "zlib": attempt(lambda: zlib.decompress(zlib.compress(blob)) == blob),
        "gzip": attempt(lambda: gzip.decompress(gzip.compress(blob)) == blob),
        "json": attempt(lambda: json.loads(json.dumps({"a": [1, 2.5, None]}))),
        "base64": attempt(lambda: base64.b64decode(base64.b64encode(b"\x00pie\xff")) == b"\x00pie\xff"),
        "uuid5": attempt(lambda: str(uuid.uuid5(uuid.NAMESPACE_DNS, "pie.example"))),
        "uuid4": attempt(lambda: uuid.uuid4().version),
        "pickle": attempt(lambda: pickle.loads(pickle.dumps({"k": (1, 2)})) == {"k": (1, 2)}),
        "csv": attempt(csv_rows),
        "sqlite3": attempt(sqlite),
        "xml": attempt(lambda: [e.text for e in ET.fromstring("<a><b>1</b><b>2</b></a>").iter("b")]),
        "tomllib": attempt(lambda: tomllib.loads('x = 1\n[t]\ny = "z"\n')),
        "email": attempt(email),
        "urllib": attempt(lambda: urlsplit("https://pie.example/a?b=1").netloc),
        "utc": attempt(lambda: datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc).isoformat()),
        "zoneinfo_imports": attempt(lambda: zoneinfo.ZoneInfo.__name__),
        "bytecode": attempt(lambda: os.path.isfile(sys.modules["decimal"].__cached__)),
    }


def sandbox():
    def create(path):
        with open(path, "x") as f:
            f.write("x = 1\n")

    return {
        "append_to_stdlib": attempt(lambda: open("/python/os.py", "a").close()),  # writes nothing if it opens
        "create_in_stdlib": attempt(lambda: create("/python/pie_write_probe.py")),
        "listdir_stdlib": attempt(lambda: "os.py" in os.listdir("/python")),
        "host_paths": [p for p in ("/", "/0", "/1", "/world", "/bundled", "/tmp", "/etc", "/root", "/home", "/usr")
                       if os.path.exists(p)],
    }


async def main(input):
    return {
        "imports": imports(input["unavailable"].split(",")),
        "works": works(),
        "sandbox": sandbox(),
        "vendored": [vendored.NAME, area(3, 4), attempt(lambda: __import__("pwd").getpwnam("me"))],
    }
'''

VENDORED_INIT = 'NAME = "vendored"\n'
VENDORED_SHAPES = "from fractions import Fraction\n\ndef area(w, h):\n    return str(Fraction(w * h, 2))\n"
PWD_SHIM = "def getpwnam(name):\n    return 'shim for ' + name\n"  # a module named as an unavailable one


@pytest.fixture(scope="module")
def tour(dummy_engine, tmp_path_factory) -> dict[str, Any]:
    """The value of one inferlet that imports the whole standard library and uses some of it."""
    folder = tmp_path_factory.mktemp("stdlib-tour")
    (folder / "Pie.toml").write_text('[package]\nname = "stdlib-tour"\nversion = "1.0.0"\ndescription = "stdlib"\n\n'
                                     '[parameters]\nunavailable = { type = "string" }\n')
    (folder / "main.py").write_text(STDLIB_TOUR)
    (folder / "vendored").mkdir()
    (folder / "vendored" / "__init__.py").write_text(VENDORED_INIT)
    (folder / "vendored" / "shapes.py").write_text(VENDORED_SHAPES)
    (folder / "pwd.py").write_text(PWD_SHIM)
    before = sorted(p.relative_to(folder) for p in folder.rglob("*"))
    final, _ = run_wasm(dummy_engine, load_manifest(folder), {"unavailable": ",".join(sorted(unavailable.UNAVAILABLE))},
                        scratch_root=tmp_path_factory.mktemp("scratch"))
    assert final.kind == "return", final
    assert sorted(p.relative_to(folder) for p in folder.rglob("*")) == before  # nothing written to its folder
    assert dummy_engine.pools_whole()
    return final.value


def test_every_standard_library_module_the_sandbox_is_meant_to_have_imports(tour) -> None:
    assert tour["imports"]["missing"] == {}
    assert tour["imports"]["meant"] > 200  # sys.stdlib_module_names less the unavailable ones


def test_each_unavailable_module_fails_with_one_line_that_names_it_and_says_why(tour) -> None:
    refused = tour["imports"]["refused"]
    expected = {name: ["ModuleNotFoundError", unavailable.message(name)] for name in unavailable.UNAVAILABLE
                if name != "pwd"}  # the inferlet vendors its own pwd.py: that one imports
    assert {n: r for n, r in refused.items() if n != "pwd"} == expected
    assert refused["pwd"] == ["ok", "imported"]
    assert all("\n" not in why for _, why in expected.values())
    assert unavailable.message("ssl") == ("ssl is not available in the Pie wasm sandbox (WASI has no TLS or sockets); "
                                          "run the inferlet with --isolation process if it needs it")


def test_the_standard_library_works_in_the_sandbox(tour) -> None:
    works = tour["works"]
    f32 = struct.unpack("<4f", struct.pack("<4f", 0.5, -1.25, 3.0, 1e-3))
    assert works == {
        "struct_f32": ["ok", repr(f32)],
        "struct_native": ["ok", 4 + 4],  # wasm32: 4-byte float, 4-byte pointers
        "sha256": ["ok", hashlib.sha256(b"pie").hexdigest()],
        "hmac": ["ok", __import__("hmac").new(b"key", b"pie", "sha256").hexdigest()],
        "datetime": ["ok", "2024-03-01T00:00:00"],
        "decimal": ["ok", "0.3"],
        "fractions": ["ok", "1/2"],
        "statistics": ["ok", 3],
        "zlib": ["ok", True],
        "gzip": ["ok", True],
        "json": ["ok", {"a": [1, 2.5, None]}],
        "base64": ["ok", True],
        "uuid5": ["ok", str(uuid.uuid5(uuid.NAMESPACE_DNS, "pie.example"))],
        "uuid4": ["ok", 4],
        "pickle": ["ok", True],
        "csv": ["ok", [["a", "b,c"], ["1", "2"]]],
        "sqlite3": ["ok", 6],
        "xml": ["ok", ["1", "2"]],
        "tomllib": ["ok", {"x": 1, "t": {"y": "z"}}],
        "email": ["ok", "pie"],
        "urllib": ["ok", "pie.example"],
        "utc": ["ok", "2024-01-01T00:00:00+00:00"],
        "zoneinfo_imports": ["ok", "ZoneInfo"],  # no tz database in the sandbox: only the module
        "bytecode": ["ok", True],  # imported from the exported .pyc, not compiled per instance
    }


def test_a_package_vendored_in_the_inferlets_folder_imports(tour) -> None:
    assert tour["vendored"] == ["vendored", "6", ["ok", "shim for me"]]


def test_the_standard_library_mount_is_read_only_and_no_other_host_path_is_seen(tour) -> None:
    sandbox = tour["sandbox"]
    probe = asyncio.run(shared_launcher().host()).stdlib / "pie_write_probe.py"
    created = probe.exists()
    probe.unlink(missing_ok=True)  # keep the shared cache clean if the mount was writable
    assert not created
    assert sandbox["append_to_stdlib"][0] == "PermissionError"
    assert sandbox["create_in_stdlib"][0] == "PermissionError"
    assert sandbox["listdir_stdlib"] == ["ok", True]
    assert sandbox["host_paths"] == []


def test_the_exported_standard_library_has_bytecode_and_leaves_out_what_cannot_run() -> None:
    stdlib = asyncio.run(shared_launcher().host()).stdlib
    sources = list(stdlib.rglob("*.py"))
    missing = [p for p in sources if not (p.parent / "__pycache__" / f"{p.stem}.cpython-314.pyc").is_file()]
    assert len(sources) > 400 and missing == [], missing[:5]  # compiled by the guest's CPython 3.14
    for name in ("ssl", "multiprocessing", "tkinter", "ctypes", "compression.zstd"):
        path = stdlib.joinpath(*name.split("."))
        assert not path.exists() and not path.with_suffix(".py").exists(), name


def test_a_cached_component_without_its_standard_library_is_built_again(tmp_path, monkeypatch) -> None:
    built: list[Path] = []

    def componentize(staged: Path, out: Path) -> None:
        built.append(out)
        build.stdlib_path(out).mkdir(parents=True)
        out.write_bytes(b"component")

    monkeypatch.setattr(build, "_componentize", componentize)
    first = build.component_path(tmp_path)
    assert built == [first] and build.stdlib_path(first).is_dir()
    assert build.component_path(tmp_path) == first and len(built) == 1  # cached: both are there
    build.stdlib_path(first).rmdir()
    assert build.component_path(tmp_path) == first and len(built) == 2  # the folder was missing: built anew


def test_the_host_refuses_a_component_without_its_standard_library(tmp_path) -> None:
    component = tmp_path / "0123.wasm"
    component.write_bytes(b"\0asm")
    with pytest.raises(Unsupported, match=r"0123\.stdlib is missing beside 0123\.wasm; delete .* to rebuild"):
        WasmHost(component)
