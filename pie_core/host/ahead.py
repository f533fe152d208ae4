"""Run-ahead: the engine runs a context's decode loop ahead of its inferlet.

A decode loop's next pass is predictable: the token the last pass sampled, at the next position,
with the same sampler and probes. A pass that asks for it (``inference.forward(..., ahead=n,
stop=...)``) starts a :class:`Chain` on its context: as soon as a pass of the loop lands, the one
after it is queued (unless it sampled a stop token, or the ``n`` passes announced are all
queued), up to :data:`DEPTH` passes beyond what the inferlet has taken. So the context is in
every batch even when its inferlet — in a worker or a wasm guest, a round trip away — takes a
little longer than a step to handle an output. ``inference.forward_next(ctx)`` takes the next
pass (waiting for it if it still runs) and, with it, every pass after it that landed already, so
an inferlet that fell behind catches up in one call instead of one call per token. A pass run
ahead writes its KV but is recorded only when it is taken
(:func:`~pie_core.scheduler.passes.queue_unrecorded`), so nothing the inferlet can observe
changes if it never is. Passes taken together beyond the first are recorded with their pages
kept working until the next pass is: the SDK holds their outputs until its program asks, and
truncates those it never used before anything else touches the context.

How a chain meets the rest of the engine:

- any other ``forward`` on the context, and every call that changes the context's pages or
  length (truncate, the raw page calls, suspend, release), ends the chain first: passes still
  queued are withdrawn from their batch, ones that ran are forgotten (their slots lie beyond the
  length) and the pages they reserved go back;
- forks and snapshots copy only recorded slots, so they never see them;
- the market may still move the context: it pauses the chain first (``Holder.preempt``); the
  inferlet's next ``forward_next`` then runs its pass, restoring the context, and the chain goes
  on from there.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from pie_core.errors import InvalidInput, PieError
from pie_core.scheduler.passes import Pass, Tag, queue_unrecorded, record, run_pass
from pie_core.values import ProbeSpec, RequestOutput, SampleSpec

if TYPE_CHECKING:
    from pie_core.host.context import HostContext

__all__ = ["Chain", "decode_step", "DEPTH"]

DEPTH = 2
"""Passes a chain runs ahead of what its inferlet took: two give an inferlet that is late by up to
a step the time to catch up without its context missing a batch."""


class _Queued:
    """A pass of the chain queued ahead: what it runs and writes where, and its output to come."""

    __slots__ = ("work", "slot", "future")

    def __init__(self, work: Pass, slot: int, future: asyncio.Future[RequestOutput]) -> None:
        self.work, self.slot, self.future = work, slot, future

    def token(self) -> int | None:
        """The token it sampled, once it landed well; None before or after a failure."""
        f = self.future
        if not f.done() or f.cancelled() or f.exception() is not None:
            return None
        return f.result().tokens[0][0]


class Chain:
    """A decode loop of one context: the pass that started it is the template of the next ones.

    Args:
        ctx: The context.
        samples: What each pass samples (one row, index 0; masks packed as the batcher takes them).
        probes: What each pass probes (index 0).
        tag: The adapter and zo seed the passes run under (None: base weights).
        stop: Tokens that end the loop: no pass runs after one.
        left: How many more passes the inferlet expects after the one that started the chain.
        release: Lets go of what the chain holds (its adapter) when it ends.
    """

    def __init__(self, ctx: HostContext, samples: tuple[SampleSpec, ...], probes: tuple[ProbeSpec, ...],
                 tag: Tag | None, stop: Sequence[int], left: int, release: Callable[[], None] | None) -> None:
        self.ctx = ctx
        self.samples, self.probes, self.tag = samples, probes, tag
        self.stop = frozenset(stop)
        self.left = left
        self._release = release
        self._token: int | None = None  # what the last recorded pass sampled: the next pass's input
        self._queued: deque[_Queued] = deque()
        self._spare = ctx.kv.spare_pages  # empty pages the context held before the chain reserved any
        self._open = True
        ctx.holder.preempt = self.pause

    def landed(self, out: RequestOutput) -> None:
        """The chain's last pass was recorded with output ``out``: queue what follows it."""
        self._token = out.tokens[0][0]
        self._fill()

    async def next(self) -> list[RequestOutput]:
        """The next pass, and the ones after it that already landed, each recorded now: those
        run ahead, or, where none could, the next one run now.

        Raises:
            InvalidInput: The loop ended (its last pass sampled a stop token, or the inferlet
                said it expected no more passes).
        """
        token = self._token
        if token is None or token in self.stop or self.left <= 0:
            raise InvalidInput("this decode loop ended (a stop token, or the passes it announced with ahead= ran): "
                               "run the next pass with forward()")
        ctx = self.ctx
        if self._queued:
            item = self._queued.popleft()
            try:
                await item.future
            except asyncio.CancelledError:
                self.pause()
                raise
            except Exception:  # noqa: BLE001 - the pass runs again below and reports what recurs
                pass
            if self._record(item):
                return self._landed_too([item.future.result()])
            self.pause()  # it failed, or the context changed under it: what was queued after it is void
        ctx.check_live()
        async with ctx.lock:
            out = await run_pass(ctx.model, ctx.holder, self._pass(token, ctx.kv.length))
        self.left -= 1
        self.landed(out)
        return [out]

    def next_soon(self, done: Callable[[bool, Any], None]) -> Callable[[], None] | None:
        """:meth:`next` without a task when a pass is queued ahead: ``done(True, outputs)`` once
        it landed and was recorded (``done(False, error)`` if recording it is impossible and
        running it again fails). Returns what cancels the call (the pass is then not recorded
        and the chain pauses), or None, having done nothing, when :meth:`next` must run."""
        token = self._token
        if token is None or token in self.stop or self.left <= 0 or not self._queued:
            return None
        item = self._queued[0]
        cancelled = False

        def landed(future: asyncio.Future[RequestOutput]) -> None:
            if cancelled:
                return
            if self._queued and self._queued[0] is item:
                self._queued.popleft()
                if self._record(item):
                    done(True, self._landed_too([future.result()]))
                    return
                self.pause()  # what was queued after it is void
            task = asyncio.get_running_loop().create_task(self.next())  # it failed, or the context changed
            task.add_done_callback(lambda t: done(False, PieError("the host call was cancelled")) if t.cancelled()
                                   else done(t.exception() is None, t.exception() or t.result()))

        def cancel() -> None:
            nonlocal cancelled
            if not cancelled and not item.future.done():
                cancelled = True
                self.pause()
                done(False, PieError("the host call was cancelled"))

        item.future.add_done_callback(landed)
        return cancel

    def _record(self, item: _Queued, hold: int = 0) -> bool:
        """Record ``item``, a pass taken off the queue, if it landed well on the context as it
        is (the pages of the last ``hold`` tokens stay working); False (nothing recorded)
        otherwise."""
        f, kv = item.future, self.ctx.kv
        if (not f.done() or f.cancelled() or f.exception() is not None or not self._open or kv.released
                or not kv.resident or kv.length != item.slot):
            return False
        record(kv, item.work, hold)
        self.left -= 1
        self.landed(f.result())
        return True

    def _landed_too(self, outs: list[RequestOutput]) -> list[RequestOutput]:
        """``outs`` and the passes queued after them that landed already, recorded: an inferlet
        that fell behind catches up in one call. Their pages stay working until the next pass is
        recorded, so the SDK can truncate those its program never used. A landed pass that
        cannot be recorded voids the rest (the inferlet's next call runs it again)."""
        while self._queued and self._queued[0].future.done():
            item = self._queued.popleft()
            if not self._record(item, hold=len(outs)):
                self.pause()
                break
            outs.append(item.future.result())
        return outs

    def pause(self) -> None:
        """Drop the passes run ahead (queued ones leave their batch; pages they reserved go
        back); the chain goes on with the inferlet's next ``forward_next``. Safe in synchronous
        calls."""
        queued, self._queued = self._queued, deque()
        for item in queued:
            if not item.future.done():
                item.future.cancel()  # never sent if its batch has not fired; ignored if it has
        if queued:
            self.ctx.kv.release_spare(self._spare)

    def end(self) -> None:
        """End the loop now. Safe in synchronous calls."""
        if not self._open:
            return
        self._open = False
        self.pause()
        if self.ctx.holder.preempt == self.pause:
            self.ctx.holder.preempt = None
        release, self._release = self._release, None
        if release is not None:
            release()

    def _fill(self) -> None:
        """Queue passes until :data:`DEPTH` are ahead, each on the token the one before it
        sampled (so each waits for that one to land), within what the inferlet announced."""
        ctx = self.ctx
        while self._open and len(self._queued) < DEPTH:
            last = self._queued[-1] if self._queued else None
            token = self._token if last is None else last.token()
            slot = ctx.kv.length + len(self._queued)
            if (token is None or token in self.stop or len(self._queued) >= self.left or ctx.released
                    or slot >= ctx.model.spec.max_position):
                return
            work = self._pass(token, slot)
            future = queue_unrecorded(ctx.model, ctx.holder, work, slot)
            if future is None:  # its pages are not free now: forward_next runs it when asked
                return
            self._queued.append(_Queued(work, slot, future))
            future.add_done_callback(self._ahead_landed)

    def _ahead_landed(self, future: asyncio.Future[RequestOutput]) -> None:
        if self._open and self._queued and self._queued[-1].future is future:
            self._fill()

    def _pass(self, token: int, position: int) -> Pass:
        ids = np.array([token], dtype=np.int32)
        pos = np.array([position], dtype=np.int32)
        return Pass(ids, pos, None, self.samples, self.probes, 0, [], self.tag)


def decode_step(n: int, samples: Sequence[SampleSpec], probes: Sequence[ProbeSpec], drafts: int, masked: bool,
                out: RequestOutput) -> bool:
    """Whether a pass of ``n`` tokens is a decode step a chain can repeat: one sample of one
    draw on its last row, probes only there, no drafts or attention masks."""
    last = n - 1
    return (not drafts and not masked and len(samples) == 1 and bool(out.tokens) and samples[0].index == last
            and samples[0].draws == 1 and all(p.index == last for p in probes))
