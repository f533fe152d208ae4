"""``runtime.spawn`` under ``pie serve``: names resolve as the user's own launch resolves them
(never a path, never another user's upload), nesting and running children are capped, and the
count of running children stays exact when spawns fail or are cancelled."""

from __future__ import annotations

from pathlib import Path

from hostile import Served, victim_is_served, write_program
from pie_core.client import connect
from pie_core.server.quotas import Quotas

SPAWNER = '''
import asyncio, json
from inferlet import runtime


async def attempt(name, args):
    try:
        return ["ok", await runtime.spawn(name, args)]
    except Exception as exc:
        return ["error", f"{type(exc).__name__}: {exc}"]


async def main(input):
    plan = json.loads(input["plan"])
    mode = plan["mode"]
    if mode == "nap":
        await asyncio.sleep(plan["seconds"])
        return "napped"
    if mode == "spawn":  # each target once, one after the other
        return [await attempt(t, {"plan": json.dumps({"mode": "nap", "seconds": 0})}) for t in plan["targets"]]
    if mode == "nest":  # spawn itself until refused; the innermost answer comes back out
        depth = plan["depth"]
        inner = json.dumps({"mode": "nest", "self": plan["self"], "depth": depth + 1})
        outcome = await attempt(plan["self"], {"plan": inner})
        return outcome[1] if outcome[0] == "ok" else [depth, outcome[1]]
    if mode == "crowd":  # many children at once, some cancelled mid-run, then as many again
        nap = {"plan": json.dumps({"mode": "nap", "seconds": plan["seconds"]})}
        first = [asyncio.ensure_future(attempt(plan["self"], nap)) for _ in range(plan["n"])]
        await asyncio.sleep(plan["seconds"] / 2)
        first[0].cancel()
        done = await asyncio.gather(*first, return_exceptions=True)
        again = await asyncio.gather(*[attempt(plan["self"], nap) for _ in range(plan["again"])])
        return {"first": [d if isinstance(d, list) else ["cancelled", ""] for d in done], "again": again}
    if mode == "cancel":  # a child given up on is over in the engine when the cancellation lands
        long = asyncio.ensure_future(attempt(plan["self"], {"plan": json.dumps({"mode": "nap", "seconds": 60})}))
        await asyncio.sleep(1)
        long.cancel()
        try:
            await long
        except asyncio.CancelledError:
            pass
        return await attempt(plan["self"], {"plan": json.dumps({"mode": "nap", "seconds": 0})})
    raise ValueError(mode)
'''
PLAN = 'plan = { type = "string" }'


def _spawner(folder: Path, name: str = "spawner") -> Path:
    return write_program(folder, SPAWNER, name=name, parameters=PLAN)


def _plan(**plan: object) -> dict[str, str]:
    import json

    return {"plan": json.dumps(plan)}


def test_spawn_by_path_is_refused_alike_whether_or_not_the_path_exists(hostile, tmp_path: Path) -> None:
    async def scenario(s: Served) -> None:
        async with await connect(s.url, s.tokens["alice"]) as alice:
            await alice.install(_spawner(tmp_path / "alices", name="alices-secret"))
        alices_upload = next(p for p in s.data_dir.rglob("Pie.toml") if "alices-secret" in p.read_text()).parent
        targets = [str(alices_upload), str(tmp_path / "no-such-folder"), "../../etc", "~root", ".hidden"]
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            result = await (await mallory.launch(await mallory.install(_spawner(tmp_path / "m")),
                                                 _plan(mode="spawn", targets=targets))).wait()
        for target, (kind, message) in zip(targets, result):
            assert kind == "error", (target, message)
            assert message == (f"InvalidInput: runtime.spawn takes a program name ('name' or 'name@version') under pie serve, "
                               f"not a path: {target!r}; install the program first and spawn it by name")
        await victim_is_served(s)

    hostile(scenario)


def test_spawn_resolves_names_as_the_users_own_launch_does(hostile, tmp_path: Path) -> None:
    async def scenario(s: Served) -> None:
        async with await connect(s.url, s.tokens["alice"]) as alice:
            await alice.install(_spawner(tmp_path / "alices", name="alices-secret"))
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            mine = await mallory.install(_spawner(tmp_path / "m"))
            result = await (await mallory.launch(mine, _plan(mode="spawn", targets=["alices-secret", mine]))).wait()
        assert result[0][0] == "error" and result[0][1].startswith("NotFound: no program 'alices-secret'"), result
        assert "alices-secret" not in result[0][1].split(";", 1)[1], "the error lists another user's upload"
        assert result[1] == ["ok", "napped"], result
        await victim_is_served(s)

    hostile(scenario)


def test_spawn_nests_at_most_spawn_depth_deep(hostile, tmp_path: Path) -> None:
    async def scenario(s: Served) -> None:
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            me = await mallory.install(_spawner(tmp_path / "m"))
            depth, message = await (await mallory.launch(me, _plan(mode="nest", self=me, depth=0))).wait()
        assert depth == 2, (depth, message)
        assert message.startswith("InvalidInput: runtime.spawn may nest at most 2 deep"), message
        await victim_is_served(s)

    hostile(scenario, quotas=Quotas(spawn_depth=2))


def test_running_children_are_capped_and_counted_exactly_through_failures_and_cancellation(hostile, tmp_path: Path) -> None:
    async def scenario(s: Served) -> None:
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            me = await mallory.install(_spawner(tmp_path / "m"))
            result = await (await mallory.launch(me, _plan(mode="crowd", self=me, n=5, again=3, seconds=2))).wait()
        first = result["first"]
        assert first[0][0] == "cancelled" and sorted(kind for kind, _ in first[1:]) == ["error", "error", "ok", "ok"], first
        assert all(message.startswith("InvalidInput: user mallory already runs 3 spawned inferlets")
                   for kind, message in first if kind == "error"), first
        assert result["again"] == [["ok", "napped"]] * 3, result["again"]  # the cancelled and refused ones were given back
        await victim_is_served(s)

    hostile(scenario, quotas=Quotas(processes=3))


def test_a_cancelled_spawn_has_ended_in_the_engine_when_the_cancellation_lands(hostile, tmp_path: Path) -> None:
    """The worker's cancelled host call is cancelled in the engine too, and awaited there: the
    cancelled child no longer counts against the quota the moment the inferlet goes on."""
    async def scenario(s: Served) -> None:
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            me = await mallory.install(_spawner(tmp_path / "m"))
            result = await (await mallory.launch(me, _plan(mode="cancel", self=me))).wait()
        assert result == ["ok", "napped"], result
        await victim_is_served(s)

    hostile(scenario, quotas=Quotas(processes=1))
