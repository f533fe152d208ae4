"""The agent examples keep their loop's protocol, on the dummy backend, in-process.

``agent-react``: every turn's actions run and their observation enters the context, the
context is kept across turns (its length is exactly prompt + tokens generated + observations:
nothing re-prefilled), and it is idle in the market while the tools run. ``agent-codeact``: a
failed expression leaves the KV cache with its fork. ``agent-swarm``: the note goes round the
ring, one inferlet per agent. The same examples run in worker processes and the wasm sandbox in
``tests/server/test_examples_isolated.py`` and ``test_examples_wasm.py``; the evaluator's limits
are in ``test_codeact_evaluator.py``.
"""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from typing import Any, Callable

import pytest

from pie_core.engine.engine import Engine
from pie_core.runtime.instance import run_inferlet
from pie_core.runtime.manifest import load_manifest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _module(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"_agent_{path.parent.name.replace('-', '_')}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


react = _module(EXAMPLES / "agent-react" / "react.py")


@pytest.fixture(scope="module")
def engine() -> Engine:
    engine = Engine("dummy")
    engine.load(None)
    return engine


def run(engine: Engine, name: str, args: dict[str, Any], watch: Callable[[Engine], Any] | None = None,
        ) -> tuple[Any, list[Any]]:
    """Run ``examples/<name>``; its value and what ``watch(engine)`` read every 5 ms meanwhile."""
    manifest = load_manifest(EXAMPLES / name)
    seen: list[Any] = []

    async def go() -> Any:
        task = asyncio.ensure_future(run_inferlet(engine, manifest, args, lambda e: None))
        while watch is not None and not task.done():
            seen.append(watch(engine))
            await asyncio.sleep(0.005)
        return await task

    final = asyncio.run(go())
    assert final.kind == "return", final.value
    assert engine.pools_whole(), f"{name} left KV pages allocated"
    return final.value, seen


def idle_holders(engine: Engine) -> int:
    return sum(h.idle for m in engine.models.values() for h in m.market.holders.values())


def test_react_runs_every_turn_and_feeds_each_observation_back(engine):
    out, idle = run(engine, "agent-react", {"turns": 3, "max_tokens": 5, "tool_delay_s": 0.05, "stop_at_finish": False},
                    idle_holders)
    assert out["turns"] == 3 and out["tokens"] == 15
    for entry in out["log"]:
        calls = [tuple(c) for c in entry["actions"]]
        assert calls == react.actions(entry["text"], 2)
        assert entry["observation"].startswith("Observation: ")
    assert max(idle) == 1, "the context is held out of the auction while its tools run"
    assert idle[-1] == 0 or min(idle) == 0, "and bids again when they are done"


def test_react_keeps_one_context_and_prefills_only_what_is_new(engine):
    # text mode: the context is exactly the prompt, the tokens sampled and the observations
    args = {"turns": 3, "max_tokens": 4, "tool_delay_s": 0.0, "mode": "text", "system": "S", "task": "T"}
    out, _ = run(engine, "agent-react", args)
    tok = engine.models[next(iter(engine.models))].tokenizer
    expected = len(tok.encode("S\nQuestion: T\n")) + out["tokens"]
    expected += sum(len(tok.encode(f"\n{e['observation']}\n")) for e in out["log"])
    assert out["context_tokens"] == expected


def test_react_runs_a_turns_actions_at_once():
    tools = react.Tools(0.2)
    calls = react.actions("Thought: both.\nAction: search[Paris]\nAction: lookup[capital]\nAction: search[x]", 2)
    assert calls == [("search", "Paris"), ("lookup", "capital")]

    async def go() -> tuple[list[str], float]:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        results = await tools.run(calls)
        return results, loop.time() - t0

    results, took = asyncio.run(go())
    assert took < 0.35, "two 0.2 s tools at once take 0.2 s, not 0.4"
    assert "capital of France" in results[0] and results[1].startswith("Paris is the capital")
    assert react.actions("no action here", 2) == [("search", "no action here")]
    assert react.finished([("search", "a"), ("finish", "42")]) == "42"


def test_codeact_drops_failed_attempts_from_the_context(engine):
    # on the dummy backend the model's "code" is noise: every attempt fails and is dropped, so
    # longer attempts leave the conversation as long as short ones (up to the failure note's text)
    tok = engine.models[next(iter(engine.models))].tokenizer
    kept = {}
    for n in (3, 9):
        out, _ = run(engine, "agent-codeact", {"turns": 1, "retries": 1, "max_tokens": n})
        assert [s["turn"] for s in out["steps"]] == [0, 0] and all("error" in s for s in out["steps"])
        assert out["answer"] is None
        note = len(tok.encode(f"The last 2 attempts failed: {out['steps'][-1]['error']}"))
        kept[n] = out["context_tokens"] - note
    assert kept[3] == kept[9]


def test_swarm_passes_the_note_round_the_ring(engine):
    out, _ = run(engine, "agent-swarm", {"agents": 3, "hops": 5, "max_tokens": 3})
    assert [s["agent"] for s in out["steps"]] == [0, 1, 2, 0, 1]
    assert [s["hops_left"] for s in out["steps"]] == [4, 3, 2, 1, 0]
    assert out["turns"] == [2, 2, 1] and out["result"] == out["steps"][-1]["text"]


def test_a_one_agent_swarm_ends(engine):
    out, _ = run(engine, "agent-swarm", {"agents": 1, "hops": 2, "max_tokens": 2})
    assert out["turns"] == [2]
