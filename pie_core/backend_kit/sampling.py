"""Reference semantics of the samplers and probes of the backend contract, in pure numpy.

Every backend must produce what these functions produce (up to floating-point noise); the NumPy
backend and the dummy backend call them directly. The input is the float32 logits of the batch
rows that are sampled or probed; the output is a :class:`~pie_core.hookspec.BatchOutput`.

Sampling (per sample row, :class:`~pie_core.hookspec.SamplerKind`):

- The row's logit mask (if any) sets disallowed tokens to ``-inf`` first.
- ``ARGMAX``, or any kind with ``temperature <= 0``: the highest logit (lowest id on ties),
  repeated ``draws`` times.
- Otherwise ``p = softmax(logits / temperature)`` and the kind keeps a support:
  ``TOP_K`` the ``k`` most probable tokens (``k <= 0`` or ``k >= vocab``: all);
  ``TOP_P`` the smallest most-probable-first set whose cumulative probability reaches ``p``
  (at least one token); ``MIN_P`` every token with ``p >= min_p * max(p)``;
  ``TOP_K_TOP_P`` the top-``k`` set, renormalised, then nucleus ``p`` inside it;
  ``MULTINOMIAL`` the whole vocabulary.
- ``draws`` tokens are drawn independently from ``p`` restricted to the support and
  renormalised, by inverse CDF over the support in ascending token order. Seed 0 takes fresh
  randomness; any other seed draws from ``numpy.random.Generator(PCG64(seed))``, so equal
  logits and seed give equal tokens.

Probes (per probe row, :class:`~pie_core.hookspec.ProbeKind`), on the row's logits after the
logit mask of sample row ``probe_masked`` when that is ``>= 0``:

- ``LOGITS``: the float32 logits row (masked entries ``-inf``).
- ``DISTRIBUTION``: ``softmax(logits / temperature)``'s top ``k`` (``k <= 0``: all) ids and
  probabilities, descending (lower id first on ties); ``temperature <= 0`` is the one-hot
  distribution at the argmax.
- ``LOGPROBS``: ``log_softmax(logits)`` at the requested ids, in their order.
- ``ENTROPY``: ``-sum p log p`` of ``softmax(logits)`` in nats (``0 log 0 = 0``).
- ``EMBEDDING``: not a function of the logits: the row's final hidden state (after the final
  norm), which the backend computes for the rows of :func:`hidden_rows` and passes in.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pie_core.hookspec import BatchOutput, ForwardBatch, ProbeKind, SamplerKind

__all__ = [
    "logit_rows",
    "hidden_rows",
    "unpack_logit_masks",
    "softmax",
    "sample",
    "probe",
    "sample_and_probe",
]

_NUCLEUS_FIRST_CANDIDATES = 256


def logit_rows(batch: ForwardBatch) -> np.ndarray:
    """The sorted, distinct input-token indices whose logits the batch needs.

    Args:
        batch: The forward batch.

    Returns:
        int64 indices into the batch's N tokens: every sample row and every probe row that
        reads logits (all kinds but EMBEDDING), once.
    """
    reads_logits = batch.probe_kind != ProbeKind.EMBEDDING
    rows = np.concatenate([batch.sample_rows.astype(np.int64), batch.probe_rows[reads_logits].astype(np.int64)])
    return np.unique(rows)


def hidden_rows(batch: ForwardBatch) -> np.ndarray:
    """The sorted, distinct input-token indices whose final hidden state the batch needs.

    Returns:
        int64 indices into the batch's N tokens: every EMBEDDING probe row, once.
    """
    return np.unique(batch.probe_rows[batch.probe_kind == ProbeKind.EMBEDDING].astype(np.int64))


def unpack_logit_masks(packed: np.ndarray, vocab_size: int) -> np.ndarray:
    """Unpack ``uint8[S, ceil(vocab/8)]`` little-bit-order masks into ``bool[S, vocab]``.

    Raises:
        ValueError: The packed width does not match the vocabulary.
    """
    width = (vocab_size + 7) // 8
    if packed.ndim != 2 or packed.shape[1] != width:
        raise ValueError(
            f"logit_masks must be uint8[S, {width}] for a vocabulary of {vocab_size}, "
            f"got shape {packed.shape}"
        )
    return np.unpackbits(packed, axis=1, count=vocab_size, bitorder="little").astype(bool)


def softmax(
    logits: np.ndarray, temperature: float | np.ndarray = 1.0, dtype: type = np.float64
) -> np.ndarray:
    """Row-wise ``softmax(logits / temperature)`` (``-inf`` entries get 0).

    Args:
        logits: float array ``[..., vocab]``; at least one finite entry per row.
        temperature: Positive scalar, or one per row (shape ``[...]``).
        dtype: Precision of the computation and result (samplers use float32 for speed,
            probes float64).
    """
    t: np.ndarray = np.asarray(temperature, dtype=dtype)
    scaled = np.asarray(logits, dtype=dtype) / (t[..., None] if t.ndim else t)
    scaled -= scaled.max(axis=-1, keepdims=True)
    e = np.exp(scaled, out=scaled)
    e /= e.sum(axis=-1, keepdims=True, dtype=np.float64).astype(dtype)
    return e


def _top_k_ids(p: np.ndarray, k: int) -> np.ndarray:
    """Ascending ids of the ``k`` largest entries of ``p`` (lower ids win ties at the cut)."""
    vocab = p.shape[0]
    if k >= vocab:
        return np.arange(vocab)
    cut = np.partition(p, vocab - k)[vocab - k]
    keep = p > cut
    missing = k - int(np.count_nonzero(keep))
    if missing:
        keep[np.flatnonzero(p == cut)[:missing]] = True
    return np.flatnonzero(keep)


def _descending(p: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``ids`` ordered by descending ``p`` (lower id first on ties)."""
    return ids[np.lexsort((ids, -p[ids]))]


def _nucleus_size(p: np.ndarray, top_p: float) -> int:
    """Size of the smallest most-probable-first set whose probability reaches ``top_p``.

    Tries the few hundred largest values first (enough for peaked distributions), then sorts all.
    """
    vocab = p.shape[0]
    target = top_p * p.sum(dtype=np.float64)
    n = _NUCLEUS_FIRST_CANDIDATES
    if n < vocab:
        top = np.partition(p, vocab - n)[vocab - n :]
        cum = np.cumsum(np.sort(top)[::-1], dtype=np.float64)
        if cum[-1] >= target:
            return int(np.searchsorted(cum, target, side="left")) + 1
    cum = np.cumsum(np.sort(p)[::-1], dtype=np.float64)
    return min(int(np.searchsorted(cum, target, side="left")) + 1, vocab)


def _support(kind: int, p: np.ndarray, top_k: int, top_p: float, min_p: float) -> np.ndarray:
    """Token ids a stochastic sampler may draw from ``p``, ascending."""
    vocab = p.shape[0]
    k = int(top_k) if 0 < top_k < vocab else vocab
    if kind == SamplerKind.TOP_K:
        return _top_k_ids(p, k)
    if kind == SamplerKind.TOP_P:
        return _top_k_ids(p, _nucleus_size(p, float(top_p)))
    if kind == SamplerKind.TOP_K_TOP_P:
        top = _top_k_ids(p, k)
        return top[_top_k_ids(p[top], _nucleus_size(p[top], float(top_p)))]
    if kind == SamplerKind.MIN_P:
        return np.flatnonzero(p >= float(min_p) * p.max())
    if kind == SamplerKind.MULTINOMIAL:
        return np.flatnonzero(p > 0)
    raise ValueError(f"unknown sampler kind {kind}; expected one of {[int(k) for k in SamplerKind]}")


def _draw(p: np.ndarray, ids: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Inverse-CDF draws from ``p[ids]`` renormalised (never a zero-probability id)."""
    w = p[ids]
    cum = np.cumsum(w, dtype=np.float64)
    picks = np.searchsorted(cum, uniforms * cum[-1], side="right")
    last = int(np.flatnonzero(w > 0)[-1])
    return ids[np.minimum(picks, last)]


def sample(
    logits: np.ndarray,
    kind: np.ndarray,
    temperature: np.ndarray,
    top_k: np.ndarray,
    top_p: np.ndarray,
    min_p: np.ndarray,
    draws: np.ndarray,
    seeds: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """Sample tokens from already-masked logits, one group of ``draws[s]`` per row.

    Args:
        logits: float ``[S, vocab]``, disallowed tokens already ``-inf``.
        kind, temperature, top_k, top_p, min_p, draws, seeds: Per-row sampler parameters as
            in :class:`~pie_core.hookspec.ForwardBatch`.
        rng: Source of fresh randomness for rows with seed 0.

    Returns:
        int32 ``[sum(draws)]``: row ``s``'s tokens are consecutive, in row order.

    Raises:
        ValueError: A row allows no token, or a sampler kind is unknown.
    """
    num_rows = logits.shape[0]
    draws = np.asarray(draws, dtype=np.int64)
    if num_rows == 0:
        return np.zeros(0, dtype=np.int32)
    if (draws < 0).any():
        raise ValueError(f"draws must be >= 0, got {int(draws.min())}")
    finite = np.isfinite(logits).any(axis=1)
    if not finite.all():
        raise ValueError(f"sample row {int(np.flatnonzero(~finite)[0])} allows no token (all logits masked)")
    greedy = (np.asarray(kind) == SamplerKind.ARGMAX) | (np.asarray(temperature) <= 0)
    best = np.argmax(logits, axis=1)
    out = np.repeat(best, draws)
    starts = np.concatenate([[0], np.cumsum(draws)[:-1]])
    stochastic = np.flatnonzero(~greedy)
    if stochastic.size:
        probs = softmax(logits[stochastic], np.asarray(temperature)[stochastic], dtype=np.float32)
        for j, s in enumerate(stochastic):
            ids = _support(int(kind[s]), probs[j], int(top_k[s]), float(top_p[s]), float(min_p[s]))
            seed = int(seeds[s])
            gen = rng if seed == 0 else np.random.Generator(np.random.PCG64(seed))
            u = gen.random(int(draws[s]))
            out[starts[s] : starts[s] + draws[s]] = _draw(probs[j], ids, u)
    return out.astype(np.int32)


def _probe_one(kind: int, row: np.ndarray, temperature: float, k: int, ids: np.ndarray) -> Any:
    if kind == ProbeKind.LOGITS:
        return row.astype(np.float32, copy=True)
    if kind == ProbeKind.DISTRIBUTION:
        if temperature > 0:
            p = softmax(row, float(temperature))
        else:
            p = np.zeros(row.shape[0])
            p[int(np.argmax(row))] = 1.0
        top = _descending(p, _top_k_ids(p, k if 0 < k < p.shape[0] else p.shape[0]))
        return top.astype(np.int32), p[top].astype(np.float32)
    if kind == ProbeKind.LOGPROBS:
        x = row.astype(np.float64)
        m = x.max()
        logz = m + np.log(np.exp(x - m).sum())
        return (x[ids.astype(np.int64)] - logz).astype(np.float32)
    if kind == ProbeKind.ENTROPY:
        p = softmax(row)
        nz = p[p > 0]
        return float(-(nz * np.log(nz)).sum())
    if kind == ProbeKind.EMBEDDING:
        raise ValueError("EMBEDDING probes read hidden states, not logits: use sample_and_probe(hidden=...)")
    raise ValueError(f"unknown probe kind {kind}; expected one of {[int(k) for k in ProbeKind]}")


def probe(
    logits: np.ndarray,
    kind: np.ndarray,
    temperature: np.ndarray,
    k: np.ndarray,
    token_ids: np.ndarray,
    token_indptr: np.ndarray,
) -> tuple[Any, ...]:
    """Evaluate probe rows on already-masked logits.

    Args:
        logits: float ``[Q, vocab]``.
        kind, temperature, k, token_ids, token_indptr: Per-row probe parameters as in
            :class:`~pie_core.hookspec.ForwardBatch`.

    Returns:
        One value per row, typed as :class:`~pie_core.hookspec.BatchOutput` documents.
    """
    return tuple(
        _probe_one(
            int(kind[q]),
            logits[q],
            float(temperature[q]),
            int(k[q]),
            token_ids[token_indptr[q] : token_indptr[q + 1]],
        )
        for q in range(logits.shape[0])
    )


def sample_and_probe(
    batch: ForwardBatch,
    rows: np.ndarray,
    logits: np.ndarray,
    rng: np.random.Generator,
    hidden: np.ndarray | None = None,
) -> BatchOutput:
    """Turn the logits (and hidden states) of the needed rows into the batch's output.

    Args:
        batch: The forward batch.
        rows: Sorted token indices, as returned by :func:`logit_rows`.
        logits: float32 ``[len(rows), vocab]``, raw logits of those tokens.
        rng: Source of fresh randomness for rows with seed 0.
        hidden: float32 ``[len(hidden_rows(batch)), hidden_size]``, the final hidden states
            (after the final norm) of the rows :func:`hidden_rows` lists; needed only when the
            batch has EMBEDDING probes.

    Returns:
        Sampled tokens and probe values.

    Raises:
        ValueError: The batch has EMBEDDING probes and ``hidden`` does not cover them.
    """
    vocab = logits.shape[1]
    masks = None if batch.logit_masks is None else unpack_logit_masks(batch.logit_masks, vocab)
    at = np.searchsorted(rows, batch.sample_rows)
    s_logits = logits[at]
    if masks is not None:
        s_logits = np.where(masks, s_logits, np.float32(-np.inf))
    tokens = sample(
        s_logits,
        batch.sampler_kind,
        batch.temperature,
        batch.top_k,
        batch.top_p,
        batch.min_p,
        batch.draws,
        batch.seeds,
        rng,
    )
    if len(batch.probe_rows) == 0:
        return BatchOutput(tokens=tokens)
    is_embedding = batch.probe_kind == ProbeKind.EMBEDDING
    if not is_embedding.any():
        return BatchOutput(tokens=tokens, probes=_logit_probes(batch, rows, logits, masks))
    values: list[Any] = [None] * len(batch.probe_rows)
    on_logits = np.flatnonzero(~is_embedding)
    if on_logits.size:
        for q, value in zip(on_logits, _logit_probes(batch, rows, logits, masks, on_logits)):
            values[q] = value
    wanted = hidden_rows(batch)
    if hidden is None or hidden.shape[0] != len(wanted):
        got = "none" if hidden is None else f"{hidden.shape[0]} rows"
        raise ValueError(f"EMBEDDING probes need the hidden states of rows {wanted.tolist()}, got {got}")
    embedded = np.flatnonzero(is_embedding)
    at = np.searchsorted(wanted, batch.probe_rows[embedded])
    for q, i in zip(embedded, at):
        values[q] = np.array(hidden[i], dtype=np.float32)
    return BatchOutput(tokens=tokens, probes=tuple(values))


def _logit_probes(
    batch: ForwardBatch,
    rows: np.ndarray,
    logits: np.ndarray,
    masks: np.ndarray | None,
    select: np.ndarray | None = None,
) -> tuple[Any, ...]:
    """Values of the probe rows ``select`` (default: all) that read logits, in their order."""
    q = np.arange(len(batch.probe_rows)) if select is None else select
    p_logits = logits[np.searchsorted(rows, batch.probe_rows[q])]
    masked = np.asarray(batch.probe_masked)[q]
    if masks is not None and (masked >= 0).any():
        sel = np.flatnonzero(masked >= 0)
        p_logits[sel] = np.where(masks[masked[sel]], p_logits[sel], np.float32(-np.inf))
    ids, indptr = batch.probe_token_ids, batch.probe_token_indptr
    if select is not None:  # the token-id lists of the selected rows only
        lo, hi = indptr[q], indptr[q + 1]
        ids = np.concatenate([ids[a:b] for a, b in zip(lo, hi)]) if len(q) else ids[:0]
        indptr = np.concatenate([[0], np.cumsum(hi - lo)])
    return probe(p_logits, batch.probe_kind[q], batch.probe_temperature[q], batch.probe_k[q], ids, indptr)
