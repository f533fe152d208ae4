"""The host contract: ``wit/`` (WIT package ``pie:inferlet``) spells exactly the host API the SDK
declares (:mod:`inferlet.host`), with the same names, parameters and types.

The declaration is the source of truth. When this test fails, change ``wit/`` to match
``inferlet/host/`` (``tests/contract/test_host_declarations.py`` holds ``pie_core/host`` to it).

The WIT is parsed by componentize-py (``componentize-py bindings``): its generated modules give
each interface's functions with their parameters and Python types, records as dataclasses,
enums as Enum classes and resources as classes. The generator erases part of the contract
(``json`` becomes ``str``, ``u32`` and ``s64`` become ``int``, ``borrow<x>`` and ``x`` the same
class, a result's error type moves into the docstring), so types are read from the text of the
one WIT declaration, and that reading is checked against the generated types.

Types are compared in a canonical WIT spelling without spaces, where ``int`` stands for any
integer type and ``float`` for ``f32``/``f64`` and ``bytes`` for ``list<u8>``. An integer's
width is held separately: a declared ``int`` is a ``u32``, and ``S32``, ``U64`` and ``S64``
(:mod:`inferlet.host.types`) say otherwise, because the SDK refuses what lies outside that
range before a call crosses (:mod:`inferlet.host.arguments`); the WIT must spell the same
width, or a value the SDK lets through could not be lowered.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import importlib
import inspect
import re
import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any, Callable

import pytest

from inferlet import host as declared
from inferlet.host.arguments import Kind, kind_of, plan
from inferlet.host.types import RECORDS, Context
from inferlet.host.wit import RESOURCES as _RESOURCES
from pie_core.runtime import host_api
from pie_core.runtime.wasm.build import WIT_DIR

FIX = "The host API is declared in inferlet/host/: change wit/ to spell it (and pie_core/host to implement it)."

RESOURCES = {cls.__name__: wit for cls, wit in _RESOURCES.items()}
"""The WIT resource of each declared handle kind, by class name."""


def declared_functions() -> dict[tuple[str, str], Callable[..., Any]]:
    """Every declared host function's stub (its signature and hints), by (interface, name)."""
    return {key: decl.stub for key, decl in declared.declarations().items()}


WIRE_FIELDS = {("SampleSpec", "logit_mask"): "option<bytes>", ("RequestOutput", "probes"): "list<probe-value>"}
"""Fields whose Python annotation is looser than what crosses: a packed vocabulary mask (a numpy
row inside the engine), and probe values, whose type depends on the probe's kind."""

POLL = {"wait": ([("calls", "list<int>"), ("timeout-ms", "option<int>")], "list<int>"),
        "cancel": ([("call", "int")], "_")}

_CLI = "import sys, componentize_py; sys.argv[0] = 'componentize-py'; componentize_py.script()"
_GENERATED = ("wit_world", "componentize_py_types", "componentize_py_async_support", "poll_loop")
_LISTS = (list, tuple, collections.abc.Sequence, collections.abc.Iterable, collections.abc.Collection)
_ERROR = "Err(wit_world.imports.types.Error)"


@dataclasses.dataclass(repr=False)
class Wit:
    """The parsed package: per interface its generated module and its comment-free WIT text."""

    modules: dict[str, types.ModuleType]
    text: dict[str, str]
    files: dict[str, str]  # interface -> the file declaring it
    world: types.ModuleType
    world_text: str


def load_wit(wit_dir: Path, out: Path) -> Wit:
    """Generate bindings for ``wit_dir`` into ``out`` and import them."""
    proc = subprocess.run([sys.executable, "-c", _CLI, "-d", str(wit_dir), "-w", "inferlet", "bindings", str(out)],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        detail = re.sub(r"(?s)^.*?AssertionError: ", "", proc.stderr.split("Stack backtrace")[0])
        raise AssertionError(f"componentize-py cannot parse {wit_dir}:\n{detail}")
    unload_bindings()
    sys.path.insert(0, str(out))
    try:
        world = importlib.import_module("wit_world")
        names = sorted(p.stem for p in (out / "wit_world" / "imports").glob("*.py") if p.stem != "__init__")
        modules = {n: importlib.import_module(f"wit_world.imports.{n.replace('-', '_')}") for n in names}
    finally:
        sys.path.remove(str(out))
    text, files, world_text = {}, {}, ""
    for path in sorted(wit_dir.glob("*.wit")):
        body = re.sub(r"//[^\n]*", "", path.read_text())
        for m in re.finditer(r"^\s*interface\s+([a-z][a-z0-9-]*)\s*\{(.*?)^\}", body, re.M | re.S):
            text[m[1]], files[m[1]] = m[2], path.name
        world_text += "".join(re.findall(r"^\s*world\s+inferlet\s*\{.*?^\}", body, re.M | re.S))
    return Wit({n.replace("_", "-"): m for n, m in modules.items()}, text, files, world, world_text)


def unload_bindings() -> None:
    for name in list(sys.modules):
        if name.split(".")[0] in _GENERATED:
            del sys.modules[name]


@pytest.fixture(scope="module")
def wit(tmp_path_factory: pytest.TempPathFactory) -> typing.Iterator[Wit]:
    yield load_wit(WIT_DIR, tmp_path_factory.mktemp("wit-bindings"))
    unload_bindings()


# --- names and types ---------------------------------------------------------------------


def kebab(name: str) -> str:
    """``commit_working_pages`` -> ``commit-working-pages``; ``OSError`` -> ``os-error``."""
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "-", name)
    return name.replace("_", "-").lower()


def _split(text: str) -> list[str]:
    """``text`` cut at the commas outside ``<>``."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += (c == "<") - (c == ">")
        if c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _canon_wit(t: str, aliases: dict[str, str]) -> str:
    """A type from the WIT text in the canonical spelling (``json`` kept, ``use`` renames undone)."""
    t = re.sub(r"\s+", "", t)
    t = re.sub(r"(?<![\w-])list<u8>", "bytes", t)
    t = re.sub(r"(?<![\w-])[us](?:8|16|32|64)(?![\w-])", "int", t)
    t = re.sub(r"(?<![\w-])f(?:32|64)(?![\w-])", "float", t)
    for local, name in aliases.items():
        t = re.sub(rf"(?<![\w-]){re.escape(local)}(?![\w-])", name, t)
    return t


def _erase(t: str) -> str:
    """A canonical WIT type as the generated bindings see it."""
    t = re.sub(r"borrow<([a-z0-9-]+)>", r"\1", t)
    return re.sub(r"(?<![\w-])json(?![\w-])", "string", t)


def _canon_binding(hint: Any) -> str:
    """A type hint of the generated bindings in the canonical spelling."""
    simple = {str: "string", int: "int", float: "float", bool: "bool", bytes: "bytes", type(None): "_", None: "_"}
    if hint in simple:
        return simple[hint]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list:
        return f"list<{_canon_binding(args[0])}>"
    if origin is tuple:
        return f"tuple<{','.join(_canon_binding(a) for a in args)}>"
    if origin is typing.Union and type(None) in args:
        return f"option<{_canon_binding(next(a for a in args if a is not type(None)))}>"
    if origin is typing.Union:  # a variant: a union of `Name_Case` dataclasses
        return kebab(args[0].__name__.split("_")[0])
    return kebab(hint.__name__)


def _handles() -> dict[type, str]:
    return dict(_RESOURCES)


def _canon_py(hint: Any, *, borrowed: bool) -> str:
    """A Python annotation of the host API in the canonical WIT spelling, under the mapping of
    ``wit/``: handles are ``borrow<x>`` as parameters and ``x`` as results; JSON-shaped values
    (``Any``, mappings, lists of ``Any``) are ``json``.

    Raises:
        TypeError: The annotation has no WIT mapping.
    """
    if hint is None or hint is type(None):
        return "_"
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            inner = _canon_py(rest[0], borrowed=borrowed)
        elif "json" in (kinds := {_canon_py(a, borrowed=borrowed) for a in rest}) and kinds <= {
                "json", "string", "bool", "int", "float"}:
            inner = "json"  # e.g. a schema as text, a dict or a bool: one JSON value
        else:
            raise TypeError(f"no WIT mapping for the union {hint!r}")
        return f"option<{inner}>" if len(rest) < len(args) else inner
    if origin is typing.Literal and all(isinstance(a, str) for a in args):
        return "string"
    simple = {str: "string", bool: "bool", int: "int", float: "float", bytes: "bytes"}
    if hint in simple:
        return simple[hint]
    for cls, resource in _handles().items():
        if isinstance(hint, type) and issubclass(hint, cls):
            return f"borrow<{resource}>" if borrowed else resource
    if hint in host_api.VALUE_TYPES and not issubclass(hint, BaseException):
        return kebab(hint.__name__)
    if hint in (Any, object, dict, collections.abc.Mapping) or origin in (dict, collections.abc.Mapping):
        return "json"
    if origin is tuple and args and args[-1] is not Ellipsis:
        return f"tuple<{','.join(_canon_py(a, borrowed=borrowed) for a in args)}>"
    if origin in _LISTS:
        item = args[0] if args else Any
        return "json" if item is Any else f"list<{_canon_py(item, borrowed=borrowed)}>"
    raise TypeError(f"no WIT mapping for {hint!r}")


def _host_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """``fn``'s annotations, resolved (names imported only under TYPE_CHECKING included)."""
    names = {cls.__name__: cls for cls in _RESOURCES}
    names.update((t.__name__, t) for t in host_api.VALUE_TYPES)
    return typing.get_type_hints(fn, localns=names)


# --- reading declarations ------------------------------------------------------------------


def _aliases(text: str) -> dict[str, str]:
    """Local names of ``use types.{x as y}`` -> the types' own names."""
    found = {}
    for items in re.findall(r"\buse\s+types\.\{(.*?)\}", text, re.S):
        for item in _split(items):
            name, _, local = item.partition(" as ")
            if local:
                found[local.strip()] = name.strip()
    return found


def func_decl(wit: Wit, iface: str, name: str) -> tuple[list[tuple[str, str]], str] | None:
    """Parameters (name, canonical type) and canonical result of WIT function ``name``."""
    text = wit.text.get(iface, "")
    m = re.search(rf"^\s*{re.escape(name)}\s*:\s*func\s*\((.*?)\)\s*(?:->\s*(.*?))?\s*;", text, re.M | re.S)
    if m is None:
        return None
    aliases = _aliases(text)
    params = [(p.partition(":")[0].strip(), _canon_wit(p.partition(":")[2], aliases)) for p in _split(m[1])]
    return params, _canon_wit(m[2] or "_", aliases)


def raw_types(wit: Wit, iface: str, name: str) -> list[str] | None:
    """The types of WIT function ``name``'s parameters, or of ``record name``'s fields (iface
    ``types``), as written (spaces removed, ``use`` renames undone, widths kept)."""
    text = wit.text.get(iface, "")
    m = (re.search(rf"\brecord\s+{re.escape(name)}\s*\{{(.*?)\}}", text, re.S) if iface == "types" else
         re.search(rf"^\s*{re.escape(name)}\s*:\s*func\s*\((.*?)\)", text, re.M | re.S))
    if m is None:
        return None
    aliases = _aliases(text)
    out = []
    for item in _split(re.sub(r"//[^\n]*", "", m[1])):
        t = re.sub(r"\s+", "", item.partition(":")[2])
        for local, real in aliases.items():
            t = re.sub(rf"(?<![\w-]){re.escape(local)}(?![\w-])", real, t)
        out.append(t)
    return out


def _widths_of_wit(t: str) -> list[str]:
    """The integer types in WIT type ``t``, in order (``list<u8>`` is bytes, not an integer)."""
    return re.findall(r"(?<![\w-])([us](?:8|16|32|64))(?![\w-])", re.sub(r"(?<![\w-])list<u8>", "bytes", t))


def _widths_of_kind(kind: Kind) -> list[str]:
    """The integer types the SDK's check of ``kind`` admits, in order (a record's own are its fields')."""
    if kind[0] == "int":
        return [kind[1].wit]
    if kind[0] in ("list", "opt"):
        return _widths_of_kind(kind[1])
    if kind[0] == "tuple":
        return [w for k in kind[1] for w in _widths_of_kind(k)]
    return []


def width_problems(wit: Wit) -> list[str]:
    """Integers whose WIT width is not the range the SDK checks them against."""
    problems = []
    for (iface, name), decl in sorted(declared.declarations().items()):
        checks, got = plan((iface, name), decl.stub), raw_types(wit, iface, kebab(name))
        for param, kind, t in zip(checks.names, checks.kinds, got or []):
            if _widths_of_kind(kind) != _widths_of_wit(t):
                problems.append(f"inferlet.host.{iface}.{name}: `{param}` is `{t}` in wit/ but the SDK checks it as "
                                f"{_widths_of_kind(kind) or 'no integer'}")
    for cls in RECORDS:
        got = raw_types(wit, "types", kebab(cls.__name__))
        for (field, kind), t in zip(kind_of(cls)[2], got or []):
            if _widths_of_kind(kind) != _widths_of_wit(t):
                problems.append(f"{cls.__name__}.{field} is `{t}` in wit/ but the SDK checks it as "
                                f"{_widths_of_kind(kind) or 'no integer'}")
    return problems


def record_decl(wit: Wit, name: str) -> list[tuple[str, str]] | None:
    """Fields (name, canonical type) of ``record name`` in ``types``."""
    m = re.search(rf"\brecord\s+{re.escape(name)}\s*\{{(.*?)\}}", wit.text.get("types", ""), re.S)
    if m is None:
        return None
    return [(f.partition(":")[0].strip(), _canon_wit(f.partition(":")[2], {})) for f in _split(m[1])]


def wit_functions(wit: Wit, iface: str) -> dict[str, Callable[..., Any]]:
    """The functions componentize-py generated for interface ``iface``, by WIT name."""
    mod = wit.modules[iface]
    return {kebab(n): f for n, f in inspect.getmembers(mod, inspect.isfunction) if f.__module__ == mod.__name__}


# --- the checks ----------------------------------------------------------------------------


def interface_problems(wit: Wit, iface: str, host: dict[str, Callable[..., Any]]) -> list[str]:
    """Declared functions of ``inferlet.host.<iface>`` without WIT functions, and the reverse."""
    expected = {kebab(n): n for n in host}
    expected.update({kebab(n) + "-result": n for n, fn in host.items() if inspect.iscoroutinefunction(fn)})
    declared = set(wit_functions(wit, iface)) if iface in wit.modules else set()
    problems = [f"inferlet.host.{iface}.{expected[w]} has no `{w}` in wit/{iface}.wit"
                for w in sorted(set(expected) - declared)]
    problems += [f"wit/{iface}.wit declares `{w}`, which inferlet.host.{iface} does not declare"
                 for w in sorted(declared - set(expected))]
    return problems


def function_problems(wit: Wit, iface: str, name: str, fn: Callable[..., Any]) -> list[str]:
    """What differs between declared host function ``inferlet.host.<iface>.<name>`` (``fn``) and
    its WIT spelling: names, order and types of parameters, and the result."""
    where = f"inferlet.host.{iface}.{name}"
    try:
        hints = _host_hints(fn)
        want = [(p, _canon_py(hints[p], borrowed=True)) for p in inspect.signature(fn).parameters]
        result = _canon_py(hints["return"], borrowed=False)
    except KeyError as exc:
        return [f"{where}: {exc} has no annotation; annotate every parameter and the result"]
    except (NameError, TypeError) as exc:
        return [f"{where}: {exc}"]
    calls = [(kebab(name), want, result)]
    if inspect.iscoroutinefunction(fn):  # split-phase: start it, then take its result
        calls = [(kebab(name), want, "int"), (kebab(name) + "-result", [("call", "int")], result)]
    problems = []
    for wname, params, ok in calls:
        decl, generated = func_decl(wit, iface, wname), wit_functions(wit, iface).get(wname)
        if decl is None or generated is None:
            problems.append(f"{where}: wit/{iface}.wit declares no `{wname}`")
            continue
        got, got_result = decl
        if [kebab(p) for p, _ in params] != [p for p, _ in got]:
            problems.append(f"{where}: `{wname}` takes ({', '.join(p for p, _ in got)}) in wit/ but "
                            f"({', '.join(kebab(p) for p, _ in params)}) in Python (names and order must match)")
        else:
            problems += [f"{where}: parameter `{p}` is `{g}` in wit/ but its annotation maps to `{w}`"
                         for (p, w), (_, g) in zip(params, got) if w != g]
        if got_result != f"result<{ok},error>":
            problems.append(f"{where}: `{wname}` returns `{got_result}` in wit/, expected `result<{ok},error>`")
        problems += _generated_problems(where, wname, generated, got, got_result)
    return problems


def _generated_problems(where: str, wname: str, generated: Callable[..., Any], got: list[tuple[str, str]],
                        got_result: str) -> list[str]:
    """The text reading of a declaration against componentize-py's (guards the regexes)."""
    hints = typing.get_type_hints(generated)
    parsed = [(kebab(p), _canon_binding(hints[p])) for p in inspect.signature(generated).parameters]
    ok = re.fullmatch(r"result<(.*),error>", got_result)
    problems = []
    if parsed != [(p, _erase(t)) for p, t in got]:
        problems.append(f"{where}: `{wname}`'s parameters read {got} from the text but {parsed} from componentize-py")
    if ok is None or _canon_binding(hints["return"]) != _erase(ok[1]) or _ERROR not in (generated.__doc__ or ""):
        problems.append(f"{where}: `{wname}`'s result reads `{got_result}` from the text but componentize-py says "
                        f"`{_canon_binding(hints['return'])}` raising {generated.__doc__!r}")
    return problems


def record_problems(wit: Wit, cls: type) -> list[str]:
    """What differs between a value dataclass and its WIT record (fields, order, types)."""
    name = kebab(cls.__name__)
    decl, generated = record_decl(wit, name), getattr(wit.modules["types"], cls.__name__, None)
    if decl is None or generated is None:
        return [f"{cls.__qualname__} has no `record {name}` in wit/types.wit"]
    hints = typing.get_type_hints(cls)
    try:
        want = [(kebab(f.name), WIRE_FIELDS.get((cls.__name__, f.name)) or _canon_py(hints[f.name], borrowed=False))
                for f in dataclasses.fields(cls)]
    except TypeError as exc:
        return [f"{cls.__qualname__}: {exc}"]
    problems = []
    if [f for f, _ in want] != [f for f, _ in decl]:
        problems.append(f"record {name} has fields ({', '.join(f for f, _ in decl)}) in wit/ but "
                        f"{cls.__qualname__} has ({', '.join(f for f, _ in want)}) (names and order must match)")
    else:
        problems += [f"record {name}: field `{f}` is `{g}` in wit/ but {cls.__qualname__}'s maps to `{w}`"
                     for (f, w), (_, g) in zip(want, decl) if w != g]
    fields = typing.get_type_hints(generated)
    parsed = [(kebab(f.name), _canon_binding(fields[f.name])) for f in dataclasses.fields(generated)]
    if parsed != [(f, _erase(t)) for f, t in decl]:
        problems.append(f"record {name} reads {decl} from the text but {parsed} from componentize-py")
    return problems


def enum_problems(wit: Wit, cls: type[enum.IntEnum]) -> list[str]:
    generated = getattr(wit.modules["types"], cls.__name__, None)
    want = [(m.name, m.value) for m in sorted(cls, key=lambda m: m.value)]
    if generated is None:
        return [f"{cls.__qualname__} has no `enum {kebab(cls.__name__)}` in wit/types.wit"]
    got = [(m.name, m.value) for m in generated]
    if got != want:
        return [f"enum {kebab(cls.__name__)} has cases {got} in wit/ but {cls.__qualname__} has {want} "
                "(same names, in value order)"]
    return []


def _assert_none(problems: list[str]) -> None:
    assert not problems, "\n".join(problems) + f"\n{FIX}"


# --- tests ---------------------------------------------------------------------------------


def test_world_imports_every_interface_and_exports_run(wit: Wit) -> None:
    interfaces = set(host_api.HOST_MODULES) | {"types", "poll"}
    declared = set(wit.modules)
    assert declared == interfaces, (f"world inferlet lacks interfaces {sorted(interfaces - declared)} and has "
                                    f"{sorted(declared - interfaces)} beyond host_api.HOST_MODULES, types and poll. "
                                    f"{FIX}")
    imports = set(re.findall(r"^\s*import\s+([a-z][a-z0-9-]*)\s*;", wit.world_text, re.M))
    assert imports == interfaces, f"world inferlet imports {sorted(imports)}, expected {sorted(interfaces)}. {FIX}"
    wrong_files = {i: f for i, f in wit.files.items() if f != f"{i}.wit"}
    assert not wrong_files, f"declare interface X in wit/X.wit: {wrong_files}"
    assert "exportrun:func(input:string)->result<string,string>;" in re.sub(r"\s+", "", wit.world_text), (
        "world inferlet must export run: func(input: string) -> result<string, string>")
    run = wit.world.WitWorld.run
    assert list(inspect.signature(run).parameters) == ["self", "input"]


@pytest.mark.parametrize("iface", host_api.HOST_MODULES)
def test_interface_declares_exactly_the_host_functions(wit: Wit, iface: str) -> None:
    host = {n: fn for (m, n), fn in declared_functions().items() if m == iface}
    _assert_none(interface_problems(wit, iface, host))


@pytest.mark.parametrize("iface", host_api.HOST_MODULES)
def test_signatures_match_the_host_functions(wit: Wit, iface: str) -> None:
    host = {n: fn for (m, n), fn in declared_functions().items() if m == iface}
    _assert_none([p for n, fn in sorted(host.items()) for p in function_problems(wit, iface, n, fn)])


def test_every_integer_crosses_with_the_width_the_sdk_checks(wit: Wit) -> None:
    _assert_none(width_problems(wit))


def test_a_differing_integer_width_is_reported(wit: Wit, monkeypatch: pytest.MonkeyPatch) -> None:
    text = dict(wit.text)
    text["context"] = text["context"].replace("truncate: func(ctx: borrow<context>, n: u32)",
                                              "truncate: func(ctx: borrow<context>, n: s64)")
    text["types"] = text["types"].replace("seed: u64", "seed: u32")
    monkeypatch.setattr(wit, "text", text)
    assert width_problems(wit) == [
        "inferlet.host.context.truncate: `n` is `s64` in wit/ but the SDK checks it as ['u32']",
        "SampleSpec.seed is `u32` in wit/ but the SDK checks it as ['u64']"]


def test_records_match_the_value_dataclasses(wit: Wit) -> None:
    records = [t for t in host_api.VALUE_TYPES if dataclasses.is_dataclass(t)]
    assert records, "host_api.VALUE_TYPES names no dataclass"
    fields = {(cls.__name__, f.name) for cls in records for f in dataclasses.fields(cls)}
    assert set(WIRE_FIELDS) <= fields, f"WIRE_FIELDS names fields that are gone: {set(WIRE_FIELDS) - fields}"
    _assert_none([p for cls in records for p in record_problems(wit, cls)])


def test_enums_match_the_value_int_enums(wit: Wit) -> None:
    enums = [t for t in host_api.VALUE_TYPES if isinstance(t, type) and issubclass(t, enum.IntEnum)]
    _assert_none([p for cls in enums for p in enum_problems(wit, cls)])


def test_probe_value_has_one_case_per_probe_kind(wit: Wit) -> None:
    probe_kind = next(t for t in host_api.VALUE_TYPES if t.__name__ == "ProbeKind")
    cases = [kebab(c.__name__.split("_", 1)[1]) for c in typing.get_args(wit.modules["types"].ProbeValue)]
    assert cases == [kebab(m.name) for m in probe_kind], f"variant probe-value has cases {cases}. {FIX}"


def test_every_handle_kind_is_a_resource(wit: Wit) -> None:
    mod = wit.modules["types"]
    resources = {kebab(n) for n, c in inspect.getmembers(mod, inspect.isclass)
                 if c.__module__ == mod.__name__ and "__exit__" in vars(c)}
    kinds = {kind.name for kind in host_api.HANDLES}
    assert kinds == set(RESOURCES), f"host_api.HANDLES has {sorted(kinds)}; the declaration names {sorted(RESOURCES)}"
    assert resources == set(RESOURCES.values()), (
        f"wit/types.wit declares resources {sorted(resources)}, expected one per handle kind. {FIX}")


def test_error_kinds_are_the_error_classes_a_host_call_raises(wit: Wit) -> None:
    mod = wit.modules["types"]
    got = {kebab(m.name) for m in mod.ErrorKind}
    want = {kebab(t.__name__) for t in host_api.VALUE_TYPES if issubclass(t, BaseException)}
    assert got == want, (f"enum error-kind lacks {sorted(want - got)} and has {sorted(got - want)} that name no error "
                         f"class of host_api.VALUE_TYPES. {FIX}")
    # McpError carries only its message, so error has no data field.
    fields = record_decl(wit, "error")
    assert fields == [("kind", "error-kind"), ("message", "string")], f"record error is {fields}. {FIX}"


def test_poll_waits_for_and_cancels_pending_calls(wit: Wit) -> None:
    assert set(wit_functions(wit, "poll")) == set(POLL)
    for name, decl in POLL.items():
        assert func_decl(wit, "poll", name) == decl, f"poll.{name} differs from {decl}. {FIX}"


def test_every_interface_and_function_is_documented(wit: Wit) -> None:
    bare = [i for i, mod in wit.modules.items() if not (mod.__doc__ or "").strip()]
    for iface, mod in wit.modules.items():
        for name, fn in wit_functions(wit, iface).items():
            if not re.sub(r"Raises:.*", "", fn.__doc__ or "", flags=re.S).strip():
                bare.append(f"{iface}.{name}")
    assert not bare, f"give these a /// comment in wit/: {bare}"


# --- the checks can fail -------------------------------------------------------------------


def _renamed_parameter(ctx: Context, count: int) -> None: ...


def _retyped_parameter(ctx: Context, k: str) -> None: ...


async def _made_async(ctx: Context, k: int) -> None: ...


def _own_not_borrowed(ctx: Context, k: int) -> Context: ...


def test_a_differing_host_function_is_reported(wit: Wit) -> None:
    stub = declared_functions()["context", "commit_working_pages"]
    assert function_problems(wit, "context", "commit_working_pages", stub) == []
    cases = {_renamed_parameter: "(ctx, count) in Python", _retyped_parameter: "`k` is `int` in wit/ but its "
             "annotation maps to `string`", _made_async: "no `commit-working-pages-result`",
             _own_not_borrowed: "expected `result<context,error>`"}
    for fake, message in cases.items():
        problems = function_problems(wit, "context", "commit_working_pages", fake)
        assert any(message in p for p in problems), f"{fake.__name__}: {problems}"


def test_a_missing_or_extra_function_is_reported(wit: Wit) -> None:
    host = {n: fn for (m, n), fn in declared_functions().items() if m == "context"}
    assert interface_problems(wit, "context", host) == []
    dropped = dict(host)
    del dropped["truncate"]
    assert interface_problems(wit, "context", dropped) == [
        "wit/context.wit declares `truncate`, which inferlet.host.context does not declare"]
    added = {**host, "rewind": _renamed_parameter}
    assert interface_problems(wit, "context", added) == [
        "inferlet.host.context.rewind has no `rewind` in wit/context.wit"]


def test_a_differing_record_is_reported(wit: Wit) -> None:
    real = next(t for t in host_api.VALUE_TYPES if t.__name__ == "SampleSpec")
    hints = typing.get_type_hints(real)
    fields = [(f.name, hints[f.name]) for f in dataclasses.fields(real)]
    assert record_problems(wit, dataclasses.make_dataclass("SampleSpec", fields)) == []
    renamed = dataclasses.make_dataclass("SampleSpec", [("n_draws" if n == "draws" else n, h) for n, h in fields])
    assert "(names and order must match)" in record_problems(wit, renamed)[0]
    retyped = dataclasses.make_dataclass("SampleSpec", [(n, str if n == "top_k" else h) for n, h in fields])
    assert record_problems(wit, retyped) == [
        "record sample-spec: field `top-k` is `int` in wit/ but SampleSpec's maps to `string`"]
