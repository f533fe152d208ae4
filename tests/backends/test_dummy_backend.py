"""The dummy backend: contract-valid, shape-correct, deterministic, honours logit masks."""

from __future__ import annotations

import numpy as np
import pytest

from backend_testkit import kv_request, random_weights, tiny_spec
from pie_core.backend_kit import DummyBackend
from pie_core.hookspec import BackendOptions, CopyKind, ProbeKind, SamplerKind
from pie_core.plugins import bind_plugin
from pie_core.scheduler.assemble import assemble
from pie_core.scheduler.request import ProbeSpec, SampleSpec


def _never_read():
    raise AssertionError("the dummy must not read weights")
    yield  # pragma: no cover


@pytest.fixture
def dummy():
    backend = DummyBackend()
    backend.pie_backend_load_model(
        tiny_spec("qwen2"), _never_read(), BackendOptions(page_size=4, kv_pages=64)
    )
    return backend


def _run(backend, reqs):
    return backend.pie_backend_forward(assemble(reqs, backend.pie_backend_capabilities().vocab_size))


def test_dummy_satisfies_the_hook_spec():
    pm = bind_plugin(DummyBackend(), "dummy")
    assert pm.hook.pie_backend_info().name == "dummy"


def test_capabilities_follow_the_options(dummy):
    caps = dummy.pie_backend_capabilities()
    assert (caps.page_size, caps.num_pages, caps.vocab_size) == (4, 64, tiny_spec("qwen2").vocab_size)
    assert caps.num_host_pages > 0 and {"custom_mask", "logit_mask", "probes"} <= caps.features


def test_outputs_have_the_contract_shapes(dummy):
    vocab = dummy.pie_backend_capabilities().vocab_size
    samples = (SampleSpec(index=0), SampleSpec(index=2, kind=SamplerKind.MULTINOMIAL, draws=4, seed=3))
    probes = (
        ProbeSpec(index=1, kind=ProbeKind.LOGITS),
        ProbeSpec(index=1, kind=ProbeKind.DISTRIBUTION, k=7),
        ProbeSpec(index=1, kind=ProbeKind.DISTRIBUTION, k=0),
        ProbeSpec(index=2, kind=ProbeKind.LOGPROBS, token_ids=(3, 1)),
        ProbeSpec(index=0, kind=ProbeKind.ENTROPY),
    )
    out = _run(
        dummy, [kv_request([5, 6, 7], np.arange(1), 4, probe_all=False, samples=samples, probes=probes)]
    )
    assert out.tokens.dtype == np.int32 and out.tokens.shape == (5,)
    logits, (ids7, p7), (ids_all, p_all), logprobs, entropy = out.probes
    assert logits.shape == (vocab,) and logits.dtype == np.float32
    assert ids7.shape == p7.shape == (7,) and ids_all.shape == (vocab,)
    assert abs(float(p_all.sum()) - 1.0) < 1e-5 and np.all(np.diff(p7) <= 0)
    assert logprobs.shape == (2,) and np.all(logprobs < 0)
    assert isinstance(entropy, float) and 0 < entropy <= np.log(vocab)
    assert out.tokens[0] == np.argmax(_run(dummy, [kv_request([5], np.arange(1), 4)]).probes[0])


def test_logits_depend_only_on_token_and_position(dummy):
    a = _run(dummy, [kv_request([5, 6, 7], np.arange(1), 4)]).probes
    b = _run(dummy, [kv_request([9, 6], np.arange(1), 4, start=0, positions=[4, 1])]).probes
    np.testing.assert_array_equal(a[1], b[1])  # token 6 at position 1 in both
    assert not np.array_equal(a[0], a[1]) and not np.array_equal(b[0], a[0])
    again = DummyBackend()
    again.pie_backend_load_model(tiny_spec("qwen2"), iter(()), BackendOptions(page_size=4))
    np.testing.assert_array_equal(_run(again, [kv_request([5, 6, 7], np.arange(1), 4)]).probes[2], a[2])


@pytest.mark.parametrize("kind", list(SamplerKind))
def test_sampled_tokens_are_allowed_by_the_mask(dummy, kind):
    vocab = dummy.pie_backend_capabilities().vocab_size
    allowed = np.zeros(vocab, bool)
    allowed[[2, 50, 99]] = True
    spec = SampleSpec(
        index=0,
        kind=kind,
        top_k=2,
        top_p=0.5,
        min_p=0.1,
        draws=20,
        seed=1,
        logit_mask=np.packbits(allowed, bitorder="little"),
    )
    positions = np.arange(30)
    reqs = [
        kv_request([t % vocab], np.arange(8), 4, start=int(t), probe_all=False, samples=(spec,))
        for t in positions
    ]
    out = _run(dummy, reqs)
    assert set(out.tokens.tolist()) <= {2, 50, 99}


def test_copy_pages_checks_ids(dummy):
    dummy.pie_backend_copy_pages(CopyKind.DEVICE_TO_HOST, np.array([63]), np.array([0]))
    with pytest.raises(ValueError, match="destination"):
        dummy.pie_backend_copy_pages(CopyKind.DEVICE_TO_HOST, np.array([1]), np.array([10_000]))
    with pytest.raises(ValueError, match="as many"):
        dummy.pie_backend_copy_pages(CopyKind.DEVICE_TO_DEVICE, np.array([1, 2]), np.array([3]))


def test_weights_are_accepted_and_ignored():
    spec = tiny_spec("gemma3")
    caps = DummyBackend().pie_backend_load_model(spec, random_weights(spec), BackendOptions())
    assert caps.vocab_size == spec.vocab_size
