"""Every probe kind against its definition (``pie_core.backend_kit.sampling``), on the backend's own logits.

The cases iterate over :class:`~pie_core.hookspec.ProbeKind`, so a kind added to the contract
shows up here at once: gated on its feature (``"embeddings"`` for EMBEDDING, ``"probes"`` for
the rest), and "not supported" until the suite has a check for it.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

from pie_core.hookspec import ProbeKind
from pie_core.backend_kit.sampling import probe, softmax
from pie_core.scheduler.request import ForwardRequest, ProbeSpec

from conformance.batches import kv_request
from conformance.loaded import LoadedModel, Run, not_supported

SURFACE = "probes"

_FEATURE = {"EMBEDDING": "embeddings"}  # every other kind needs "probes"


def _variants(kind: ProbeKind, vocab: int) -> list[dict[str, Any]]:
    if kind == ProbeKind.DISTRIBUTION:
        return [{"temperature": 0.8, "k": 5}, {"temperature": 0.0, "k": 3}, {"temperature": 1.3, "k": 0}]
    if kind == ProbeKind.LOGPROBS:
        return [{"token_ids": (3, 0, vocab - 1, 3)}, {"token_ids": ()}]
    return [{}]


def _expected(kind: ProbeKind, row: np.ndarray, v: dict[str, Any]) -> Any:
    ids = np.asarray(v.get("token_ids", ()), dtype=np.int32)
    return probe(
        row[None, :],
        np.array([int(kind)]),
        np.array([v.get("temperature", 1.0)], dtype=np.float32),
        np.array([v.get("k", 0)]),
        ids,
        np.array([0, len(ids)]),
    )[0]


def _check_distribution(model: LoadedModel, got: Any, row: np.ndarray, v: dict[str, Any], where: str) -> None:
    ids, probs = (np.asarray(x) for x in got)
    k = v["k"] if 0 < v["k"] < model.vocab else model.vocab
    assert ids.shape == probs.shape == (k,), (
        f"{where}: expected {k} ids and probabilities, got {ids.shape} and {probs.shape}"
    )
    if v["temperature"] > 0:
        full = softmax(row, v["temperature"])
    else:
        full = np.zeros(model.vocab)
        full[int(np.argmax(row))] = 1.0
    tol = model.tolerance
    assert not tol.bad(probs, full[ids]).any(), f"{where}: probabilities differ from softmax(logits / T) at those ids"
    assert (np.diff(probs) <= tol.atol).all(), f"{where}: probabilities are not in descending order"
    rest = np.setdiff1d(np.arange(model.vocab), ids)
    if rest.size:
        assert full[rest].max() <= probs.min() + tol.atol, f"{where}: a token outside the top {k} is more probable"


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
            _check_close(model, run.probes[0][i], ref.logits[0][row], f"LOGITS at row {row} vs the NumPy reference")


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
            _check_close(model, got, want, f"EMBEDDING at row {row} vs the NumPy reference")
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
        want = _expected(ProbeKind.ENTROPY, logits[-1].astype(np.float64), {})
        _check_close(model, float(value[0]), want, f"ENTROPY probe of request {r}")
