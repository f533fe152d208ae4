"""Host interface ``inference``: one forward pass of a context, validated and batched."""

from __future__ import annotations

from typing import Annotated, Sequence

from inferlet.host._declare import host
from inferlet.host.types import S64, Adapter, Context, IntRange, ProbeSpec, RequestOutput, SampleSpec

__all__ = ["forward", "forward_next", "DRAFTS_PER_PASS"]

DRAFTS_PER_PASS = 64
"""Drafts one pass may verify. Each draft row is sampled over the whole vocabulary, so drafts are
what a pass costs beyond its tokens (10,000 of them once held 13 GB and 30 s of a server); 64 is
four times what the SDK's generator verifies per step. The engine also holds it below the
backend's sampled rows and tokens per chunk."""


@host
async def forward(
    ctx: Context,
    tokens: Sequence[int],
    positions: Sequence[int] | None = None,
    attention_masks: Sequence[Sequence[int]] | None = None,
    logit_mask: Sequence[int] | None = None,
    samples: Sequence[SampleSpec] = (),
    probes: Sequence[ProbeSpec] = (),
    drafts: Annotated[int, IntRange("u32", 0, DRAFTS_PER_PASS + 1)] = 0,
    adapter: Adapter | None = None,
    zo_seed: S64 = 0,
    ahead: int = 0,
    stop: Sequence[int] = (),
) -> RequestOutput:
    """Append ``tokens`` to the context's KV cache and read samples/probes at their rows.

    With ``drafts = k > 0`` the last ``k`` tokens are speculative drafts, verified in this
    pass: every row from the last non-draft token ``n - k - 1`` to ``n - 1`` must be sampled
    (its first sample row, one draw). Draft ``i`` is kept when it equals the token sampled at
    the row before it and every earlier draft was kept; the rest are dropped from the KV
    cache before this call returns (their pages were never committed or shared), and
    ``drafts_kept`` in the result says how many were kept.

    Args:
        ctx: The context; one pass runs on it at a time (later calls wait).
        tokens: Input token ids, ``0 <= id < vocab_size``.
        positions: RoPE positions, one per token, ``>= 0`` and distinct; None = continue from
            ``seq_len``.
        attention_masks: One BRLE row per input token over the KV length after this pass
            (true = attend); None = causal.
        logit_mask: BRLE over the vocabulary applied at every sampled row (true = allowed).
        samples: Sampled rows (``index`` into ``tokens``); a row's own ``logit_mask`` is the
            vocabulary packed 8 tokens per byte, little bit order (``bytes``).
        probes: Probed rows.
        drafts: How many trailing tokens are drafts to verify: at most :data:`DRAFTS_PER_PASS`,
            and fewer where the backend samples fewer rows per chunk.
        adapter: An adapter handle of the same model to run the pass with; None = base weights.
        zo_seed: Nonzero: run the adapter's mean plus sigma times this seed's noise (the adapter
            must be set up with ``zo.initialize``); 0 = its mean.
        ahead: Start a decode loop of ``ahead`` more passes like this one, each on the token
            its predecessor sampled, at the next position, with the same samples and probes
            (take them with :func:`forward_next`). The engine runs each one ahead, as soon as
            its predecessor landed, so it computes while the caller handles the last output.
            Only a pass that samples one row, its last, with one draw and probes only that row
            starts a loop. Any other pass on the context, and any call that changes its pages
            or length, ends the loop; a pass run ahead that nobody took is dropped unseen.
            0: no loop.
        stop: Tokens that end the loop: no pass runs after one.

    Returns:
        Tokens per sample and values per probe, in the given order, as plain Python values
        (see :class:`~inferlet.host.types.RequestOutput`).

    Raises:
        InvalidInput: Any argument out of range (drafts included: checked before any work);
            the message names it. Nothing is written.
        OutOfPages: The context alone needs more pages than the pool holds, or its user's page
            quota is reached. Nothing is written. (Under contention the pass waits instead:
            the KV-page market suspends and restores contexts, see :mod:`inferlet.scheduling`.)
        Unsupported: The backend did not declare a feature the pass needs.
    """


@host
async def forward_next(ctx: Context) -> list[RequestOutput]:
    """The next pass of the decode loop that ``forward(..., ahead=n)`` started on ``ctx`` (the
    token the loop's last pass sampled, at the next position, with the same samples and probes),
    then every pass after it that the engine ran already, in order. Usually the next one has
    run already (run-ahead); all that this returns is recorded in the context now, so a caller
    that uses fewer of them must truncate the rest (``context.truncate``) before anything else.

    Raises:
        InvalidInput: No loop runs on the context (none was started, another call ended it, or
            its last pass sampled a stop token or was the last it announced).
    """
