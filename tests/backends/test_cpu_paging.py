"""Paged KV behaviour of the NumPy backend: layouts, chunking, mixed batches, masks, copies.

Every test compares the backend with itself under two ways of doing the same computation, so
they hold for any weights; ``test_cpu_matches_transformers`` ties the forward to the truth.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from backend_testkit import kv_request, load_cpu, probe_logits, run, tiny_spec
from pie_core.hookspec import CopyKind

SPECS = ("qwen2", "gemma3")  # gemma3's spec has sliding-window layers (window 5)
TIGHT = dict(rtol=1e-5, atol=1e-5)


def _tokens(n: int, seed: int, vocab: int = 97) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, n)


@pytest.mark.parametrize("kind", SPECS)
def test_page_size_and_page_order_do_not_change_logits(kind):
    spec = tiny_spec(kind)
    seq = _tokens(41, 1)
    results = []
    for page_size, pages in (
        (4, np.arange(11)),
        (4, np.random.default_rng(2).permutation(200)[:11]),
        (16, np.array([7, 0, 3])),
        (1, np.random.default_rng(3).permutation(200)[:41]),
    ):
        backend = load_cpu(spec, page_size=page_size, kv_pages=200)
        req = [kv_request(seq, pages, page_size)]
        results.append(probe_logits(run(backend, req), req)[0])
    for other in results[1:]:
        np.testing.assert_allclose(other, results[0], **TIGHT)


@pytest.mark.parametrize("kind", SPECS)
def test_chunked_prefill_equals_one_shot_prefill(kind):
    spec = tiny_spec(kind)
    seq = _tokens(37, 4)
    pages = np.array([9, 2, 14, 5, 30, 11, 7, 21, 3, 17])
    one = load_cpu(spec)
    req = [kv_request(seq, pages, 4)]
    whole = probe_logits(run(one, req), req)[0]
    chunked = load_cpu(spec)
    parts = []
    for a, b in ((0, 10), (10, 11), (11, 26), (26, 37)):  # chunks cross page boundaries
        req = [kv_request(seq[a:b], pages, 4, start=a)]
        parts.append(probe_logits(run(chunked, req), req)[0])
    np.testing.assert_allclose(np.concatenate(parts), whole, **TIGHT)


@pytest.mark.parametrize("kind", SPECS)
def test_mixed_batch_equals_separate_runs(kind):
    """One request prefilling 37 tokens and three decoding one token each, batched or not.

    The decoders have 5, 70 and 300 tokens of context, so the decode rows fall into different
    length buckets; both sliding and full layers are exercised.
    """
    spec = tiny_spec(kind)
    contexts = {"b": _tokens(5, 10), "c": _tokens(70, 11), "d": _tokens(300, 12)}
    pool = np.random.default_rng(5).permutation(256)
    pages = {"a": pool[:10], "b": pool[10:12], "c": pool[12:30], "d": pool[30:106]}
    prompt = _tokens(37, 13)
    nxt = {"b": 3, "c": 50, "d": 77}

    def prepared():
        backend = load_cpu(spec, kv_pages=256)
        for name, ctx in contexts.items():
            run(backend, [kv_request(ctx, pages[name], 4, probe_all=False)])
        return backend

    def step(name):
        if name == "a":
            return kv_request(prompt, pages["a"], 4)
        return kv_request([nxt[name]], pages[name], 4, start=len(contexts[name]))

    names = ["a", "b", "c", "d"]
    batched = probe_logits(run(prepared(), [step(n) for n in names]), [step(n) for n in names])
    separate_backend = prepared()
    for name, got in zip(names, batched, strict=True):
        req = [step(name)]
        alone = probe_logits(run(separate_backend, req), req)[0]
        np.testing.assert_allclose(got, alone, **TIGHT)


@pytest.mark.parametrize("kind", SPECS)
def test_custom_mask_equal_to_causal_changes_nothing(kind):
    spec = tiny_spec(kind)
    seq = _tokens(13, 20)
    backend = load_cpu(spec)
    causal = np.tril(np.ones((13, 13), dtype=bool))
    plain = [kv_request(seq, np.arange(4), 4)]
    masked = [kv_request(seq, np.arange(10, 14), 4, mask=causal)]
    a, b = probe_logits(run(backend, plain + masked), plain + masked)
    np.testing.assert_allclose(b, a, **TIGHT)
    # A single decode token with a custom mask takes the per-request path; same result.
    step = [kv_request([5], np.arange(4), 4, start=13)]
    step_masked = [kv_request([5], np.arange(10, 14), 4, start=13, mask=np.ones((1, 14), dtype=bool))]
    a, b = probe_logits(run(backend, step + step_masked), step + step_masked)
    np.testing.assert_allclose(b, a, **TIGHT)


def test_mask_hiding_a_token_equals_leaving_it_out():
    """Hiding key 3 from every later row is the sequence without token 3 (positions kept)."""
    spec = tiny_spec("qwen2")
    seq = _tokens(10, 21)
    mask = np.tril(np.ones((10, 10), dtype=bool))
    mask[4:, 3] = False
    backend = load_cpu(spec)
    with_mask = [kv_request(seq, np.arange(3), 4, mask=mask)]
    got = probe_logits(run(backend, with_mask), with_mask)[0]
    keep = np.r_[0:3, 4:10]
    without = [kv_request(seq[keep], np.arange(5, 8), 4, positions=keep)]
    ref = probe_logits(run(backend, without), without)[0]
    np.testing.assert_allclose(got[keep], ref, **TIGHT)
    assert not np.allclose(
        got[4:],
        probe_logits(
            run(backend, [kv_request(seq, np.arange(10, 13), 4)]), [kv_request(seq, np.arange(10, 13), 4)]
        )[0][4:],
    )


def test_sliding_window_hides_keys_by_position():
    """On a one-layer sliding model, tokens older than the window cannot influence the output.

    (With more layers the receptive field grows by ``window - 1`` per layer.)
    """
    spec = dataclasses.replace(tiny_spec("gemma3"), num_layers=1, layer_types=("sliding",))
    backend = load_cpu(spec)
    tail = _tokens(5, 30)
    a = np.concatenate([_tokens(9, 31), tail])
    b = np.concatenate([_tokens(9, 32), tail])
    reqs = [kv_request(a, np.arange(4), 4), kv_request(b, np.arange(4, 8), 4)]
    la, lb = probe_logits(run(backend, reqs), reqs)
    # The last token (position 13) sees positions 9..13 (window 5): only the shared tail.
    np.testing.assert_allclose(la[-1], lb[-1], **TIGHT)
    assert not np.allclose(la[-2], lb[-2], **TIGHT)  # position 12 still sees position 8


@pytest.mark.parametrize("kv_len", [7, 9])
def test_rewriting_a_slot_equals_a_fresh_run(kv_len):
    """Writing slot 6 again attends slots 0..6 only, whatever later slots the KV still holds."""
    spec = tiny_spec("qwen2")
    seq = _tokens(9, 40)
    backend = load_cpu(spec)
    run(backend, [kv_request(seq, np.arange(3), 4, probe_all=False)])
    redo = [kv_request([11], np.arange(3), 4, start=6, kv_len=kv_len)]
    got = probe_logits(run(backend, redo), redo)[0]
    fresh_seq = np.concatenate([seq[:6], [11]])
    fresh = [kv_request(fresh_seq, np.arange(3, 5), 4)]
    np.testing.assert_allclose(got[0], probe_logits(run(backend, fresh), fresh)[0][-1], **TIGHT)


@pytest.mark.parametrize("kind", SPECS)
def test_copies_in_every_direction_preserve_the_context(kind):
    spec = tiny_spec(kind)
    seq = _tokens(14, 50)
    backend = load_cpu(spec, kv_pages=32, host_pages=8)
    src = np.array([3, 8, 1, 20], dtype=np.int32)
    run(backend, [kv_request(seq, src, 4, probe_all=False)])
    step = lambda pages: [kv_request([7], pages, 4, start=14)]  # noqa: E731
    expected = probe_logits(run(backend, step(src)), step(src))[0]

    fork = np.array([30, 4, 12, 9], dtype=np.int32)
    backend.pie_backend_copy_pages(CopyKind.DEVICE_TO_DEVICE, src, fork)
    np.testing.assert_allclose(probe_logits(run(backend, step(fork)), step(fork))[0], expected, **TIGHT)

    host = np.array([5, 0, 7, 2], dtype=np.int32)
    backend.pie_backend_copy_pages(CopyKind.DEVICE_TO_HOST, src, host)
    run(backend, [kv_request(_tokens(16, 51), src, 4, probe_all=False)])  # clobber the device pages
    assert not np.allclose(probe_logits(run(backend, step(src)), step(src))[0], expected, **TIGHT)
    restored = np.array([11, 13, 15, 17], dtype=np.int32)
    backend.pie_backend_copy_pages(CopyKind.HOST_TO_DEVICE, host, restored)
    got = probe_logits(run(backend, step(restored)), step(restored))[0]
    np.testing.assert_allclose(got, expected, **TIGHT)


def test_copy_rejects_bad_page_ids():
    backend = load_cpu(tiny_spec("qwen2"), kv_pages=8, host_pages=2)
    with pytest.raises(ValueError, match="out of range"):
        backend.pie_backend_copy_pages(CopyKind.DEVICE_TO_HOST, np.array([1]), np.array([2]))
    with pytest.raises(ValueError, match="out of range"):
        backend.pie_backend_copy_pages(CopyKind.DEVICE_TO_DEVICE, np.array([8]), np.array([0]))
    with pytest.raises(ValueError, match="as many"):
        backend.pie_backend_copy_pages(CopyKind.DEVICE_TO_DEVICE, np.array([1, 2]), np.array([0]))


def test_forward_rejects_write_slots_outside_the_pages():
    backend = load_cpu(tiny_spec("qwen2"))
    req = kv_request([1, 2], np.arange(1), 4)
    req.write_slots = np.array([0, 4], dtype=np.int32)
    with pytest.raises(ValueError, match="kv_write_slots"):
        run(backend, [req])
