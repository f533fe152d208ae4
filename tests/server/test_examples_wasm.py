"""Every bundled example returns the same value in the wasm sandbox as in-process: the same
server, the same inputs, one at a time, on the dummy backend (whose tokens follow from the
request, not from the batch it lands in). Timings in the values are left out."""

from __future__ import annotations

from typing import Any

from test_examples_isolated import ALL, run_all_examples
from wasm_helpers import shared_launcher

from pie_core.runtime.launcher import InProcessLauncher

TIMINGS = {"latency_s", "seconds", "warm_up_seconds"}  # wall-clock readings inside example values


def _scrub(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items() if k not in TIMINGS}
    if isinstance(value, (list, tuple)):
        return [_scrub(v) for v in value]
    return value


def _results(engine: Any, launcher: Any) -> dict[str, tuple[Any, list[Any]]]:
    # one at a time: the same batches both ways
    return {name: (final, events) for name, final, events in run_all_examples(engine, launcher, at_once=1, limit_s=240)}


def test_every_example_returns_the_same_value_in_wasm_as_in_process(dummy_engine):
    inproc = _results(dummy_engine, InProcessLauncher())
    wasm = _results(dummy_engine, shared_launcher())
    assert dummy_engine.pools_whole(), "an example left KV pages allocated"
    assert {n: f for n, (f, _) in wasm.items() if f[0] != "return"} == {}
    differ = {n: (_scrub(inproc[n][0][1]), _scrub(wasm[n][0][1])) for n in ALL
              if _scrub(inproc[n][0]) != _scrub(wasm[n][0])}
    assert differ == {}
    # what the examples print reaches the client the same way (Stdout events, line by line)
    assert [e for e in inproc["interactive-chat"][1] if e[0] == "stdout"] == \
        [e for e in wasm["interactive-chat"][1] if e[0] == "stdout"]
    assert wasm["mcp-tools"][0][1]["tool"] == "shout" and "QUIET" in str(wasm["mcp-tools"][0][1]["result"])
