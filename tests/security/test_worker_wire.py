"""Class 3: the worker pipe does not trust the worker.

Frames are msgpack with an explicit schema (no pickle): hostile bytes are refused in time linear
in their size, an undeclared call is refused, and either kills only the offending worker (its
pages back) while alice keeps being served. Every value type that must cross round-trips.
"""

from __future__ import annotations

import asyncio

import msgpack
import numpy as np
import pytest
from hostile import TOKENS, victim_is_served, write_program

from pie_core.client import connect
from pie_core.errors import InvalidInput
from pie_core.grammar.source import GrammarSource
from pie_core.hookspec import ProbeKind, SamplerKind
from pie_core.mcp.errors import McpError
from pie_core.models.chat_formats.tool_calls import ToolCallSyntax
from pie_core.runtime import host_api
from pie_core.runtime.process.wire import DTYPES, HEADER, MAX_CONTAINERS, MAX_DEPTH, MAX_FRAME, Codec, ProtocolError
from pie_core.scheduler.request import ProbeSpec, RequestOutput, SampleSpec


class _Handle:
    pass


def _codec() -> tuple[Codec, dict[int, object]]:
    objs: dict[int, object] = {}

    def to_ref(obj: object) -> tuple[int, str] | None:
        if isinstance(obj, _Handle):
            objs[id(obj)] = obj
            return id(obj), "Context"
        return None

    def from_ref(rid: int, kind: str) -> object:
        if rid not in objs:
            raise ProtocolError(f"unknown handle {rid}")
        return objs[rid]

    return Codec(to_ref, from_ref), objs


def _round_trip(value: object) -> object:
    codec, _ = _codec()
    frame = codec.encode(value)
    assert HEADER.unpack(frame[:HEADER.size])[0] == len(frame) - HEADER.size
    return codec.decode(frame[HEADER.size:])


def test_numpy_arrays_of_every_allowed_dtype_round_trip_with_shape_and_bytes():
    for dtype in DTYPES:
        for shape in [(0,), (5,), (2, 3), ()]:
            arr = (np.arange(int(np.prod(shape)) or 0) % 2).astype(dtype).reshape(shape)
            back = _round_trip({"a": arr})["a"]
            assert isinstance(back, np.ndarray) and back.dtype == dtype and back.shape == shape
            assert np.array_equal(back, arr) and back.flags.writeable
    big_endian = np.arange(4, dtype=">i4")
    assert np.array_equal(_round_trip(big_endian), big_endian)
    scalar = _round_trip(np.float32(1.5))
    assert isinstance(scalar, np.float32) and scalar == 1.5
    with pytest.raises(TypeError, match="dtype object cannot cross"):
        _round_trip(np.array([object()], dtype=object))


def test_pie_value_types_errors_tuples_and_handles_round_trip():
    handle = _Handle()
    mask = np.packbits(np.ones(16, bool))
    values = [
        SampleSpec(index=3, kind=SamplerKind.TOP_P if hasattr(SamplerKind, "TOP_P") else SamplerKind.ARGMAX,
                   temperature=0.5, logit_mask=mask),
        ProbeSpec(index=1, kind=ProbeKind.DISTRIBUTION, k=4, token_ids=(1, 2)),
        RequestOutput(tokens=((1, 2), (3,)), probes=(((1, 2), (0.5, 0.25)), np.zeros(3, np.float32))),
        GrammarSource("regex", "[a-z]+", True),
        ToolCallSyntax("qwen", "<tool_call>", "</tool_call>", "arguments"),
        (1, ("nested", (2.5, None)), [b"bytes", True]),
        {"handle": handle, 7: "int key", "list": [handle]},
    ]
    back = _round_trip(values)
    for want, got in zip(values[:5], back[:5]):
        assert type(got) is type(want)
    assert back[0].index == 3 and np.array_equal(back[0].logit_mask, mask)
    assert back[1] == values[1] and back[3] == values[3] and back[4] == values[4]
    assert back[2].tokens == ((1, 2), (3,)) and back[2].probes[0] == ((1, 2), (0.5, 0.25))
    assert back[5] == values[5] and type(back[5][1]) is tuple and type(back[5][2]) is list
    assert back[6]["handle"] is handle and back[6]["list"][0] is handle and back[6][7] == "int key"
    for kind in (*SamplerKind, *ProbeKind):
        assert _round_trip(kind) is kind
    for error in [InvalidInput("bad token 9"), McpError("server x failed"), KeyError("k"), PermissionError("no")]:
        got = _round_trip(error)
        assert type(got) is type(error) and got.args == error.args
    odd = _round_trip(UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"))
    assert type(odd) is ValueError and "UnicodeDecodeError" in str(odd)  # its nearest declared base


def test_every_value_type_is_a_frozen_dataclass_enum_or_error_and_handles_are_opaque():
    import dataclasses
    import enum

    for cls in host_api.VALUE_TYPES:
        assert issubclass(cls, (enum.Enum, BaseException)) or dataclasses.is_dataclass(cls) and \
            cls.__dataclass_params__.frozen, cls
    assert [f.name for f in dataclasses.fields(host_api.HandleKind)] == ["name", "cls", "declared"]  # no members to call
    taken = set()
    for fn in host_api.host_functions().values():  # every annotation resolves: handle arguments are checked by it
        taken.update(t for t in host_api.parameter_types(fn).values() if isinstance(t, type))
    assert {kind.cls for kind in host_api.HANDLES if kind.name != "LoadedModel"} <= taken


def test_a_handle_is_refused_where_the_host_function_declares_another_class():
    from pie_core.host import context, model
    from pie_core.host.grammar import MatcherHandle

    ctx, matcher = context.HostContext.__new__(context.HostContext), MatcherHandle.__new__(MatcherHandle)
    with pytest.raises(TypeError, match="b cannot be a Context handle"):
        host_api.check_arguments(model.chat_copy, "model.chat_copy", (ctx,))
    with pytest.raises(TypeError, match="ctx cannot be a Matcher handle"):
        host_api.check_arguments(context.release, "context.release", (matcher,))
    with pytest.raises(TypeError, match="tokens cannot be a Context handle"):
        host_api.check_arguments(model.detokenize, "model.detokenize", ("m", ctx))
    host_api.check_arguments(context.release, "context.release", (ctx,))


@pytest.mark.parametrize("payload, why", [
    (b"\xdd\xff\xff\xff\xff" + b"\x00" * 16, "declares 4 billion items"),
    (b"\xdf\xff\xff\xff\xff" + b"\x00" * 16, "declares 4 billion pairs"),
    (b"\xdb\xff\xff\xff\xff" + b"a" * 16, "declares a 4 GiB string"),
    (b"\xc9\xff\xff\xff\xff\x01" + b"\x00" * 16, "declares a 4 GiB ext"),
    (b"\x91" * (MAX_DEPTH + 1) + b"\xc0", "nests past the depth limit"),
    (b"\x91" * 5000 + b"\xc0", "nests past msgpack's stack"),
    (msgpack.packb(msgpack.ExtType(42, b"x")), "unknown ext type"),
    (msgpack.packb(msgpack.ExtType(1, b"\x03\x01" + (10).to_bytes(8, "little") + b"\x00" * 8)), "byte count mismatch"),
    (msgpack.packb(msgpack.ExtType(1, b"\x63\x00")), "dtype code outside the allow-list"),
    (msgpack.packb(msgpack.ExtType(4, b"Popen")), "a class outside the value table"),
    (msgpack.packb([1, msgpack.ExtType(3, b"")]), "a tag in the middle of a list"),
    (msgpack.packb([msgpack.ExtType(4, b"SampleSpec"), {"__class__": 1}]), "a field the dataclass lacks"),
    (msgpack.packb(msgpack.ExtType(5, (99).to_bytes(8, "little") + b"Context")), "a handle never given"),
    (b"\xc1", "a reserved byte"),
])
def test_hostile_payloads_are_refused(payload, why):
    # how fast: benchmarks/wire_decode.py
    codec, _ = _codec()
    with pytest.raises(ProtocolError):
        codec.decode(payload)


def test_wide_frames_and_huge_containers_decode_whole():
    # cost per byte: benchmarks/wire_decode.py
    codec, _ = _codec()
    wide = msgpack.packb([[i, "ab", [None]] for i in range(MAX_CONTAINERS // 2 - 1)])  # every container allowed
    decoded = codec.decode(wide)
    assert len(decoded) == MAX_CONTAINERS // 2 - 1 and decoded[-1] == [MAX_CONTAINERS // 2 - 2, "ab", [None]]
    long_row = msgpack.packb(list(range(1_000_000)))  # items are cheap: one container
    assert len(codec.decode(long_row)) == 1_000_000
    n = MAX_CONTAINERS - 1  # empty lists in one
    many = b"\xdc" + n.to_bytes(2, "big") + b"\x90" * n
    assert len(codec.decode(many)) == n


def test_a_value_sharing_one_list_many_times_is_refused_at_the_container_bound():
    value: list = [1]
    for _ in range(17):  # 2**17 lists once encoded, from 18 in memory
        value = [value, value]
    codec, _ = _codec()
    with pytest.raises(ProtocolError, match=f"at most {MAX_CONTAINERS} containers"):
        codec.decode(codec.encode(value)[HEADER.size:])


def test_a_self_referencing_value_cannot_be_encoded():
    codec, _ = _codec()
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="nests deeper"):
        codec.encode(loop)
    with pytest.raises(ValueError, match="at most"):
        codec.encode(b"x" * (MAX_FRAME + 1))


ATTACK = '''
import asyncio, gc, os, struct
import msgpack
from inferlet import Context, Model, Sampler, runtime, session

def link():
    return next(o for o in gc.get_objects() if type(o).__name__ == "_Link")

async def main(input: dict):
    mode = input["mode"]
    model = Model.load(runtime.models()[0])
    with Context(model) as ctx:
        ctx.user("hold pages while attacking")
        await ctx.generate(Sampler.argmax(), max_tokens=2, stop=[]).collect_tokens()
        session.send("holding")
        l = link()
        raw = {
            "bomb": b"\\xdd\\xff\\xff\\xff\\xff" + b"\\x00" * 8,
            "deep": b"\\x91" * 1000 + b"\\xc0",
            "ext": msgpack.packb(msgpack.ExtType(42, b"pickle?")),
        }
        if mode in raw:
            os.write(l._w, struct.pack("!I", len(raw[mode])) + raw[mode])
        elif mode == "oversize":
            os.write(l._w, struct.pack("!I", 2**31) + b"x" * 1024)
        elif mode == "private":
            l.send(["call", 999, "context", "_fork_kv", [ctx._ctx]])
        elif mode == "outside":
            l.send(["call", 999, "binding", "current", []])
        elif mode == "engine-attr":
            l.send(["get", 999, ctx._ctx, "owner"])
        elif mode == "method":
            l.send(["method", 999, ctx._ctx, "release", [], {}])
        elif mode == "dunder":
            l.send(["method", 999, ctx._ctx, "__reduce_ex__", [2], {}])
        elif mode == "copy":
            l.send(["copy", 999, ctx._ctx])
        elif mode == "started-twice":
            l.send(["started", 0])
        elif mode == "self-reference":
            loop = []
            loop.append(loop)
            from inferlet.host import transport
            try:  # straight to the wire, past the SDK's argument checks
                transport.installed().tell(("session", "send"), (loop,))
            except ValueError as exc:
                return f"refused: {exc}"
        await asyncio.sleep(60)
    return "not killed"
'''


@pytest.mark.parametrize("mode, error", [
    ("bomb", "malformed frame"),
    ("deep", "containers nest at most"),
    ("ext", "unknown ext type 42"),
    ("oversize", "frames are at most 67108864 bytes"),
    ("private", "'context'.'_fork_kv' is not a host function"),
    ("outside", "'binding'.'current' is not a host function"),
    ("engine-attr", "unknown message ['get', 999,"),
    ("method", "unknown message ['method', 999,"),  # handles are opaque: no method of one is callable
    ("dunder", "unknown message ['method', 999,"),
    ("copy", "unknown message ['copy', 999,"),
    ("started-twice", "reported 'started' twice"),
])
def test_a_hostile_frame_kills_only_its_worker_and_alice_is_served(hostile, tmp_path, mode, error):
    program = write_program(tmp_path / "evil", ATTACK, parameters='mode = { type = "string", description = "how" }')

    async def scenario(s):
        async with await connect(s.url, TOKENS["mallory"]) as mallory:
            proc = await mallory.launch(await mallory.install(program), {"mode": mode})
            events = proc.events()
            assert (await events.__anext__()).value == "holding"
            await victim_is_served(s)  # alice gets her answer while mallory's worker misbehaves
            last = await asyncio.wait_for(events.__anext__(), 10)
            assert last.kind == "error" and "broke the host protocol" in last.value and error in last.value, last
            assert s.server.engine.pools_whole()

    hostile(scenario)


def test_a_self_referencing_argument_fails_in_the_inferlet_not_the_server(hostile, tmp_path):
    program = write_program(tmp_path / "evil", ATTACK, parameters='mode = { type = "string", description = "how" }')

    async def scenario(s):
        async with await connect(s.url, TOKENS["mallory"]) as mallory:
            value = await (await mallory.launch(await mallory.install(program), {"mode": "self-reference"})).wait()
            assert value.startswith("refused:") and "nests deeper" in value
        await victim_is_served(s)

    hostile(scenario)


DRAFT_ATTACK = '''
import numpy as np
from inferlet import Context, Model, Sampler, runtime
from inferlet.host import inference, speculation
from inferlet.host.types import SampleSpec


async def main(input):
    refused = []
    with Context(Model.load(runtime.models()[0])) as ctx:
        ctx.append([1, 2, 3])
        await ctx.flush()
        handle = ctx._ctx
        attempts = [
            lambda: inference.forward(handle, [4], samples=[SampleSpec(0, logit_mask=np.zeros(3, np.uint8))]),
            lambda: inference.forward(handle, [4, 5], samples=[SampleSpec(0), SampleSpec(1)], drafts=2),
            lambda: inference.forward(handle, [4, 5], samples=[SampleSpec(0)], drafts=1),
        ]
        for attempt in attempts:
            try:
                await attempt()
            except Exception as e:
                refused.append(type(e).__name__)
        for args in ((["x"], 4), ([4], 10 ** 9), ([4], -1)):
            try:
                speculation.system_draft(handle, *args)
            except Exception as e:
                refused.append(type(e).__name__)
        return {"refused": refused, "seq_len": ctx.seq_len}
'''


def test_hostile_draft_passes_and_masks_are_refused_and_alice_is_served(hostile, tmp_path):
    program = write_program(tmp_path / "drafts", DRAFT_ATTACK)

    async def scenario(s):
        async with await connect(s.url, TOKENS["mallory"]) as mallory:
            value = await (await mallory.launch(await mallory.install(program), {})).wait()
            assert value == {"refused": ["InvalidInput"] * 6, "seq_len": 3}  # nothing was written
        await victim_is_served(s)

    hostile(scenario)


HANDLE_MIXUP = '''
import copy
from inferlet import Context, Model, runtime
from inferlet.host import context, grammar, model


async def main(input):
    name = runtime.models()[0]
    with Context(Model.load(name)) as ctx:
        handle, refused = ctx._ctx, []
        for call in (lambda: model.chat_copy(handle), lambda: grammar.matcher_packed(handle),
                     lambda: handle.check_live(), lambda: handle.released):
            try:
                call()
            except (TypeError, AttributeError) as e:
                refused.append(f"{type(e).__name__}: {e}")
        m = grammar.matcher(name, grammar.regex("[a-z]+"))
        runs = grammar.matcher_runs(m)  # before matcher_ready: the engine awaits the compilation first
        return {"refused": refused, "copy_is_same": copy.copy(handle) is handle, "live": not context.is_released(handle),
                "runs_cover_the_vocabulary": sum(runs) == model.vocab_size(name), "model": grammar.matcher_model(m) == name}
'''


def test_a_handle_is_an_opaque_token_good_only_as_the_argument_its_host_function_declares(hostile, tmp_path):
    program = write_program(tmp_path / "mixup", HANDLE_MIXUP)

    async def scenario(s):
        async with await connect(s.url, TOKENS["mallory"]) as mallory:
            value = await (await mallory.launch(await mallory.install(program), {})).wait()
            refused = value.pop("refused")
            assert refused[0] == "TypeError: model.chat_copy(): b cannot be a Context handle"
            assert refused[1] == "TypeError: grammar.matcher_packed(): m cannot be a Context handle"
            assert all("Context handle is opaque" in r for r in refused[2:]) and len(refused) == 4, refused
            assert value == {"copy_is_same": True, "live": True, "runs_cover_the_vocabulary": True, "model": True}
        await victim_is_served(s)

    hostile(scenario)
