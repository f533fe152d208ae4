"""The readme's synchronous forms in the wasm sandbox, where the guest runs one inferlet and
may block in the host: the same programs and checks as in the process runner
(test_isolation_sync_forms.py)."""

from __future__ import annotations

from test_isolation_sync_forms import (
    ASYNC_MAIN, MCP_IN_ASYNC_MAIN, SYNC_MAIN, _run_isolated, check_for_loops, check_mcp_strings, check_plain_main,
)
from test_isolation_sync_forms import engine  # noqa: F401  # a fixture: a dummy engine with an MCP server

from pie_core.runtime.wasm.host import GuestLimits
from pie_core.runtime.wasm.launcher import WasmLauncher


def _wasm() -> WasmLauncher:
    return WasmLauncher(GuestLimits(wall_s=120.0, memory_mb=512))


def test_for_loops_block_in_the_guest_and_give_what_async_for_gives(engine, tmp_path):  # noqa: F811
    check_for_loops(_run_isolated(engine, tmp_path, ASYNC_MAIN, _wasm()))


def test_a_plain_def_main_gets_values_from_the_waiting_calls_in_the_guest(engine, tmp_path):  # noqa: F811
    check_plain_main(engine, _run_isolated(engine, tmp_path, SYNC_MAIN, _wasm()))


def test_mcp_calls_return_strings_inside_async_main_in_the_guest(engine, tmp_path):  # noqa: F811
    check_mcp_strings(_run_isolated(engine, tmp_path, MCP_IN_ASYNC_MAIN, _wasm()))
