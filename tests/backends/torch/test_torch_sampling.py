"""The torch backend's device samplers and probes give what ``pie_core.backend_kit.sampling`` gives.

Each test assembles one batch the way the core does, with many rows of every sampler kind
(random parameters, logit masks, ties, several draws) and every probe kind, hands the same
logits to the reference and to the device code, and compares: seeded tokens must be equal (the
uniforms are the reference's own), probe values equal up to float rounding. The Triton sampler
runs through Triton's interpreter.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("triton")  # xgrammar brings it to every install

from pie_backend_torch.sampling import draw, sample_and_probe  # noqa: E402
from pie_backend_torch.triton_kernels.sampling import apply_packed_mask, triton_draw  # noqa: E402
from pie_core.backend_kit import sampling as reference  # noqa: E402
from pie_core.hookspec import ProbeKind, SamplerKind  # noqa: E402
from pie_core.scheduler.assemble import assemble  # noqa: E402
from pie_core.scheduler.request import ForwardRequest, ProbeSpec, SampleSpec  # noqa: E402

DRAWERS = {"torch": (draw, None), "triton": (triton_draw, apply_packed_mask)}


def _request(samples, probes=(), n=1):
    return ForwardRequest(
        token_ids=np.zeros(n, np.int32),
        positions=np.arange(n, dtype=np.int32),
        page_ids=np.zeros(1, np.int32),
        last_page_len=n,
        write_slots=np.arange(n, dtype=np.int32),
        samples=tuple(samples),
        probes=tuple(probes),
    )


def _logits(rows: int, vocab: int, rng: np.random.Generator) -> np.ndarray:
    x = (rng.standard_normal((rows, vocab)) * 2.5).astype(np.float32)
    x[0, :] = 0.5  # a row of ties everywhere
    x[1, : vocab // 2] = x[1, vocab // 2 : 2 * (vocab // 2)]  # pairs of equal logits
    return x


def _random_samples(n: int, vocab: int, rng: np.random.Generator, masked: bool) -> list[SampleSpec]:
    out = []
    for i in range(n):
        kind = SamplerKind(int(rng.integers(0, 6)))
        mask = None
        if masked and i % 3 == 0:
            allowed = rng.random(vocab) < 0.3
            allowed[int(rng.integers(vocab))] = True
            mask = np.packbits(allowed, bitorder="little")
        out.append(
            SampleSpec(
                index=i,
                kind=kind,
                temperature=float(rng.choice([0.0, 0.4, 1.0, 1.7])) if kind != SamplerKind.ARGMAX else 1.0,
                top_k=int(rng.choice([0, 1, 3, 17, vocab + 5])),
                top_p=float(rng.choice([0.0, 0.3, 0.9, 1.0])),
                min_p=float(rng.choice([0.0, 0.05, 0.5])),
                draws=int(rng.integers(1, 4)),
                seed=int(rng.integers(1, 2**63)),
                logit_mask=mask,
            )
        )
    return out


@pytest.mark.parametrize("masked", [False, True], ids=["no-masks", "masks"])
@pytest.mark.parametrize("impl", list(DRAWERS))
def test_seeded_samples_equal_the_reference(impl, masked):
    vocab, rows = 61, 24
    rng = np.random.default_rng(11 + masked)
    batch = assemble([_request(_random_samples(rows, vocab, rng, masked), n=rows)], vocab)
    logits = _logits(rows, vocab, rng)
    want = reference.sample_and_probe(batch, reference.logit_rows(batch), logits.copy(), np.random.default_rng(0))
    drawer, masker = DRAWERS[impl]
    got = sample_and_probe(
        batch, reference.logit_rows(batch), torch.from_numpy(logits.copy()), np.random.default_rng(0), drawer=drawer, masker=masker
    )
    assert got.tokens.dtype == np.int32
    np.testing.assert_array_equal(got.tokens, want.tokens)


@pytest.mark.parametrize("impl", list(DRAWERS))
def test_fresh_randomness_stays_inside_the_support(impl):
    vocab = 40
    logits = np.linspace(-3, 3, vocab, dtype=np.float32)[None].repeat(2, 0)
    specs = [
        SampleSpec(index=0, kind=SamplerKind.TOP_K, top_k=3, draws=200, seed=0),
        SampleSpec(index=1, kind=SamplerKind.MIN_P, temperature=1.5, min_p=0.5, draws=200, seed=0),
    ]
    batch = assemble([_request(specs, n=2)], vocab)
    drawer, masker = DRAWERS[impl]
    out = sample_and_probe(batch, np.arange(2), torch.from_numpy(logits), np.random.default_rng(5), drawer=drawer, masker=masker)
    first, second = out.tokens[:200], out.tokens[200:]
    assert set(first.tolist()) == {37, 38, 39}
    p = np.exp(logits[1].astype(np.float64) / 1.5)  # min-p compares p / max(p) = exp((z - z_max) / T)
    assert set(second.tolist()) == set(np.flatnonzero(p >= 0.5 * p.max()).tolist())
    assert set(second.tolist()) == set(range(vocab - 7, vocab))  # z_max - z <= 1.5 ln 2: the top 7 of 40


def test_a_row_whose_mask_allows_nothing_is_refused():
    vocab = 16
    spec = SampleSpec(index=0, logit_mask=np.zeros(2, np.uint8))
    batch = assemble([_request([spec])], vocab)
    with pytest.raises(ValueError, match="allows no token"):
        sample_and_probe(batch, np.arange(1), torch.zeros(1, vocab), np.random.default_rng(0))


def test_every_probe_kind_equals_the_reference():
    vocab = 53
    rng = np.random.default_rng(2)
    allowed = rng.random(vocab) < 0.5
    allowed[:2] = True
    samples = [SampleSpec(index=0, kind=SamplerKind.ARGMAX, logit_mask=np.packbits(allowed, bitorder="little"))]
    probes = [
        ProbeSpec(index=0, kind=ProbeKind.LOGITS),
        ProbeSpec(index=0, kind=ProbeKind.LOGITS, masked_by=0),
        ProbeSpec(index=1, kind=ProbeKind.DISTRIBUTION, temperature=0.7, k=5),
        ProbeSpec(index=1, kind=ProbeKind.DISTRIBUTION, temperature=0.0, k=3),
        ProbeSpec(index=2, kind=ProbeKind.DISTRIBUTION, temperature=1.0, k=0),
        ProbeSpec(index=2, kind=ProbeKind.DISTRIBUTION, temperature=1.0, k=4),  # ties at the cut
        ProbeSpec(index=1, kind=ProbeKind.LOGPROBS, token_ids=(3, 0, 52, 3)),
        ProbeSpec(index=0, kind=ProbeKind.LOGPROBS, token_ids=(5, 1), masked_by=0),
        ProbeSpec(index=1, kind=ProbeKind.ENTROPY),
        ProbeSpec(index=0, kind=ProbeKind.ENTROPY, masked_by=0),
    ]
    batch = assemble([_request(samples, probes, n=3)], vocab)
    rows = reference.logit_rows(batch)
    logits = (rng.standard_normal((len(rows), vocab)) * 2).astype(np.float32)
    logits[2] = np.round(logits[2])  # many equal logits
    want = reference.sample_and_probe(batch, rows, logits.copy(), np.random.default_rng(0))
    got = sample_and_probe(batch, rows, torch.from_numpy(logits.copy()), np.random.default_rng(0))
    np.testing.assert_array_equal(got.tokens, want.tokens)
    assert len(got.probes) == len(want.probes)
    for i, (g, w) in enumerate(zip(got.probes, want.probes)):
        if isinstance(w, tuple):
            np.testing.assert_array_equal(g[0], w[0], err_msg=f"probe {i} ids")
            np.testing.assert_allclose(g[1], w[1], rtol=1e-5, err_msg=f"probe {i} probs")
        elif isinstance(w, float):
            assert isinstance(g, float) and g == pytest.approx(w, rel=1e-9), i
        else:
            assert g.dtype == np.float32
            np.testing.assert_allclose(g, w, rtol=1e-6, err_msg=f"probe {i}")


def test_the_mask_kernel_equals_unpacked_masks():
    vocab = 1030
    rng = np.random.default_rng(4)
    allowed = rng.random((3, vocab)) < 0.4
    packed = np.packbits(allowed, axis=1, bitorder="little")
    x = torch.randn(3, vocab)
    got = apply_packed_mask(x.clone(), packed)
    want = x.masked_fill(~torch.from_numpy(allowed), float("-inf"))
    assert torch.equal(got, want)
