"""Values and handles the wasm sandbox cannot lower are refused as in every runner, never a trap.

componentize-py panics, and the instance traps, on a value outside its WIT type (a negative
``u32``, an int where a string goes) and on a handle the guest no longer holds. The SDK checks
each call's values against its declaration before the call leaves the inferlet, in every
runner, and the guest's transport checks the handles, so an inferlet catches the InvalidInput it
would catch in-process. A context or adapter collected in a reference cycle is released, as
in-process, and its pages are back in the pool before the inferlet ends.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from wasm_helpers import run_wasm, shared_launcher

from pie_core.engine.engine import Engine
from pie_core.host.adapter import HostAdapter
from pie_core.host.binding import HostInstance
from pie_core.host.context import HostContext
from pie_core.host.grammar import MatcherHandle
from pie_core.runtime import host_api
from pie_core.runtime.launcher import InProcessLauncher
from pie_core.runtime.manifest import Manifest, load_manifest

BAD_VALUES = '''
from inferlet import Context, Grammar, Matcher, Model, Sampler, runtime, session, zo
from inferlet.host import context as hc, inference, model as hm
from inferlet.host.types import SampleSpec


async def attempt(fn):
    try:
        value = fn()
        if hasattr(value, "__await__"):
            await value
    except Exception as exc:  # noqa: BLE001 - the class and text are the observation
        return [type(exc).__name__, str(exc)]
    return "accepted"


def forward(ctx, tokens, **options):
    return inference.forward(ctx._ctx, tokens, **options)


async def main(input):
    model = Model.load(runtime.models()[0])
    out = {}
    with Context(model) as ctx:
        ctx.append([1, 2, 3])
        await ctx.flush()
        cases = {
            "negative_token": lambda: forward(ctx, [5, -1]),
            "token_past_u32": lambda: forward(ctx, [2**32]),
            "str_token": lambda: forward(ctx, [5, "6"]),
            "bool_token": lambda: forward(ctx, [True]),
            "negative_mask_run": lambda: forward(ctx, [5], attention_masks=[[2, -2]]),
            "negative_sample_index": lambda: forward(ctx, [5], samples=[SampleSpec(-1)]),
            "negative_seed": lambda: forward(ctx, [5], samples=[SampleSpec(0, seed=-1)]),
            "kind_not_a_member": lambda: forward(ctx, [5], samples=[SampleSpec(0, kind=9)]),
            "zo_seed_past_s64": lambda: forward(ctx, [5], zo_seed=2**63),
            "u32_just_past": lambda: ctx.truncate(2**32),
            "float_count": lambda: ctx.truncate(1.0),
            "bool_count": lambda: ctx.truncate(True),
            "negative_rollback": lambda: Matcher(Grammar.from_regex("a+"), model).rollback(-1),
            "str_for_bytes": lambda: session.send_file("not bytes"),
            "int_for_str": lambda: hm.tokenize(model.name, 7),
            "bool_bid": lambda: ctx.set_bid(True),
            "int_timeout_becomes_float": lambda: Matcher(Grammar.from_regex("a+"), model, compile_timeout=0),
            "int_bid_becomes_float": lambda: ctx.set_bid(-1),
        }
        for name, fn in cases.items():
            out[name] = await attempt(fn)
        out["still_works"] = [ctx.seq_len, await ctx.generate(Sampler.argmax(), max_tokens=2, stop=[]).collect_tokens()]
    return out
'''

EXPECTED = {
    "negative_token": ["InvalidInput", "inference.forward(): tokens must be ints >= 0 and < 4294967296, got -1 at index 1"],
    "token_past_u32": ["InvalidInput",
                       "inference.forward(): tokens must be ints >= 0 and < 4294967296, got 4294967296 at index 0"],
    "str_token": ["InvalidInput", "inference.forward(): tokens must be ints >= 0 and < 4294967296, got str at index 1"],
    "bool_token": ["InvalidInput", "inference.forward(): tokens must be ints >= 0 and < 4294967296, got bool at index 0"],
    "negative_mask_run": ["InvalidInput", "inference.forward(): attention_masks[0] must be ints >= 0 and < 4294967296, "
                                          "got -2 at index 1"],
    "negative_sample_index": ["InvalidInput",
                              "inference.forward(): samples[0].index must be an int >= 0 and < 4294967296, got -1"],
    "negative_seed": ["InvalidInput",
                      "inference.forward(): samples[0].seed must be an int >= 0 and < 18446744073709551616, got -1"],
    "kind_not_a_member": ["InvalidInput", "inference.forward(): samples[0].kind must be a SamplerKind, got 9"],
    "zo_seed_past_s64": ["InvalidInput", "inference.forward(): zo_seed must be an int >= -9223372036854775808 and "
                                         "< 9223372036854775808, got 9223372036854775808"],
    "u32_just_past": ["InvalidInput", "context.truncate(): n must be an int >= 0 and < 4294967296, got 4294967296"],
    "float_count": ["InvalidInput", "context.truncate(): n must be an int >= 0 and < 4294967296, got float"],
    "bool_count": ["InvalidInput", "context.truncate(): n must be an int >= 0 and < 4294967296, got bool"],
    "negative_rollback": ["InvalidInput", "grammar.matcher_rollback(): n must be an int >= 0 and < 4294967296, got -1"],
    "str_for_bytes": ["InvalidInput", "session.send_file(): data must be bytes, got str"],
    "int_for_str": ["InvalidInput", "model.tokenize(): text must be a str, got int"],
    "bool_bid": ["InvalidInput", "scheduling.set_bid(): value must be a float, got True"],
    # converted, then refused by the engine: the message shows the value every runner received
    "int_timeout_becomes_float": ["InvalidInput", "compile timeout must be > 0 seconds, got 0.0"],
    "int_bid_becomes_float": ["InvalidInput", "a bid must be a finite number >= 0, got -1.0"],
}

DROPPED = '''
from inferlet import Context, Model, runtime
from inferlet.host import context as hc, inference


async def attempt(fn):
    try:
        return ["returned", fn()]
    except Exception as exc:  # noqa: BLE001
        return [type(exc).__name__, str(exc)]


async def main(input):
    model = Model.load(runtime.models()[0])
    raw = hc.create(model.name)
    await inference.forward(raw, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    length = hc.seq_len(raw)
    with raw:  # the binding's way to drop a handle now (the context is released first)
        pass
    out = {"length": length}
    for name in ("seq_len", "fork", "release", "release_soon", "is_released"):
        out[name] = await attempt(lambda: getattr(hc, name)(raw))
    with Context(model) as ctx:
        ctx.append([4, 5])
        await ctx.flush()
        out["afterwards"] = ctx.seq_len
    return out
'''

WRONG_HANDLE = '''
from inferlet import Grammar, Matcher, Model, runtime
from inferlet.host import context as hc


def attempt(fn):
    try:
        return ["returned", fn()]
    except Exception as exc:  # noqa: BLE001
        return [type(exc).__name__, str(exc)]


async def main(input):
    model = Model.load(runtime.models()[0])
    matcher = Matcher(Grammar.from_regex("a+"), model)
    return {"matcher": attempt(lambda: hc.seq_len(matcher._h)), "int": attempt(lambda: hc.seq_len(7)),
            "none": attempt(lambda: hc.seq_len(None))}
'''

CYCLES = '''
import gc

from inferlet import Adapter, Context, Model, runtime, session


class Holder:
    pass


async def main(input):
    model = Model.load(runtime.models()[0])
    for i in range(input["rounds"]):
        h = Holder()
        h.me = h  # a reference cycle: only the garbage collector frees it
        h.ctx = Context(model)
        h.ctx.append(list(range(1, 40)))
        await h.ctx.flush()
        h.fork = h.ctx.fork()
        h.adapter = Adapter.create(model, f"{input['prefix']}-{i}")
        del h
    gc.collect()
    print("collected", flush=True)
    await session.receive()  # the test looks at the pool meanwhile
    with Context(model) as ctx:
        ctx.append([1, 2, 3])
        await ctx.flush()
        return ctx.seq_len
'''


def _program(folder: Path, main_py: str, parameters: str = "") -> Manifest:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "Pie.toml").write_text(f'[package]\nname = "{folder.name}"\nversion = "1.0.0"\ndescription = "wire"\n\n'
                                     f"[parameters]\n{parameters}\n")
    (folder / "main.py").write_text(main_py)
    return load_manifest(folder)


def _run_in_process(engine: Engine, manifest: Manifest, args: dict[str, Any], scratch: Path) -> Any:
    async def main() -> Any:
        inst = HostInstance(engine=engine, emit=lambda event: None, scratch_root=scratch)
        return await InProcessLauncher().start(engine, manifest, args, inst)

    return asyncio.run(main())


def test_a_value_outside_its_wit_type_is_the_invalid_input_it_is_in_process(dummy_engine, tmp_path):
    manifest = _program(tmp_path / "bad-values", BAD_VALUES)
    final, _ = run_wasm(dummy_engine, manifest, {}, scratch_root=tmp_path)
    assert final.kind == "return", final  # no trap: every case was caught inside the inferlet
    in_process = _run_in_process(dummy_engine, manifest, {}, tmp_path)
    assert in_process.kind == "return", in_process
    assert final.value == in_process.value
    got = final.value
    assert {case: got[case] for case in EXPECTED} == EXPECTED
    assert got["still_works"][0] == 3 and len(got["still_works"][1]) == 2
    assert dummy_engine.pools_whole()


def test_a_dropped_handle_is_refused_and_its_release_is_a_no_op(dummy_engine, tmp_path):
    final, _ = run_wasm(dummy_engine, _program(tmp_path / "dropped", DROPPED), {}, scratch_root=tmp_path)
    assert final.kind == "return", final
    got = final.value
    gone = ("a handle the inferlet no longer holds (it was collected as garbage, or closed with `with`), so it "
            "cannot be used; keep a reference to its owner while you use it")
    assert got["length"] == 9 and got["afterwards"] == 2
    assert got["seq_len"] == ["InvalidInput", f"context.seq_len(): ctx is {gone}"]
    assert got["fork"] == ["InvalidInput", f"context.fork(): ctx is {gone}"]
    assert got["is_released"] == ["InvalidInput", f"context.is_released(): ctx is {gone}"]
    assert got["release"] == ["returned", None] and got["release_soon"] == ["returned", None]
    assert dummy_engine.pools_whole()


def test_a_handle_of_another_kind_is_refused_with_the_engines_message(dummy_engine, tmp_path):
    final, _ = run_wasm(dummy_engine, _program(tmp_path / "wrong-handle", WRONG_HANDLE), {}, scratch_root=tmp_path)
    assert final.kind == "return", final
    seq_len = host_api.host_function("context", "seq_len")
    engine_says = {}
    for case, value in {"matcher": MatcherHandle.__new__(MatcherHandle), "int": 7, "none": None}.items():
        try:
            host_api.check_arguments(seq_len, "context.seq_len", (value,))
        except TypeError as exc:
            engine_says[case] = ["TypeError", str(exc)]
    assert final.value == engine_says  # what the process runner's engine says for the same call
    assert engine_says == {"matcher": ["TypeError", "context.seq_len(): ctx cannot be a Matcher handle"],
                           "int": ["TypeError", "context.seq_len(): ctx must be a Context handle, got int"],
                           "none": ["TypeError", "context.seq_len(): ctx must be a Context handle, got NoneType"]}


def _released_while_waiting(engine: Engine, launcher: Any, manifest: Manifest, args: dict[str, Any],
                            scratch: Path) -> tuple[bool, Any]:
    """Run CYCLES: whether every context and adapter was released (and every page back in the
    pool) after its collection, while the inferlet still runs; and how the run ended."""
    events: list[Any] = []

    async def main() -> tuple[bool, Any]:
        inst = HostInstance(engine=engine, emit=events.append, scratch_root=scratch)
        task = launcher.start(engine, manifest, args, inst)
        for _ in range(600):
            if task.done() or any(e.kind == "stdout" and "collected" in str(e.value) for e in events):
                break
            await asyncio.sleep(0.05)
        released = False
        for _ in range(40):  # release_soon may be handed to the loop: a moment to land
            held = [r for r in inst.resources if isinstance(r, (HostContext, HostAdapter))]
            released = not held and engine.pools_whole()
            if released or task.done():
                break
            await asyncio.sleep(0.05)
        inst.inbox.put_nowait("go")
        return released, await task

    return asyncio.run(main())


def test_a_context_and_an_adapter_collected_in_a_cycle_are_released_at_once(dummy_engine, tmp_path):
    manifest = _program(tmp_path / "cycles", CYCLES, 'rounds = { type = "int" }\nprefix = { type = "string" }')
    released, final = _released_while_waiting(dummy_engine, InProcessLauncher(), manifest,
                                              {"rounds": 8, "prefix": "inprocess"}, tmp_path)
    assert final.kind == "return" and final.value == 3 and released, final
    released, final = _released_while_waiting(dummy_engine, shared_launcher(), manifest,
                                              {"rounds": 8, "prefix": "wasm"}, tmp_path)
    assert final.kind == "return" and final.value == 3, final  # no "unknown handle index" trap
    assert released, "the wasm run held the collected contexts' pages until it ended"
    assert dummy_engine.pools_whole()


MANY_HANDLES = '''
from inferlet import runtime
from inferlet.host import model as hm


async def main(input):
    name = runtime.models()[0]
    for _ in range(input["n"]):
        builder = hm.chat_builder(name)  # a handle; dropped again when the next one replaces it
    kept = [hm.chat_builder(name) for _ in range(input["keep"])]
    return len(kept)
'''


def test_handles_the_guest_dropped_leave_the_host_table(dummy_engine, tmp_path, monkeypatch):
    # The handle table is bounded (MAX_HANDLES); a guest that creates and drops handles in a
    # loop must never reach the bound, one that keeps them must.
    import pie_core.runtime.wasm.imports as imports

    monkeypatch.setattr(imports, "MAX_HANDLES", 20)
    manifest = _program(tmp_path / "many", MANY_HANDLES, 'n = { type = "int" }\nkeep = { type = "int" }')
    final, _ = run_wasm(dummy_engine, manifest, {"n": 200, "keep": 10}, scratch_root=tmp_path)
    assert final.kind == "return" and final.value == 10, final
    final, _ = run_wasm(dummy_engine, manifest, {"n": 0, "keep": 30}, scratch_root=tmp_path)
    assert final.kind == "error" and "at most 20 engine objects" in final.value, final
