"""Every probe kind against its definition, on the backend's own logits.

The definitions (``pie_core.hookspec.ProbeKind``) are written out below in a few lines of NumPy,
not imported from any backend's code: DISTRIBUTION is the top ``k`` of ``softmax(logits / T)``
(one-hot at the argmax for ``T = 0``), listed by descending probability with the lower id first
among equal ones; LOGPROBS is ``log_softmax(logits)`` at the ids; ENTROPY ``-sum p log p`` of
``softmax(logits)``. Temperatures are 0, 0.7 and 1.5, never only 1, and ties are exact (twin
tokens, :mod:`conformance.ties`).

The cases iterate over :class:`~pie_core.hookspec.ProbeKind`, so a kind added to the contract
shows up here at once: gated on its feature (``"embeddings"`` for EMBEDDING, ``"probes"`` for
the rest), and "not supported" until the suite has a check for it.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

from pie_core.hookspec import ProbeKind
from pie_core.scheduler.request import ForwardRequest, ProbeSpec

from conformance.batches import kv_request
from conformance.harness import Harness
from conformance.loaded import LoadedModel, Run, not_supported
from conformance.ties import tie_at_rank

SURFACE = "probes"

_FEATURE = {"EMBEDDING": "embeddings"}  # every other kind needs "probes"


def _softmax(z: np.ndarray, t: float = 1.0) -> np.ndarray:
    e = np.exp(z / t - np.max(z / t))
    return e / e.sum()


def _log_softmax(z: np.ndarray) -> np.ndarray:
    return z - (z.max() + np.log(np.exp(z - z.max()).sum()))


def _entropy(z: np.ndarray) -> float:
    p = _softmax(z)
    return float(-(p[p > 0] * np.log(p[p > 0])).sum())


def _ranked(p: np.ndarray) -> np.ndarray:
    """Ids by descending ``p``, the lower id first among equal values."""
    return np.lexsort((np.arange(len(p)), -p))


def _variants(kind: ProbeKind, vocab: int) -> list[dict[str, Any]]:
    if kind == ProbeKind.DISTRIBUTION:
        return [{"temperature": 0.7, "k": 5}, {"temperature": 0.0, "k": 3}, {"temperature": 1.5, "k": 0}]
    if kind == ProbeKind.LOGPROBS:
        return [{"token_ids": (3, 0, vocab - 1, 3)}, {"token_ids": ()}]
    return [{}]


def _expected(kind: ProbeKind, row: np.ndarray, v: dict[str, Any]) -> Any:
    if kind == ProbeKind.LOGITS:
        return row
    if kind == ProbeKind.LOGPROBS:
        return _log_softmax(row)[list(v["token_ids"])]
    if kind == ProbeKind.ENTROPY:
        return _entropy(row)
    raise KeyError(kind)


def _check_ties_lower_first(ids: np.ndarray, row: np.ndarray, where: str) -> None:
    """Every listed id comes after every lower id whose logit equals its own."""
    listed: set[int] = set()
    for i in (int(x) for x in ids):
        equal_lower = np.flatnonzero((row == row[i]) & (np.arange(len(row)) < i))
        missing = sorted(set(equal_lower.tolist()) - listed)
        assert not missing, f"{where}: token {i} is listed before (or instead of) {missing}, tied with it and lower"
        listed.add(i)


def _check_distribution(model: LoadedModel, got: Any, row: np.ndarray, v: dict[str, Any], where: str) -> None:
    ids, probs = (np.asarray(x) for x in got)
    k = v["k"] if 0 < v["k"] < model.vocab else model.vocab
    assert ids.shape == probs.shape == (k,), (
        f"{where}: expected {k} ids and probabilities, got {ids.shape} and {probs.shape}"
    )
    if v["temperature"] == 0:  # one-hot at the argmax; the other k - 1 are zeros, tied: lowest ids
        want = _ranked((np.arange(model.vocab) == np.argmax(row)).astype(np.float64))[:k]
        assert ids.tolist() == want.tolist(), f"{where}: ids {ids.tolist()}, expected {want.tolist()}"
        assert probs.tolist() == [1.0] + [0.0] * (k - 1), f"{where}: probabilities {probs.tolist()}"
        return
    full = _softmax(row, v["temperature"])
    tol = model.tolerance
    assert not tol.bad(probs, full[ids]).any(), f"{where}: probabilities differ from softmax(logits / T) at those ids"
    assert (np.diff(probs) <= tol.atol).all(), f"{where}: probabilities are not in descending order"
    rest = np.setdiff1d(np.arange(model.vocab), ids)
    if rest.size:
        assert full[rest].max() <= probs.min() + tol.atol, f"{where}: a token outside the top {k} is more probable"
    _check_ties_lower_first(ids, row, where)


def _check_close(model: LoadedModel, got: Any, want: Any, where: str) -> None:
    got_a, want_a = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got_a.shape == want_a.shape, f"{where}: value of shape {got_a.shape}, expected {want_a.shape}"
    bad = model.tolerance.bad(got_a, want_a)
    assert not bad.any(), f"{where}: {got_a[bad][:4].tolist()} where the definition gives {want_a[bad][:4].tolist()}"


def _run_probes(
    model: LoadedModel, kind: ProbeKind, rng: np.random.Generator
) -> tuple[ForwardRequest, Run, list[dict[str, Any]]]:
    prompt = rng.integers(0, model.vocab, 6)
    variants = _variants(kind, model.vocab)
    probes = tuple(ProbeSpec(index=i, kind=kind, **v) for i in (5, 2) for v in variants)
    req = kv_request(prompt, model.pages_for(len(prompt)), model.page_size, probes=probes)
    return req, model.run([req]), variants


def _logit_kind(model: LoadedModel, kind: ProbeKind, rng: np.random.Generator) -> None:
    req, run, variants = _run_probes(model, kind, rng)
    logits = model.own_logits(run)[0].astype(np.float64)
    values = iter(run.probes[0])
    for row in (5, 2):
        for v in variants:
            got, where = next(values), f"{kind.name} {v} at row {row}"
            if kind == ProbeKind.DISTRIBUTION:
                _check_distribution(model, got, logits[row], v, where)
            elif kind == ProbeKind.ENTROPY:
                assert np.ndim(got) == 0, f"{where}: ENTROPY is one float, got shape {np.shape(got)}"
                _check_close(model, float(got), _expected(kind, logits[row], v), where)
            else:
                _check_close(model, got, _expected(kind, logits[row], v), where)
    if kind == ProbeKind.LOGITS and model.reference is not None:
        ref = model.reference.run([req])
        for i, row in enumerate((5, 2)):
            assert ref.logits is not None
            _check_close(model, run.probes[0][i], ref.logits[0][row], f"LOGITS at row {row} vs the float64 oracle")


def _embedding(model: LoadedModel, kind: ProbeKind, rng: np.random.Generator) -> None:
    req, run, _ = _run_probes(model, kind, rng)
    hidden = model.spec.hidden_size
    for got, row in zip(run.probes[0], (5, 2)):
        arr = np.asarray(got)
        assert arr.shape == (hidden,), f"EMBEDDING at row {row} has shape {arr.shape}, expected ({hidden},)"
        assert np.isfinite(arr).all(), f"EMBEDDING at row {row} is not finite"
    if model.reference is not None:
        ref = model.reference.run([req])
        for got, want, row in zip(run.probes[0], ref.probes[0], (5, 2)):
            _check_close(model, got, want, f"EMBEDDING at row {row} vs the float64 oracle")
    else:
        again = model.run([kv_request(req.token_ids, model.pages_for(len(req.token_ids)), model.page_size, probes=req.probes)])
        for a, b in zip(run.probes[0], again.probes[0]):
            _check_close(model, a, b, "EMBEDDING of the same input twice")


_CHECKS: dict[str, Callable[[LoadedModel, ProbeKind, np.random.Generator], None]] = {
    "LOGITS": _logit_kind,
    "DISTRIBUTION": _logit_kind,
    "LOGPROBS": _logit_kind,
    "ENTROPY": _logit_kind,
    "EMBEDDING": _embedding,
}


@pytest.mark.parametrize("kind", list(ProbeKind), ids=lambda k: k.name.lower())
def test_probe_follows_its_definition(model: LoadedModel, rng: np.random.Generator, kind: ProbeKind) -> None:
    model.require(_FEATURE.get(kind.name, "probes"))
    check = _CHECKS.get(kind.name)
    if check is None:
        not_supported(f"this suite version has no check for ProbeKind.{kind.name}")
    check(model, kind, rng)


def test_probes_come_back_in_row_order(model: LoadedModel, rng: np.random.Generator) -> None:
    model.require("probes")
    prompt = rng.integers(0, model.vocab, 5)
    rows = (4, 0, 2, 4)
    probes = tuple(ProbeSpec(index=i, kind=ProbeKind.LOGITS) for i in rows)
    run = model.run([kv_request(prompt, model.pages_for(len(prompt)), model.page_size, probes=probes)])
    assert run.logits is not None
    for value, row in zip(run.probes[0], rows):
        _check_close(model, value, run.logits[0][row], f"LOGITS probe of row {row} (probes at rows {rows})")


def test_probes_of_several_requests_stay_with_their_request(model: LoadedModel, rng: np.random.Generator) -> None:
    model.require("probes")
    prompts = [rng.integers(0, model.vocab, n) for n in (3, 1, 4)]
    reqs = [
        kv_request(t, model.pages_for(len(t)), model.page_size, probes=(ProbeSpec(index=len(t) - 1, kind=ProbeKind.ENTROPY),))
        for t in prompts
    ]
    run = model.run(reqs)
    assert run.logits is not None
    for r, (value, logits) in enumerate(zip(run.probes, run.logits)):
        want = _entropy(logits[-1].astype(np.float64))
        _check_close(model, float(value[0]), want, f"ENTROPY probe of request {r}")


@pytest.mark.parametrize("temperature", [0.7, 1.5])
def test_distribution_lists_tied_tokens_lower_id_first(
    pie_conformance: Harness, rng: np.random.Generator, temperature: float
) -> None:
    pie_conformance.model().require("probes")
    tie = tie_at_rank(pie_conformance, rng, rank=2)
    ks = (3, 4, 0)  # the cut inside the tie, just after it, and the whole vocabulary
    probes = tuple(ProbeSpec(index=len(tie.prompt) - 1, kind=ProbeKind.DISTRIBUTION, temperature=temperature, k=k) for k in ks)
    run = tie.model.run([tie.request(probes=probes)])
    p = _softmax(tie.logits, temperature)
    for (ids, probs), k in zip(run.probes[0], ks):
        ids, where = np.asarray(ids), f"DISTRIBUTION(T={temperature}, k={k}) with {tie.low} and {tie.high} tied at ranks 2, 3"
        assert ids[2] == tie.low, f"{where}: rank 2 is token {int(ids[2])}; the tie keeps the lower id {tie.low} first"
        if k != 3:
            assert ids[3] == tie.high, f"{where}: rank 3 is token {int(ids[3])}, not the twin {tie.high}"
            assert probs[2] == probs[3], f"{where}: the twins got probabilities {probs[2:4].tolist()}"
        assert not tie.model.tolerance.bad(np.asarray(probs), p[ids]).any(), f"{where}: probabilities {probs[:4]}"
        _check_distribution(tie.model, (ids, probs), tie.logits, {"temperature": temperature, "k": k}, where)
