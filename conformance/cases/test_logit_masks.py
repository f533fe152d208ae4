"""Logit masks (packed little-endian bits over the vocabulary, true = allowed) bind every row."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pie_core.hookspec import ProbeKind, SamplerKind
from pie_core.scheduler.request import ProbeSpec, SampleSpec

from conformance.batches import kv_request, pack_mask
from conformance.loaded import LoadedModel

SURFACE = "logit_masks"

_PARAMS: dict[SamplerKind, dict[str, Any]] = {
    SamplerKind.ARGMAX: {},
    SamplerKind.TOP_K: {"top_k": 3},
    SamplerKind.TOP_P: {"top_p": 0.9},
    SamplerKind.MIN_P: {"min_p": 0.05},
    SamplerKind.TOP_K_TOP_P: {"top_k": 4, "top_p": 0.9},
    SamplerKind.MULTINOMIAL: {},
}


@pytest.fixture
def masking(model: LoadedModel) -> LoadedModel:
    model.require("logit_mask")
    return model


def _allowed(vocab: int, ids: list[int]) -> np.ndarray:
    allowed = np.zeros(vocab, dtype=bool)
    allowed[ids] = True
    return allowed


def test_argmax_respects_the_logit_mask(masking: LoadedModel, rng: np.random.Generator) -> None:
    prompt = rng.integers(0, masking.vocab, 6)
    probe = masking.run([kv_request(prompt, masking.pages_for(len(prompt)), masking.page_size)])
    raw = masking.own_logits(probe)[0][-1]
    allowed = rng.random(masking.vocab) < 0.3
    allowed[int(np.argmax(raw))] = False  # the unmasked winner is not allowed
    allowed[masking.vocab - 1] = True  # nor is the last (partial) byte forgotten
    spec = SampleSpec(index=len(prompt) - 1, kind=SamplerKind.ARGMAX, logit_mask=pack_mask(allowed))
    run = masking.run([kv_request(prompt, masking.pages_for(len(prompt)), masking.page_size, samples=(spec,))])
    logits = masking.own_logits(run)[0][-1]
    want = int(np.flatnonzero(allowed)[np.argmax(logits[allowed])])
    got = run.samples[0][0][0]
    assert allowed[got], f"argmax drew token {got}, which the logit mask forbids"
    assert got == want, f"argmax under the mask drew {got}; the best allowed token is {want}"


@pytest.mark.parametrize("kind", list(_PARAMS), ids=lambda k: k.name.lower())
def test_every_sampler_stays_inside_the_logit_mask(
    masking: LoadedModel, rng: np.random.Generator, kind: SamplerKind
) -> None:
    prompt = rng.integers(0, masking.vocab, 5)
    ids = sorted({0, masking.vocab - 1, *rng.choice(masking.vocab, 4, replace=False).tolist()})
    allowed = _allowed(masking.vocab, ids)
    samples = tuple(
        SampleSpec(
            index=4, kind=kind, temperature=3.0, seed=1000 + i, logit_mask=pack_mask(allowed), **_PARAMS[kind]
        )
        for i in range(64)
    )
    run = masking.run([kv_request(prompt, masking.pages_for(len(prompt)), masking.page_size, samples=samples)], observe=False)
    drawn = {t for row in run.samples[0] for t in row}
    assert drawn <= set(ids), f"{kind.name} drew {sorted(drawn - set(ids))} outside the allowed {ids}"


def test_a_single_allowed_token_is_always_drawn(masking: LoadedModel, rng: np.random.Generator) -> None:
    last = masking.vocab - 1  # its bit sits in the final, partial byte of the packed mask
    only = pack_mask(_allowed(masking.vocab, [last]))
    samples = tuple(
        SampleSpec(index=2, kind=kind, temperature=2.0, seed=7, logit_mask=only, **_PARAMS[kind]) for kind in _PARAMS
    )
    prompt = rng.integers(0, masking.vocab, 3)
    run = masking.run([kv_request(prompt, masking.pages_for(len(prompt)), masking.page_size, samples=samples)], observe=False)
    got = [row[0] for row in run.samples[0]]
    assert got == [last] * len(samples), f"samplers {[k.name for k in _PARAMS]} drew {got} with only {last} allowed"


def test_rows_without_a_mask_are_unconstrained(masking: LoadedModel, rng: np.random.Generator) -> None:
    prompt = rng.integers(0, masking.vocab, 4)
    probe = masking.run([kv_request(prompt, masking.pages_for(len(prompt)), masking.page_size)])
    raw = masking.own_logits(probe)[0][-1]
    best = int(np.argmax(raw))
    allowed = np.ones(masking.vocab, dtype=bool)
    allowed[best] = False
    samples = (
        SampleSpec(index=3, kind=SamplerKind.ARGMAX, logit_mask=pack_mask(allowed)),
        SampleSpec(index=3, kind=SamplerKind.ARGMAX),
    )
    run = masking.run([kv_request(prompt, masking.pages_for(len(prompt)), masking.page_size, samples=samples)], observe=False)
    masked_row, free_row = run.samples[0][0][0], run.samples[0][1][0]
    assert masked_row != best, f"the masked row drew the forbidden token {best}"
    assert free_row == best, f"the unmasked row drew {free_row}, not its argmax {best}: another row's mask leaked"


def test_probes_read_the_masked_logits(masking: LoadedModel, rng: np.random.Generator) -> None:
    masking.require("probes")
    prompt = rng.integers(0, masking.vocab, 4)
    allowed = rng.random(masking.vocab) < 0.25
    allowed[[0, masking.vocab - 1]] = True
    sample = SampleSpec(index=3, kind=SamplerKind.ARGMAX, logit_mask=pack_mask(allowed))
    probes = (
        ProbeSpec(index=3, kind=ProbeKind.LOGITS, masked_by=0),
        ProbeSpec(index=3, kind=ProbeKind.DISTRIBUTION, k=0, masked_by=0),
        ProbeSpec(index=3, kind=ProbeKind.LOGITS),
    )
    run = masking.run([kv_request(prompt, masking.pages_for(len(prompt)), masking.page_size, samples=(sample,), probes=probes)])
    masked, (ids, probs), raw = run.probes[0]
    masked, raw = np.asarray(masked), np.asarray(raw)
    assert np.isneginf(masked[~allowed]).all(), "a masked LOGITS probe must read -inf at forbidden tokens"
    assert not masking.tolerance.bad(masked[allowed], raw[allowed]).any(), "masking changed allowed logits"
    assert np.isfinite(raw).all(), "an unmasked LOGITS probe must not see another probe's mask"
    support = np.asarray(ids)[np.asarray(probs) > 0]
    forbidden = support[~allowed[support]].tolist()
    assert not forbidden, f"a masked DISTRIBUTION probe gave forbidden ids {forbidden}"
