"""What each program of ``programs/`` is run with, in order, and what differs by runner on
purpose.

Every program runs once per runner. ``snapshot-reader`` runs after ``snapshots``: it takes the
snapshot that run left (the name carries the runner, so a failed run cannot leave one another
runner's run trips over). ``messaging`` and ``snapshots`` also spawn ``messaging-peer`` and
``snapshot-reader`` by their installed names.
"""

from __future__ import annotations

from runner_harness import Scenario

RUNNERS = ("in-process", "process", "wasm")
SANDBOXED = ("process", "wasm")

WIRE_CASES = ("negative_token", "huge_token", "negative_position", "negative_sample_index", "negative_truncate",
              "negative_reserve", "negative_rollback", "int_message", "int_adapter_name", "bool_bid",
              "int_compile_timeout", "str_file", "int_scratch_path")
"""The calls of programs/wire-values, one run each (see CASES there)."""

MAIN_EXIT_CASES = {"exit-3": "SystemExit: 3", "exit-message": "SystemExit: no input given", "exit-0": None,
              "exit-none": None, "exit-false": None, "interrupt": "KeyboardInterrupt"}
"""How programs/main-exits ends ``main``, one run each, and the Error event's text (None: the
run ends as ``return None`` does, the meaning of ``sys.exit()``, ``sys.exit(0)`` in every runner)."""

SCENARIOS: list[Scenario] = [
    Scenario("model-and-tokenizer"),
    Scenario("context-filling"),
    Scenario("snapshots", {"reader": "@snapshot-reader", "later": "runners-later-{runner}"}),
    Scenario("snapshot-reader", {"name": "runners-later-{runner}"}),
    Scenario("samplers-and-collectors"),
    Scenario("generation-steps"),
    Scenario("constraints"),
    Scenario("speculation"),
    Scenario("forward-passes"),
    Scenario("grammar-matcher"),
    Scenario("tool-use"),
    Scenario("adapters-and-zo"),
    Scenario("market"),
    Scenario("messaging", {"peer": "@messaging-peer"}),
    Scenario("messaging-peer"),
    Scenario("session-and-runtime", messages=("hello", "world"), files=(b"file-bytes\x00\x01",)),
    Scenario("mcp-client"),
    Scenario("sync-forms"),
    Scenario("sync-main", messages=("hi",), files=(b"blob",)),
    Scenario("refused-calls"),
    Scenario("main-raises"),
    *(Scenario("main-exits", {"how": how}, label=how) for how in MAIN_EXIT_CASES),
    Scenario("exit-at-import"),
    Scenario("stdlib-imports"),
    Scenario("stdio-streams"),
    *(Scenario("main-returns", {"value": v}, label=v) for v in ("nan", "set", "bytes", "tuple", "nested")),
    Scenario("finalizer-release"),
    *(Scenario("wire-values", {"case": case}, label=case) for case in WIRE_CASES),
]

_JSON_ONLY = "return JSON-compatible values (dict, list, str, int, float, bool or None)"
EXPECTED_ERRORS = {
    "main-raises": "InvalidInput: token ids must be >= 0 and < 151936, got 151936 at index 0",
    **{f"main-exits[{how}]": text for how, text in MAIN_EXIT_CASES.items() if text is not None},
    "exit-at-import": "SystemExit: 3",
    "main-returns[nan]": "TypeError: main returned a value of type dict that is or holds NaN or infinity, which JSON "
                         f"cannot represent: {_JSON_ONLY}",
    "main-returns[set]": f"TypeError: main returned a value of type set, which is not JSON-serialisable: {_JSON_ONLY}",
    "main-returns[bytes]": f"TypeError: main returned a value of type bytes, which is not JSON-serialisable: {_JSON_ONLY}",
}
"""Programs whose run ends with an Error event in every runner, and its text."""

BLOCKING = "synchronous forms need `pie serve --isolation process` or `--isolation wasm`"

IN_PROCESS_ONLY = {
    # in-process nothing may block: a plain main is refused at load ...
    "sync-main": ("error", "InvalidInput: main.py: main is a plain function here: write 'async def main(input)' "
                           f"({BLOCKING})"),
}
"""Programs whose in-process run is expected to end otherwise than their sandboxed runs."""


SYNC_FORMS_IN_PROCESS = {
    "for_tokens": "Unsupported: `for tokens in ctx.generate(...)` blocks, and this runner cannot block an inferlet: "
                  f"write `async for step in ctx.generate(...)` ({BLOCKING})",
    "for_events": "Unsupported: `for event in ctx.generate(..., decode=True)` blocks, and this runner cannot block "
                  f"an inferlet: write `async for event in ctx.generate(..., decode=True)` ({BLOCKING})",
    "generate_text_in_async": "coroutine",
    "for_messages": "Unsupported: `for msg in sub` blocks, and this runner cannot block an inferlet: write "
                    f"`async for msg in sub` ({BLOCKING})",
    "mcp_call_type": "coroutine",
}
"""What sync-forms observes in-process: each blocking form raises Unsupported naming the async
form, a value call is a coroutine, and an MCP call is a coroutine to await."""


SYNC_FORMS_SANDBOXED = {"for_tokens": "same", "for_events": "same", "generate_text_in_async": "coroutine",
                        "for_messages": "same", "mcp_call_type": "str"}
"""What sync-forms observes where the runner lets an inferlet block: every form gives what its
async form gives (the program checks it), and an MCP call returns a ``str``."""
