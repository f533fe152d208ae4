"""A declared host function checks its arguments against its declaration before anything
crosses, the same way whatever the transport (:mod:`inferlet.host.arguments`), and the engine
runs the same check on what a sandboxed inferlet sends (``host_api.check_arguments``)."""

from __future__ import annotations

import asyncio
import enum
import inspect
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferlet.host import arguments, declarations, grammar, inference, messaging, scheduling, session, zo
from inferlet.host import context as host_context
from inferlet.host import transport
from inferlet.host.errors import InvalidInput
from inferlet.host.types import ChatBuilder, Context, GrammarSource, ProbeKind, ProbeSpec, SamplerKind, SampleSpec
from pie_core.engine.engine import Engine
from pie_core.grammar.source import regex
from pie_core.host import grammar as engine_grammar
from pie_core.host.binding import HostInstance, bind, unbind
from pie_core.host.context import HostContext
from pie_core.runtime import host_api

HANDLE = object()  # the transport's object for a handle: the SDK passes it on unlooked-at


class Recording:
    """A transport that records what reaches it."""

    blocking = None

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[str, str], tuple[Any, ...]]] = []

    def call(self, key, args):
        self.calls.append((key, args))

    async def call_async(self, key, args):
        self.calls.append((key, args))

    def tell(self, key, args):
        self.calls.append((key, args))


@pytest.fixture
def wire():
    recording = Recording()
    previous = transport.install(recording)
    yield recording
    transport.install(previous) if previous is not None else transport.uninstall()


def forward(*args, **options):
    return asyncio.run(inference.forward(*args, **options))


REFUSED = [
    (lambda: host_context.truncate(HANDLE, -1), "context.truncate(): n must be an int >= 0 and < 4294967296, got -1"),
    (lambda: host_context.truncate(HANDLE, 2**32),
     "context.truncate(): n must be an int >= 0 and < 4294967296, got 4294967296"),
    (lambda: host_context.truncate(HANDLE, True), "context.truncate(): n must be an int >= 0 and < 4294967296, got bool"),
    (lambda: host_context.truncate(HANDLE, 2.0), "context.truncate(): n must be an int >= 0 and < 4294967296, got float"),
    (lambda: forward(HANDLE, [1, -1]),
     "inference.forward(): tokens must be ints >= 0 and < 4294967296, got -1 at index 1"),
    (lambda: forward(HANDLE, [1, None]),
     "inference.forward(): tokens must be ints >= 0 and < 4294967296, got NoneType at index 1"),
    (lambda: forward(HANDLE, 5), "inference.forward(): tokens must be a list of ints >= 0 and < 4294967296, got int"),
    (lambda: forward(HANDLE, "abc"), "inference.forward(): tokens must be a list of ints >= 0 and < 4294967296, got str"),
    (lambda: forward(HANDLE, [1], positions=[-2]),
     "inference.forward(): positions must be ints >= 0 and < 4294967296, got -2 at index 0"),
    (lambda: forward(HANDLE, [1], attention_masks=[[1], [0, -5]]),
     "inference.forward(): attention_masks[1] must be ints >= 0 and < 4294967296, got -5 at index 1"),
    (lambda: forward(HANDLE, [1], samples=[SampleSpec(0), SampleSpec(-1)]),
     "inference.forward(): samples[1].index must be an int >= 0 and < 4294967296, got -1"),
    (lambda: forward(HANDLE, [1], samples=[SampleSpec(0, seed=2**64)]),
     "inference.forward(): samples[0].seed must be an int >= 0 and < 18446744073709551616, got 18446744073709551616"),
    (lambda: forward(HANDLE, [1], samples=[SampleSpec(0, temperature="hot")]),
     "inference.forward(): samples[0].temperature must be a float, got str"),
    (lambda: forward(HANDLE, [1], samples=[SampleSpec(0, logit_mask=[1, 2])]),
     "inference.forward(): samples[0].logit_mask must be bytes or None, got list"),
    (lambda: forward(HANDLE, [1], samples=[{"index": 0}]),
     "inference.forward(): samples[0] must be a SampleSpec, got dict"),
    (lambda: forward(HANDLE, [1], probes=[ProbeSpec(0, ProbeKind.LOGITS, masked_by=-2**31 - 1)]),
     "inference.forward(): probes[0].masked_by must be an int >= -2147483648 and < 2147483648, got -2147483649"),
    (lambda: forward(HANDLE, [1], probes=[ProbeSpec(0, ProbeKind.LOGPROBS, token_ids=(3, -3))]),
     "inference.forward(): probes[0].token_ids must be ints >= 0 and < 4294967296, got -3 at index 1"),
    (lambda: forward(HANDLE, [1], zo_seed=-2**63 - 1), "inference.forward(): zo_seed must be an int >= "
                                                       "-9223372036854775808 and < 9223372036854775808, got "
                                                       "-9223372036854775809"),
    (lambda: zo.update(HANDLE, [1.0], [2**63], 1.0),
     "zo.update(): seeds must be ints >= -9223372036854775808 and < 9223372036854775808, got 9223372036854775808 at "
     "index 0"),
    (lambda: zo.update(HANDLE, [1.0, "2"], [1], 1.0), "zo.update(): scores[1] must be a float, got str"),
    (lambda: messaging.broadcast("topic", 5), "messaging.broadcast(): message must be a str, got int"),
    (lambda: scheduling.set_bid(HANDLE, True), "scheduling.set_bid(): value must be a float, got True"),
    (lambda: scheduling.set_idle(HANDLE, 1), "scheduling.set_idle(): idle must be a bool, got int"),
    (lambda: scheduling.set_horizon(HANDLE, -4),
     "scheduling.set_horizon(): tokens must be an int >= 0 and < 4294967296 or None, got -4"),
    (lambda: grammar.matcher("m", GrammarSource("regex", 5)), "grammar.matcher(): source.text must be a str, got int"),
    (lambda: grammar.matcher("m", GrammarSource("regex", "a"), "1s"),
     "grammar.matcher(): timeout must be a float or None, got str"),
    (lambda: grammar.matcher_rollback(HANDLE, -1),
     "grammar.matcher_rollback(): n must be an int >= 0 and < 4294967296, got -1"),
    (lambda: session.send_file("text"), "session.send_file(): data must be bytes, got str"),  # one-way: refused too
]


@pytest.mark.parametrize("call, message", REFUSED)
def test_a_value_the_declaration_does_not_admit_is_refused_before_it_crosses(wire, call, message):
    with pytest.raises(InvalidInput) as info:
        call()
    assert str(info.value) == message
    assert wire.calls == []


def test_values_a_rule_converts_cross_converted(wire):
    class Seven(int):
        pass

    class Index:  # numpy's integers are not ints but have __index__
        def __index__(self) -> int:
            return 9

    scheduling.set_bid(HANDLE, 3)
    grammar.matcher("m", GrammarSource("regex", "a"), np.float32(0.5))
    session.send_file(bytearray(b"ab"))
    host_context.truncate(HANDLE, Seven(7))
    forward(HANDLE, (5, 6), positions=range(2), stop=np.array([4, Index()], dtype=object),
            samples=[SampleSpec(0, kind=2, temperature=1, top_p=1)])
    forward(HANDLE, np.array([1, 2], dtype=np.uint32), attention_masks=[(0, 1), [2]])
    got = {key: args for key, args in wire.calls}
    assert wire.calls[0][1][1] == 3.0 and type(wire.calls[0][1][1]) is float
    assert wire.calls[1][1][2] == 0.5 and type(wire.calls[1][1][2]) is float
    assert wire.calls[2][1] == (b"ab",) and type(wire.calls[2][1][0]) is bytes
    assert wire.calls[3][1] == (HANDLE, 7) and type(wire.calls[3][1][1]) is int
    first, second = wire.calls[4][1], wire.calls[5][1]
    assert first[1] == (5, 6) and first[2] == [0, 1] and first[11] == [4, 9]
    spec = first[5][0]
    assert spec == SampleSpec(0, kind=SamplerKind.TOP_P, temperature=1.0, top_p=1.0)
    assert type(spec.kind) is SamplerKind and type(spec.temperature) is float and type(spec.top_p) is float
    assert second[1] == [1, 2] and all(type(t) is int for t in second[1]) and second[3] == [(0, 1), [2]]
    assert set(got) == {("scheduling", "set_bid"), ("grammar", "matcher"), ("session", "send_file"),
                        ("context", "truncate"), ("inference", "forward")}


def test_values_that_are_fine_cross_as_they_are(wire):
    tokens, spec = [1, 2, 3], SampleSpec(0, temperature=0.5)
    forward(HANDLE, tokens, samples=[spec], zo_seed=-5)
    (_, args), = wire.calls
    assert args[1] is tokens and args[5][0] is spec and args[9] == -5


def test_a_handle_only_call_has_no_check_compiled_in():
    for key in [("inference", "forward_next"), ("context", "seq_len"), ("context", "release_soon")]:
        decl = declarations()[key]
        assert arguments.plan(key, decl.stub).fast is None
        assert "_convert" not in decl.function.__code__.co_names


# -- the fast test and the exact check agree -----------------------------------------------------

SCALARS = st.one_of(
    st.integers(min_value=-2**70, max_value=2**70), st.floats(allow_nan=False), st.booleans(), st.none(),
    st.text(max_size=3), st.binary(max_size=3), st.sampled_from(list(SamplerKind) + list(ProbeKind)))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner), max_leaves=8)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(sorted(declarations())), st.data())
def test_the_compiled_test_passes_exactly_what_the_check_keeps_as_it_is(key, data):
    decl = declarations()[key]
    checks = arguments.plan(key, decl.stub)
    args = tuple(data.draw(_value_for(kind)) for kind in checks.kinds)
    try:
        converted = checks.convert(args)
    except InvalidInput:
        converted = None
    kept = converted is not None and all(a is b for a, b in zip(args, converted))
    assert (checks.fast is None or checks.fast(*args)) == kept


def _value_for(kind: arguments.Kind) -> st.SearchStrategy[Any]:
    """Values around what ``kind`` admits: admitted ones, edges, and wrong types."""
    tag = kind[0]
    if tag == "int":
        r = kind[1]
        return st.one_of(st.integers(min_value=r.low, max_value=r.high - 1), st.sampled_from([r.low - 1, r.high]),
                         SCALARS)
    if tag == "list":
        return st.one_of(st.lists(_value_for(kind[1]), max_size=4), st.tuples(_value_for(kind[1])), VALUES)
    if tag == "opt":
        return st.one_of(st.none(), _value_for(kind[1]))
    if tag == "record":
        fields = {name: _value_for(k) for name, k in kind[2]}
        return st.one_of(st.builds(kind[1], **fields), VALUES)
    if tag == "enum":
        return st.one_of(st.sampled_from(list(kind[1])), st.integers(min_value=-1, max_value=9), VALUES)
    return VALUES


def test_every_kind_has_its_fast_test_and_its_message():
    kinds = {k[0] for decl in declarations().values() for k in arguments.plan(decl.key, decl.stub).kinds}
    assert kinds == {"int", "float", "bool", "str", "bytes", "list", "opt", "record", "handle", "any"}


def test_a_hint_with_no_wit_mapping_is_refused_where_it_is_declared():
    class Opaque:
        pass

    with pytest.raises(TypeError, match="no WIT mapping"):
        arguments.kind_of(Opaque, "x.y(): z")
    assert arguments.kind_of(enum.IntEnum("E", "A"))[0] == "enum"


def test_check_holds_each_handle_to_the_transports_class_of_its_kind():
    class Ctx:
        pass

    class Chat:
        pass

    handles = {Context: Ctx, ChatBuilder: Chat}
    save = declarations()[("context", "save")]
    ctx, chat = Ctx(), Chat()
    assert arguments.check(save, (ctx, "name", [1], chat), handles) == (ctx, "name", [1], chat)
    assert arguments.check(save, (ctx, "name", (), None), handles)[3] is None  # an optional handle
    with pytest.raises(TypeError, match=r"^context.save\(\): ctx cannot be a ChatBuilder handle$"):
        arguments.check(save, (chat, "name", [1], None), handles)
    with pytest.raises(TypeError, match=r"^context.save\(\): chat must be a ChatBuilder handle or None, got str$"):
        arguments.check(save, (ctx, "name", [1], "chat"), handles)
    with pytest.raises(TypeError, match=r"^context.save\(\): buffer cannot be a Context handle$"):
        arguments.check(save, (ctx, "name", ctx, None), handles)
    with pytest.raises(InvalidInput, match=r"^context.save\(\): buffer must be a list of ints"):
        arguments.check(save, (HANDLE, "name", HANDLE, None))  # no handles given: only the values


# -- the engine: the same check on what a sandboxed inferlet sends ------------------------------


@pytest.mark.parametrize("call, message", REFUSED)
def test_the_engine_refuses_what_the_sdk_refuses_with_the_same_message(wire, call, message):
    real = {kind.declared: kind.cls for kind in host_api.HANDLES}
    key, args = _sent_unchecked(call)
    decl = declarations()[key]
    args = list(args)
    for i, declared, _ in arguments.plan(key, decl.stub).handles:  # the engine's objects, as a runner lifts them
        if args[i] is HANDLE:
            args[i] = real[declared].__new__(real[declared])
    args = tuple(args)
    with pytest.raises(InvalidInput) as info:
        host_api.check_arguments(host_api.host_function(*key), f"{key[0]}.{key[1]}", args)
    assert str(info.value) == message


def test_the_engine_hands_the_call_the_converted_values():
    fn = host_api.host_function("scheduling", "set_bid")
    ctx = HostContext.__new__(HostContext)
    args = host_api.check_arguments(fn, "scheduling.set_bid", (ctx, 2))
    assert args == (ctx, 2.0) and type(args[1]) is float
    ok = (ctx, 2.5)
    assert host_api.check_arguments(fn, "scheduling.set_bid", ok) is ok


def test_a_matcher_refuses_to_roll_back_a_negative_count_in_the_engine():
    engine = Engine("dummy")
    model = engine.load(None)

    async def main() -> str:
        token = bind(HostInstance(engine=engine, emit=lambda event: None))
        try:
            handle = engine_grammar.matcher(model.name, regex("a+"))
            await engine_grammar.matcher_ready(handle)
            engine_grammar.matcher_accept(handle, [])
            engine_grammar.matcher_rollback(handle, 0)
            with pytest.raises(InvalidInput) as info:
                engine_grammar.matcher_rollback(handle, -1)
            return str(info.value)
        finally:
            unbind(token)

    try:
        assert asyncio.run(main()) == "a matcher rolls back a count of tokens >= 0, got -1"
    finally:
        asyncio.run(engine.close())


def _sent_unchecked(call) -> tuple[tuple[str, str], tuple[Any, ...]]:
    """The key and arguments ``call`` passes its declared function (the checks bypassed)."""
    seen: list[tuple[tuple[str, str], tuple[Any, ...]]] = []
    originals = {}
    for key, decl in declarations().items():
        module = __import__(f"inferlet.host.{key[0]}", fromlist=[key[1]])
        originals[module, key[1]] = getattr(module, key[1])

        def spy(*args, _key=key, _async=decl.is_async, _stub=decl.stub, **kwargs):
            bound = inspect.signature(_stub).bind(*args, **kwargs)
            bound.apply_defaults()
            seen.append((_key, tuple(bound.arguments.values())))
            if _async:
                async def nothing():
                    return None
                return nothing()
            return None

        setattr(module, key[1], spy)
    try:
        try:
            call()
        except Exception:  # noqa: BLE001 - the spy returns nothing a caller may expect
            pass
    finally:
        for (module, name), fn in originals.items():
            setattr(module, name, fn)
    assert seen, "the call reached no declared function"
    return seen[0]

