"""Host interface ``inference``: one forward pass of a context, validated and batched."""

from __future__ import annotations

from typing import Sequence

from inferlet.host._declare import host
from inferlet.host.types import Adapter, Context, ProbeSpec, RequestOutput, SampleSpec

__all__ = ["forward"]


@host
async def forward(
    ctx: Context,
    tokens: Sequence[int],
    positions: Sequence[int] | None = None,
    attention_masks: Sequence[Sequence[int]] | None = None,
    logit_mask: Sequence[int] | None = None,
    samples: Sequence[SampleSpec] = (),
    probes: Sequence[ProbeSpec] = (),
    drafts: int = 0,
    adapter: Adapter | None = None,
    zo_seed: int = 0,
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
        drafts: How many trailing tokens are drafts to verify.
        adapter: An adapter handle of the same model to run the pass with; None = base weights.
        zo_seed: Nonzero: run the adapter's mean plus sigma times this seed's noise (the adapter
            must be set up with ``zo.initialize``); 0 = its mean.
        ahead: Run-ahead: how many more passes like this one the caller expects to run, each
            on the token its predecessor sampled (a decode loop). When this pass samples one
            row, the last, with one draw and reads no other row, the engine may start the next
            pass (that token, the next position, the same samples and probes) before it is
            asked, so the next step is computing while the caller handles this one. It is
            used only if the caller's next pass on the context is exactly that one; any other
            call on the context discards it first, so nothing the caller sees changes. 0: none.
        stop: Tokens that end the caller's loop: no pass runs ahead on one of them.

    Returns:
        Tokens per sample and values per probe, in the given order, as plain Python values
        (see :class:`~inferlet.host.types.RequestOutput`).

    Raises:
        InvalidInput: Any argument out of range; the message names it. Nothing is written.
        OutOfPages: The context alone needs more pages than the pool holds, or its user's page
            quota is reached. Nothing is written. (Under contention the pass waits instead:
            the KV-page market suspends and restores contexts, see :mod:`inferlet.scheduling`.)
        Unsupported: The backend did not declare a feature the pass needs.
    """
