"""Running one checked forward pass of a context: admission, replay, prefix adoption, chunks.

The host (``pie_core.host.inference``) checks arguments and capabilities and hands over a
:class:`Pass`; from there the scheduler owns it:

1. The market admits the context (:meth:`Market.admit`): it is made resident (restored from
   the host pool, or without its pages) with the pages the pass may write reserved.
2. A context restored without its pages is rebuilt by replaying its lineage from the slot the
   grant names.
3. Leading full pages found in the prefix cache are adopted instead of computed; where another
   pass is computing the next of them right now, this one waits for it to land and adopts them
   then, and it announces the full pages it computes itself for others to wait on.
4. The rest runs in chunks of at most ``max_batch_tokens`` through the batcher; each landed
   chunk is recorded in the context (with its mask and tag, for later replays).
5. Drafts are verified and the rejected ones dropped; pages the pass reserved and did not
   fill go back, also when it fails (then nothing of the failed chunk is recorded).

:func:`queue_unrecorded` queues a one-chunk pass without recording it, at or beyond the
context's length: its caller records it later (:func:`record`) or forgets it. Run-ahead
(``pie_core.host.ahead``) runs a context's next decode steps that way before the inferlet asks
for them.

The path is one-way: this module asks the context (:class:`KvContext`) for page counts and the
market for a grant, and reads nothing either leaves behind.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any, Sequence, TypeVar

import numpy as np

from pie_core.errors import PieError
from pie_core.kv.context import KvContext
from pie_core.scheduler.market import Holder
from pie_core.scheduler.request import ForwardRequest, ProbeSpec, RequestOutput, SampleSpec

__all__ = ["Tag", "Pass", "run_pass", "queue_unrecorded", "record", "tag_valid"]

_Spec = TypeVar("_Spec", SampleSpec, ProbeSpec)


@dataclass(frozen=True, slots=True)
class Tag:
    """What a pass ran under besides the base weights: an adapter (record) and zo seed.

    ``salt`` is the adapter's salt at the time; a replay is only exact while it is unchanged.
    """

    record: Any  # pie_core.adapters.store.AdapterRecord (compared by identity)
    zo_seed: int
    salt: bytes = field(compare=False)

    @property
    def adapter_id(self) -> int:
        adapter_id: int = self.record.id
        return adapter_id


def tag_valid(tag: Tag | None) -> bool:
    """A replay under ``tag`` computes what the original pass did."""
    return tag is None or (not tag.record.destroyed and tag.record.salt(tag.zo_seed) == tag.salt)


@dataclass(slots=True)
class Pass:
    """A checked pass: token ids, positions, mask rows, what to read, drafts to verify."""

    ids: np.ndarray
    pos: np.ndarray
    masks: np.ndarray | None = None
    samples: Sequence[SampleSpec] = ()
    probes: Sequence[ProbeSpec] = ()
    drafts: int = 0
    verifiers: list[int] = field(default_factory=list)  # the sample verifying each draft row
    tag: Tag | None = None


async def run_pass(model: Any, holder: Holder, p: Pass) -> RequestOutput:
    """Run ``p`` on ``holder``'s context (see the module doc). The caller holds the context's lock.

    Raises:
        OutOfPages: The context can never fit the pool (or its user's quota is reached).
        PieError: A replay is impossible (an adapter it used was released or changed).
        BackendError: The backend failed; nothing of the failed chunk is recorded.
    """
    kv = holder.kv
    spare = kv.spare_pages  # kept after the pass; those it reserves and leaves empty go back
    grant = await model.market.admit(holder, kv.pages_needed(len(p.ids)))
    first_draft = kv.length + len(p.ids) - p.drafts
    try:
        if grant.replay_from is not None:
            await _replay(model, kv, grant.replay_from)
        return await _run(model, kv, p)
    except BaseException:
        if p.drafts and not kv.released and kv.length > first_draft:  # drafts of landed chunks go
            kv.settle(kv.length - first_draft)
        raise
    finally:
        kv.release_spare(spare)
        model.market.done(holder)  # the context may move again


def queue_unrecorded(model: Any, holder: Holder, p: Pass, at: int) -> asyncio.Future[RequestOutput] | None:
    """Queue ``p`` (one chunk: no masks, no drafts) to write slots from ``at`` (at or beyond the
    context's length) without recording it, when the context is resident and the pages it needs
    are free now; None (nothing changed) otherwise.

    Its KV is written, but the context's length and lineage stay as they were: the caller
    records it (:func:`record`) or forgets it. The context is not pinned in the market: whoever
    may move it must drop such passes first (``Holder.preempt``). Cancelling the future before
    its batch fires takes the pass out of it.
    """
    kv = holder.kv
    if not model.market.reserve_now(holder, kv.pages_needed(len(p.ids), at)):
        return None
    plan = kv.plan_write(len(p.ids), at)
    queued: asyncio.Future[RequestOutput] = model.batcher.enqueue(
        _request(p, plan, p.ids, p.pos, tuple(p.samples), tuple(p.probes)))
    return queued


def record(kv: KvContext, p: Pass, hold: int = 0) -> None:
    """Record pass ``p`` (run by :func:`queue_unrecorded` at the context's length) as if it had
    just landed: its tokens join the lineage and the pages they fill commit, but for the pages
    holding the last ``hold`` tokens of the context, which stay working (truncatable)."""
    salt = b"" if p.tag is None else p.tag.salt
    kv.advance(p.ids.tolist(), p.pos.tolist(), None, hold, salt, p.tag)


async def _run(model: Any, kv: KvContext, p: Pass) -> RequestOutput:
    ids, pos, samples, probes, n = p.ids, p.pos, list(p.samples), list(p.probes), len(p.ids)
    salt = b"" if p.tag is None else p.tag.salt
    announced: list[bytes] = []
    if p.masks is None and n >= kv.page_size:
        rows = [s.index for s in samples] + [q.index for q in probes]
        done, keys = await _adopt(kv, ids, pos, min(rows, default=n), salt, p.tag)
        if done:  # those tokens' pages came from the prefix cache
            ids, pos, n = ids[done:], pos[done:], n - done
            samples = [_shift(s, done) for s in samples]
            probes = [_shift(q, done) for q in probes]
            if n == 0:
                return RequestOutput(tokens=(), probes=())
        announced = kv.pool.cache.announce(keys[: (n - p.drafts) // kv.page_size])  # pages of drafts stay working
    try:
        return await _chunks(model, kv, p, ids, pos, samples, probes, salt)
    finally:
        kv.pool.cache.landed(announced)


async def _adopt(kv: KvContext, ids: np.ndarray, pos: np.ndarray, limit: int, salt: bytes,
                 tag: Tag | None) -> tuple[int, list[bytes]]:
    """Adopt the cached leading pages; while another pass computes the next page this pass could
    adopt, wait for it to land and adopt again. How many tokens were adopted, and the keys of the
    full pages left to compute."""
    done = 0
    while True:
        keys = kv.prefix_keys(ids[done:], pos[done:], salt)
        got = kv.adopt_prefix(ids[done:], pos[done:], limit - done, salt, tag, keys)
        done, keys = done + got, keys[got // kv.page_size :]
        landing = kv.pool.cache.computing(keys[0]) if keys and limit - done >= kv.page_size else None
        if landing is None:
            return done, keys
        kv.pool.cache.waits += 1
        await landing.wait()


async def _chunks(model: Any, kv: KvContext, p: Pass, ids: np.ndarray, pos: np.ndarray, samples: list[SampleSpec],
                  probes: list[ProbeSpec], salt: bytes) -> RequestOutput:
    n = len(ids)
    step = model.caps.max_batch_tokens
    outputs, order = [], []
    for start in range(0, n, step):
        stop = min(n, start + step)
        kept = [i for i, s in enumerate(samples) if start <= s.index < stop]
        chunk_samples = tuple(_shift(samples[i], start) for i in kept)
        chunk_probes = tuple(_remask(_shift(q, start), kept) for q in probes if start <= q.index < stop)
        plan = kv.plan_write(stop - start)
        out = await model.batcher.submit(_request(p, plan, ids[start:stop], pos[start:stop], chunk_samples, chunk_probes))
        hold = max(0, stop - (n - p.drafts))
        kv.advance(ids[start:stop].tolist(), pos[start:stop].tolist(), p.masks, hold, salt, p.tag)
        outputs.append(out)
        order.extend(kept)
    out = RequestOutput(tokens=tuple(t for o in outputs for t in o.tokens), probes=tuple(q for o in outputs for q in o.probes))
    if p.drafts:
        out = replace(out, drafts_kept=_verify(out, order, p.verifiers, ids[n - p.drafts :]))
        kv.settle(p.drafts - out.drafts_kept)
    return out


def _request(p: Pass, plan: Any, ids: np.ndarray, pos: np.ndarray, samples: tuple[SampleSpec, ...],
             probes: tuple[ProbeSpec, ...]) -> ForwardRequest:
    return ForwardRequest(
        token_ids=ids,
        positions=pos,
        page_ids=plan.page_ids,
        last_page_len=plan.last_page_len,
        write_slots=plan.write_slots,
        attention_mask=p.masks,
        samples=samples,
        probes=probes,
        adapter_id=-1 if p.tag is None else p.tag.adapter_id,
        zo_seed=0 if p.tag is None else p.tag.zo_seed,
    )


async def _replay(model: Any, kv: KvContext, start: int) -> None:
    """Recompute slots ``[start, length)`` from the lineage (no samples, nothing recorded)."""
    for step in kv.replay(start, model.caps.max_batch_tokens):
        tag = step.run.tag
        if not tag_valid(tag):
            raise PieError(
                "this context was suspended and cannot be rebuilt: an adapter it ran under was released or "
                "updated since; keep the adapter (or run the context on the host pool: --host-pages)"
            )
        await model.batcher.submit(
            ForwardRequest(
                token_ids=step.token_ids,
                positions=step.positions,
                page_ids=step.plan.page_ids,
                last_page_len=step.plan.last_page_len,
                write_slots=step.plan.write_slots,
                attention_mask=step.run.mask_rows(),
                adapter_id=-1 if tag is None else tag.adapter_id,
                zo_seed=0 if tag is None else tag.zo_seed,
            )
        )
    kv.replayed()


def _verify(out: RequestOutput, order: list[int], verifiers: list[int], drafts: np.ndarray) -> int:
    """How many leading drafts equal the token sampled at the row before each."""
    where = {sample: i for i, sample in enumerate(order)}
    kept = 0
    for i, draft in enumerate(drafts.tolist()):
        if out.tokens[where[verifiers[i]]][0] != draft:
            break
        kept += 1
    return kept


def _shift(spec: _Spec, start: int) -> _Spec:
    return replace(spec, index=spec.index - start) if start else spec


def _remask(spec: ProbeSpec, kept: list[int]) -> ProbeSpec:
    """Renumber ``masked_by`` (an index into the pass's samples) for a chunk that keeps ``kept``."""
    if spec.masked_by < 0:
        return spec
    return replace(spec, masked_by=kept.index(spec.masked_by) if spec.masked_by in kept else -1)
