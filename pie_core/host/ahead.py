"""Run-ahead: the next decode step of a context starts before the inferlet asks for it.

A decode loop's next pass is predictable: the token the last pass sampled, at the next position,
with the same sampler and probes. When a pass asks for it (``inference.forward(..., ahead=n,
stop=...)``) and sampled a token not in ``stop``, the host starts that pass at once, so it joins
the very next batch, while the inferlet (in a worker or a wasm guest, a round trip away) is still
handling the last output. Its KV is written but not recorded (:func:`~pie_core.scheduler.passes.
run_unrecorded`), so nothing the inferlet can observe changes:

- the inferlet's next ``forward`` on the context that is exactly that pass takes it (waiting for
  it if it still runs) and records it, as if it had run then;
- any other ``forward`` on the context, and every call that changes the context's pages or
  length (truncate, the raw page calls, suspend, release), drops it first: a pass still queued
  is withdrawn from its batch, one that ran is forgotten (its slots lie beyond the length);
- forks and snapshots copy only recorded slots, so they never see it.

Until then the context stays pinned in the market (a suspension would lose the unrecorded slot).
At most one pass per context runs ahead, and a chain of them advances only as the inferlet
takes each one: a slow inferlet costs at most one wasted step.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from pie_core.scheduler.passes import Landed, Pass, Tag, run_unrecorded
from pie_core.values import ProbeSpec, RequestOutput, SampleSpec

if TYPE_CHECKING:
    from pie_core.host.context import HostContext

__all__ = ["Ahead", "next_step"]


class Ahead:
    """One pass started ahead of its call, with what the call must look like to take it."""

    def __init__(self, ctx: HostContext, work: Pass, key: tuple[Any, ...], use: Any) -> None:
        self.ctx = ctx
        self.key = key
        self._use = use  # the adapter binding held until the pass is taken or dropped
        self._landed: Landed | None = None
        self._dropped = False
        self.task: asyncio.Task[None] = asyncio.get_running_loop().create_task(self._run(work))

    async def _run(self, work: Pass) -> None:
        async with self.ctx.lock:
            landed = await run_unrecorded(self.ctx.model, self.ctx.holder, work)
        if self._dropped:
            landed.drop()
        else:
            self._landed = landed

    def matches(self, key: tuple[Any, ...]) -> bool:
        """Whether a forward call described by ``key`` (see :func:`call_key`) is this pass."""
        return key == self.key

    async def take(self) -> RequestOutput | None:
        """Wait for the pass and record it; its output, or None when it failed or could not be
        recorded (the caller then runs the pass itself, and sees its error if it recurs)."""
        try:
            await asyncio.shield(self.task)
        except asyncio.CancelledError:
            self.drop()
            raise
        except Exception:  # noqa: BLE001 - the real pass runs instead and reports what recurs
            self._release_use()
            return None
        landed, self._landed = self._landed, None
        self._release_use()
        if landed is None or not landed.record():
            return None
        return landed.output

    def drop(self) -> None:
        """Forget the pass now: withdraw it from its batch if it has not run, or drop what it
        wrote if it has. Safe to call from synchronous host calls; idempotent."""
        if self._dropped:
            return
        self._dropped = True
        self._release_use()
        if self._landed is not None:
            self._landed.drop()
            self._landed = None
        elif not self.task.done():
            self.task.cancel()  # a request still queued is never sent; one in flight is ignored

    async def settle(self) -> None:
        """Drop the pass and wait until its task ended (its pages are back)."""
        self.drop()
        await asyncio.wait([self.task])

    def _release_use(self) -> None:
        use, self._use = self._use, None
        if use is not None:
            use()


def call_key(ids: np.ndarray, pos: np.ndarray, samples: Sequence[SampleSpec], probes: Sequence[ProbeSpec],
             logit_mask: Any, tag: Tag | None) -> tuple[Any, ...] | None:
    """What identifies a one-token pass for run-ahead: its token and position, what it reads,
    its static logit mask and adapter; None for any other pass."""
    if len(ids) != 1:
        return None
    mask = None if logit_mask is None else tuple(logit_mask)
    adapter = None if tag is None else (tag.record, tag.zo_seed)
    return int(ids[0]), int(pos[0]), tuple(samples), tuple(probes), mask, adapter


def next_step(ids: np.ndarray, samples: Sequence[SampleSpec], probes: Sequence[ProbeSpec], drafts: int, masked: bool,
              out: RequestOutput, stop: Sequence[int]) -> tuple[int, tuple[SampleSpec, ...], tuple[ProbeSpec, ...]] | None:
    """The next decode step after a pass that asked for run-ahead: its token and what it
    samples and probes (all on its one row); None when the pass is no decode step (not one
    sample of one draw on its last row and probes only there, drafts, masks) or sampled a stop
    token."""
    last = len(ids) - 1
    if drafts or masked or len(samples) != 1 or not out.tokens:
        return None
    sample = samples[0]
    if sample.index != last or sample.draws != 1 or any(p.index != last for p in probes):
        return None
    token = out.tokens[0][0]
    if token in stop:
        return None
    return token, (replace(sample, index=0),), tuple(replace(p, index=0) for p in probes)
