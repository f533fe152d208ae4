"""Class 5, the KV-page market: however many inferlets mallory starts, the credits they are
endowed with together stay within her quota (server.quotas.credits), so her weight in the
auctions for KV pages does not grow with her inferlet count, and alice is still endowed in full."""

from __future__ import annotations

import asyncio
import re
import urllib.request
from typing import Any

import pytest

from hostile import TOKENS, Served, write_program
from pie_core.client import connect
from pie_core.errors import InvalidInput
from pie_core.scheduler.credits import DEFAULT_ENDOWMENT
from pie_core.server.auth import User, hash_token, metrics_id
from pie_core.server.quotas import Quotas

REPORT_BALANCE = """
from inferlet import Model, runtime, scheduling, session

async def main(input):
    session.send(str(scheduling.balance(Model.load(runtime.models()[0]))))
    return await session.receive()
"""


async def _balances(client: Any, program: str, n: int) -> tuple[list[Any], list[float]]:
    """Launch ``n`` copies of the program at once; each one's first event is its balance."""
    procs = [await client.launch(program) for _ in range(n)]
    balances = []
    for proc in procs:
        ev = await anext(proc.events())
        assert ev.kind == "stdout", ev
        balances.append(float(ev.value))
    return procs, balances


async def _end(procs: list[Any]) -> None:
    for proc in procs:
        await proc.send("done")
    for proc in procs:
        assert await asyncio.wait_for(proc.wait(), 20) == "done"


async def _credits_gauge(s: Served, user: str) -> float:
    def get() -> str:
        request = urllib.request.Request(s.http + "/metrics", headers={"Authorization": f"Bearer {s.tokens['alice']}"})
        with urllib.request.urlopen(request) as resp:
            return resp.read().decode()

    text = await asyncio.to_thread(get)
    label = metrics_id(User(user, hash_token(TOKENS[user])))  # /metrics names no user
    return sum(float(m[1]) for m in re.finditer(rf'^pie_user_credits\{{user="{label}"[^}}]*\}} (\S+)$', text, re.M))


def test_many_inferlets_share_their_users_credit_quota_and_alice_is_endowed_in_full(hostile, tmp_path):
    quota = 2.5 * DEFAULT_ENDOWMENT

    async def scenario(s: Served) -> None:
        async with await connect(s.url, s.tokens["mallory"]) as mallory, \
                await connect(s.url, s.tokens["alice"]) as alice:
            program = await mallory.install(write_program(tmp_path / "bal", REPORT_BALANCE, name="bal"))
            procs, balances = await _balances(mallory, program, 4)
            assert sum(balances) == pytest.approx(quota)
            assert sorted(balances) == pytest.approx([0.0, quota - 2 * DEFAULT_ENDOWMENT, DEFAULT_ENDOWMENT,
                                                      DEFAULT_ENDOWMENT])
            theirs = await alice.install(write_program(tmp_path / "alice", REPORT_BALANCE, name="bal"))
            alice_procs, alice_balance = await _balances(alice, theirs, 1)
            assert alice_balance == [DEFAULT_ENDOWMENT]
            assert await _credits_gauge(s, "mallory") == pytest.approx(quota)
            assert await _credits_gauge(s, "alice") == pytest.approx(DEFAULT_ENDOWMENT)
            await _end(procs + alice_procs)
            # Ended inferlets give their endowments back to their user's budget.
            again, balances = await _balances(mallory, program, 1)
            assert balances == [DEFAULT_ENDOWMENT]
            await _end(again)

    hostile(scenario, quotas=Quotas(credits=quota))


def test_credit_quota_reads_from_config_with_per_user_overrides_and_0_means_no_limit():
    from pie_core import config

    doc = config.default_config()
    config.set("server.quotas.credits", 2000, doc)
    config.set("server.quotas.users.alice.credits", 0, doc)
    quotas = Quotas.from_config(doc)
    assert quotas.for_user("mallory").credits_of() == 2000.0
    assert quotas.for_user("alice").credits_of() is None
    assert Quotas().credits_of() == 4 * DEFAULT_ENDOWMENT
    for bad in (-1.0, float("inf"), float("nan"), True, "lots"):
        with pytest.raises(InvalidInput, match="server.quotas.credits must be a finite number"):
            Quotas(credits=bad)  # type: ignore[arg-type]
