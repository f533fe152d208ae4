"""The host API is declared once, in the SDK (``inferlet/host/``); the engine implements exactly
it, and the SDK reaches the engine through nothing else.

- every declaration has an implementation ``pie_core.host.<interface>.<name>`` with the same
  parameters (names, order, defaults), plain positional-or-keyword ones, sync or async alike;
- no module of ``inferlet/`` imports ``pie_core``, and no module of ``pie_core`` imports a
  private module of the SDK (``inferlet._*``): the seam is the transport and the declarations.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any, Callable

import inferlet
import pie_core
from inferlet import host as declared
from inferlet.host.arguments import Kind, plan
from pie_core.runtime import host_api

SDK = Path(inferlet.__file__).resolve().parent
ENGINE = Path(pie_core.__file__).resolve().parent


def implementation_problems(key: tuple[str, str], stub: Callable[..., Any], fn: Callable[..., Any] | None) -> list[str]:
    """How engine function ``fn`` differs from declaration ``stub``."""
    where = f"pie_core.host.{key[0]}.{key[1]}"
    if fn is None:
        return [f"{where} is missing: inferlet.host.{key[0]} declares {key[1]}"]
    want = [(p.name, p.default) for p in inspect.signature(stub).parameters.values()]
    got = [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]
    problems = []
    if want != got:
        problems.append(f"{where} takes {got}; the declaration takes {want} (names, order and defaults)")
    odd = [p.name for p in inspect.signature(fn).parameters.values() if p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD]
    if odd:
        problems.append(f"{where}: {odd} must be positional-or-keyword (transports pass arguments in order)")
    if inspect.iscoroutinefunction(stub) != inspect.iscoroutinefunction(fn):
        problems.append(f"{where} is {'not ' if inspect.iscoroutinefunction(stub) else ''}a coroutine function, "
                        "unlike its declaration")
    return problems


def _engine(key: tuple[str, str]) -> Callable[..., Any] | None:
    import importlib

    return getattr(importlib.import_module(f"pie_core.host.{key[0]}"), key[1], None)


def test_the_engine_implements_every_declared_host_function_as_declared() -> None:
    problems = [p for key, decl in declared.declarations().items() for p in implementation_problems(key, decl.stub, _engine(key))]
    assert not problems, "\n".join(problems)
    assert set(host_api.host_functions()) == set(declared.declarations())


def test_a_differing_implementation_is_reported() -> None:
    stub = declared.declarations()["context", "truncate"].stub

    def renamed(ctx, count): ...

    async def made_async(ctx, n): ...

    def keyword_only(ctx, *, n): ...

    assert implementation_problems(("context", "truncate"), stub, _engine(("context", "truncate"))) == []
    assert "names, order and defaults" in implementation_problems(("context", "truncate"), stub, renamed)[0]
    assert "coroutine" in implementation_problems(("context", "truncate"), stub, made_async)[0]
    assert any("positional-or-keyword" in p for p in implementation_problems(("context", "truncate"), stub, keyword_only))
    assert "is missing" in implementation_problems(("context", "rewind"), stub, None)[0]


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found += [(node.lineno, node.module)] + [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found


def test_the_sdk_imports_nothing_of_the_engine() -> None:
    bad = [f"inferlet/{p.relative_to(SDK)}:{line} imports {m}" for p in sorted(SDK.rglob("*.py"))
           for line, m in _imports(p) if m == "pie_core" or m.startswith("pie_core.")]
    assert not bad, "the SDK reaches the engine only through its transport:\n" + "\n".join(bad)


def test_the_engine_imports_no_private_module_of_the_sdk() -> None:
    bad = [f"pie_core/{p.relative_to(ENGINE)}:{line} imports {m}" for p in sorted(ENGINE.rglob("*.py"))
           for line, m in _imports(p)
           if m.startswith("inferlet.") and any(part.startswith("_") for part in m.split(".")[1:])]
    assert not bad, "the engine uses the SDK's public seam (inferlet.host...):\n" + "\n".join(bad)


def _admitted(kind: Kind, i: int) -> Any:
    """A value of ``kind`` that its check lets through as it is (told apart by ``i``)."""
    tag = kind[0]
    if tag == "int":
        return kind[1].low + i + 1
    samples = {"float": i + 0.5, "str": f"arg{i}", "bool": True, "bytes": bytes([i])}
    if tag in samples:
        return samples[tag]
    if tag in ("list", "opt"):
        return [_admitted(kind[1], i)] if tag == "list" else _admitted(kind[1], i)
    if tag == "tuple":
        return tuple(_admitted(k, i) for k in kind[1])
    if tag == "enum":
        return next(iter(kind[1]))
    if tag == "record":
        return kind[1](**{field: _admitted(k, i) for field, k in kind[2]})
    return object()  # a handle (checked by the transport) or a JSON-shaped value


def test_every_declaration_is_documented_and_forwards_its_arguments_in_order() -> None:
    calls: list[tuple[tuple[str, str], tuple[Any, ...]]] = []

    class Recording:
        blocking = None

        def call(self, key, args):
            calls.append((key, args))

        async def call_async(self, key, args):
            calls.append((key, args))

        def tell(self, key, args):
            calls.append((key, args))

    from inferlet.host import transport

    previous = transport.install(Recording())
    try:
        for key, decl in declared.declarations().items():
            assert (decl.stub.__doc__ or "").strip(), f"inferlet.host.{key[0]}.{key[1]} needs a docstring"
            params = decl.parameters
            kinds = plan(key, decl.stub).kinds
            args = tuple(_admitted(kind, i) for i, kind in enumerate(kinds))  # distinct values, each admitted
            result = decl.function(*args)
            if decl.is_async:
                import asyncio

                asyncio.run(result)
            assert calls[-1][0] == key and calls[-1][1] == args, key
            required = [p for p in params if p.default is inspect.Parameter.empty]
            if len(required) < len(params):  # defaults are filled in: transports always get every argument
                decl.function(*args[: len(required)]) if not decl.is_async else asyncio.run(decl.function(*args[: len(required)]))
                assert calls[-1][1][len(required):] == tuple(p.default for p in params[len(required):]), key
    finally:
        if previous is None:
            transport.uninstall()
        else:
            transport.install(previous)
