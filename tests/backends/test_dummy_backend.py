"""The dummy backend: contract-valid, shape-correct, deterministic, honours logit masks, and takes
as long as its timing options say (``step_ms``, ``token_us``, ``copy_us``)."""

from __future__ import annotations

import asyncio
import threading
import types

import numpy as np
import pytest

from backend_testkit import kv_request, random_weights, tiny_spec
from pie_core.backend_kit import DummyBackend
from pie_core.backend_kit import dummy as dummy_module
from pie_core.engine.engine import Engine
from pie_core.host import context as host_context
from pie_core.host.inference import forward
from pie_core.runtime.instance import run_main
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


def test_greedy_batches_without_probes_give_the_argmax_of_the_logits(dummy):
    """The dummy answers an all-argmax batch without making its logits: the same tokens as the
    full path, which the same batch takes once a probe asks for the logits."""
    rng = np.random.default_rng(0)
    vocab = dummy.pie_backend_capabilities().vocab_size
    reqs = [kv_request([int(t)], np.arange(8), 4, start=int(p), probe_all=False, samples=(SampleSpec(index=0),))
            for t, p in zip(rng.integers(0, vocab, 40), rng.integers(0, 30, 40))]
    fast = _run(dummy, reqs).tokens
    probed = [kv_request(r.token_ids.tolist(), np.arange(8), 4, start=int(r.positions[0]), probe_all=False,
                         samples=(SampleSpec(index=0),), probes=(ProbeSpec(index=0, kind=ProbeKind.LOGITS),))
              for r in reqs]
    full = _run(dummy, probed)
    np.testing.assert_array_equal(fast, full.tokens)
    np.testing.assert_array_equal(fast, [int(np.argmax(row)) for row in full.probes])


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


def _timed(**extra):
    backend = DummyBackend()
    backend.pie_backend_load_model(tiny_spec("qwen2"), _never_read(), BackendOptions(page_size=4, kv_pages=64, extra=extra))
    return backend


@pytest.fixture
def sleeps(monkeypatch):
    """The seconds each ``time.sleep`` in the dummy asked for (nothing actually sleeps)."""
    asked: list[float] = []
    monkeypatch.setattr(dummy_module, "time", types.SimpleNamespace(sleep=asked.append))
    return asked


def test_without_timing_options_a_batch_and_a_copy_do_not_sleep(dummy, sleeps):
    _run(dummy, [kv_request([5, 6, 7], np.arange(1), 4)])
    dummy.pie_backend_copy_pages(CopyKind.DEVICE_TO_HOST, np.array([1, 2]), np.array([0, 1]))
    assert sleeps == []


def test_a_batch_sleeps_step_ms_plus_token_us_per_input_token(sleeps):
    backend = _timed(step_ms=10, token_us="2.5")  # the CLI passes '2.5' as a string, integers as ints
    _run(backend, [kv_request([5, 6, 7], np.arange(1), 4), kv_request([8, 9], np.arange(1, 2), 4)])
    assert sleeps == [pytest.approx(10e-3 + 5 * 2.5e-6)]
    _run(backend, [kv_request([5], np.arange(1), 4)])
    assert sleeps[-1] == pytest.approx(10e-3 + 2.5e-6)


def test_a_page_copy_sleeps_copy_us_per_page(sleeps):
    backend = _timed(copy_us=40.0)
    backend.pie_backend_copy_pages(CopyKind.DEVICE_TO_HOST, np.array([1, 2, 3]), np.array([0, 1, 2]))
    assert sleeps == [pytest.approx(120e-6)]
    _run(backend, [kv_request([5], np.arange(1), 4)])
    assert len(sleeps) == 1  # copy_us alone adds nothing to a batch


def test_the_sleep_runs_on_the_engines_backend_thread_as_compute_would(monkeypatch):
    asked: list[tuple[float, str]] = []
    # the dummy's own clock only: other threads of the process (a wasm host's ticker) sleep too
    fake = types.SimpleNamespace(sleep=lambda s: asked.append((s, threading.current_thread().name)))
    monkeypatch.setattr(dummy_module, "time", fake)
    engine = Engine("dummy", options=BackendOptions(page_size=4, kv_pages=16, extra={"step_ms": 7, "token_us": 1}))
    model = engine.load(None)

    async def main(_) -> None:
        ctx = host_context.create(model.name)
        await forward(ctx, [1, 2, 3], samples=[SampleSpec(index=2)])
        ctx.release()

    try:
        assert asyncio.run(run_main(engine, main, {}, lambda event: None)).kind == "return"
    finally:
        asyncio.run(engine.close())
    ((seconds, thread),) = asked
    assert seconds == pytest.approx(7e-3 + 3e-6) and thread.startswith("pie-backend")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"step_ms": -1}, r"step_ms=-1: expected a number >= 0 \(milliseconds per forward batch\)"),
        ({"token_us": "fast"}, r"token_us='fast': expected a number >= 0"),
        ({"copy_us": True}, r"copy_us=True: expected a number >= 0"),
        ({"step_ms": "inf"}, r"step_ms='inf': expected a number >= 0"),
        ({"step_ms": 1, "threads": 2}, r"unknown dummy backend option\(s\) threads; known: copy_us, step_ms, token_us$"),
    ],
)
def test_timing_options_are_checked_before_anything_loads(extra, message):
    with pytest.raises(ValueError, match=message) as refused:
        _timed(**extra)
    assert "\n" not in str(refused.value)
