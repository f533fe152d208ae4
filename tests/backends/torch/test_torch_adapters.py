"""LoRA adapters and zo perturbations on the torch backend.

A request running an adapter gives the logits of the base model with that adapter merged into its
weights (``W + scaling * B @ A``), whichever other adapters, zo seeds and plain requests share its
batch; a zo seed runs the merged weights of :func:`pie_core.backend_kit.lora.perturbed`. The adapter hooks
keep what they are given, and refuse what breaks the contract without changing anything.
Numerics run in float32 with dense weights (tight tolerance), and once in the default mode.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from backend_testkit import kv_request, probe_logits, random_weights, run
from pie_backend_torch import native
from pie_backend_torch.adapters import MAX_ADAPTER_RANK, MAX_ADAPTERS
from pie_core.backend_kit import lora
from torch_testkit import load_torch, spec_of

PAGE = 4
FP32_TOL = 2e-4
DEFAULT_MODE_REL = 0.04
"""Default mode (bf16 activations and int8 weights, or float32 and w8a8, by CPU), of the row
block's largest |logit|: 2-3x the base model's own quantisation error on this model, and a tenth
of the adapter's effect."""


def _spec(kind: str):
    """``spec_of(kind)``, or ``mha``: qwen2 without GQA (Q, K and V of one width: the adapter's
    ``qkv`` is kept in parts, like ``gate_up``)."""
    return dataclasses.replace(spec_of("qwen2"), num_kv_heads=6) if kind == "mha" else spec_of(kind)


def _adapter(spec, rank: int, seed: int, targets=lora.TARGETS, layers=None) -> dict[str, np.ndarray]:
    """Random adapter tensors whose deltas move the logits by a few percent."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(spec.num_layers) if layers is None else layers:
        for t in targets:
            rows, cols = lora.target_shape(spec, t)
            a = rng.standard_normal((rank, cols)) / np.sqrt(cols)
            b = 0.3 * rng.standard_normal((rows, rank)) / np.sqrt(rank)
            out[lora.tensor_name(i, t, "a")], out[lora.tensor_name(i, t, "b")] = a.astype(np.float32), b.astype(np.float32)
    return out


def _merged(spec, tensors: dict[str, np.ndarray], scaling: float) -> list[tuple[str, np.ndarray]]:
    """The base model's weights with ``W + scaling * B @ A`` for every target ``tensors`` hold."""
    weights = dict(random_weights(spec))
    for name, a in tensors.items():
        if name.endswith(".lora_a"):
            base = name.removesuffix(".lora_a")
            delta = np.float32(scaling) * (tensors[base + ".lora_b"] @ a)
            weights[base + ".weight"] = weights[base + ".weight"] + delta
    return list(weights.items())


def _steps(spec, rng, n: int = 1) -> list[list]:
    """A prefill of ``n`` requests of different lengths, then two decode steps of all of them."""
    lengths = [13, 3, 2, 5, 1, 4, 6, 2][:n]
    prompts = [rng.integers(0, spec.vocab_size, k).tolist() for k in lengths]
    pages = [[10 * r + j for j in range(4)] for r in range(n)]
    steps = [[kv_request(p, pg, PAGE) for p, pg in zip(prompts, pages)]]
    for d in range(2):
        steps.append(
            [kv_request([int(rng.integers(spec.vocab_size))], pg, PAGE, start=k + d) for k, pg in zip(lengths, pages)]
        )
    return steps


def _with(requests, adapters, seeds=None):
    seeds = seeds or [0] * len(requests)
    return [dataclasses.replace(r, adapter_id=a, zo_seed=s) for r, a, s in zip(requests, adapters, seeds)]


def _logits(backend, steps, adapters=None, seeds=None) -> list[np.ndarray]:
    """Every probed row of every step, per step and request, in one list."""
    out = []
    for reqs in steps:
        if adapters is not None:
            reqs = _with(reqs, adapters, seeds)
        out.extend(probe_logits(run(backend, reqs), reqs))
    return out


def _assert_close(got, want, tol: float = FP32_TOL) -> None:
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_allclose(g, w, atol=tol, rtol=0, err_msg=f"row block {i}")


def _assert_differ(a, b) -> None:
    assert max(float(np.abs(x - y).max()) for x, y in zip(a, b)) > 100 * FP32_TOL, "the adapter changed nothing"


def _loaded(spec, adapters: dict[int, tuple[dict[str, np.ndarray], float]], **options):
    backend = load_torch(spec, page_size=PAGE, **options)
    for adapter_id, (tensors, scaling) in adapters.items():
        rank = next(iter(tensors.values())).shape[0]  # the first tensor is an A: [rank, in]
        backend.pie_backend_adapter_create(adapter_id, rank, scaling)
        backend.pie_backend_adapter_load(adapter_id, tensors, scaling)
    return backend


@pytest.mark.parametrize("arch", ["qwen2", "gemma3", "qwen3", "mha"])
def test_an_adapter_gives_the_logits_of_its_merged_weights(arch):
    spec = _spec(arch)
    tensors = _adapter(spec, 4, seed=1)
    steps = _steps(spec, np.random.default_rng(0), n=2)
    got = _logits(_loaded(spec, {3: (tensors, 2.0)}), steps, adapters=[3, 3])
    want = _logits(load_torch(spec, _merged(spec, tensors, 2.0), page_size=PAGE), steps)
    _assert_close(got, want)
    _assert_differ(got, _logits(load_torch(spec, page_size=PAGE), steps))


@pytest.mark.parametrize("arch", ["qwen2", "mha"])
@pytest.mark.parametrize(
    ("targets", "layers"),
    [(("attn_q", "attn_v"), None), (("ffn_up",), [1]), (("attn_k", "attn_output", "ffn_gate", "ffn_down"), [0])],
)
def test_an_adapter_over_some_targets_gives_the_logits_of_its_merged_weights(arch, targets, layers):
    spec = _spec(arch)
    tensors = _adapter(spec, 3, seed=2, targets=targets, layers=layers)
    steps = _steps(spec, np.random.default_rng(1), n=1)
    got = _logits(_loaded(spec, {0: (tensors, 0.5)}), steps, adapters=[0])
    want = _logits(load_torch(spec, _merged(spec, tensors, 0.5), page_size=PAGE), steps)
    _assert_close(got, want)
    _assert_differ(got, _logits(load_torch(spec, page_size=PAGE), steps))


def test_an_adapter_in_the_default_mode_stays_close_to_its_merged_weights():
    spec = spec_of("qwen2")
    tensors = _adapter(spec, 8, seed=3)
    steps = _steps(spec, np.random.default_rng(2), n=3)  # 18-token prefill (large-batch layers), 3-token decode
    got = _logits(_loaded(spec, {1: (tensors, 1.0)}, dtype="auto"), steps, adapters=[1, 1, -1])
    want = _logits(load_torch(spec, _merged(spec, tensors, 1.0), page_size=PAGE), steps)
    base = _logits(load_torch(spec, page_size=PAGE), steps)
    for i, (g, w, b) in enumerate(zip(got, want, base)):
        tol = DEFAULT_MODE_REL * float(np.abs(w).max())
        if i % 3 == 2:  # the plain request
            np.testing.assert_allclose(g, b, atol=tol, rtol=0, err_msg=f"row block {i}")
        else:
            np.testing.assert_allclose(g, w, atol=tol, rtol=0, err_msg=f"row block {i}")
            assert np.abs(g - b).max() > 3 * tol, f"row block {i}: the adapter barely changed the logits"


def test_a_mixed_batch_in_the_default_mode_stays_close_to_each_merged_model():
    """bfloat16 LoRA weights (the native kernel's, where the CPU has native bf16) over groups of
    two ranks, a zo seed and plain requests in one batch."""
    spec = spec_of("qwen2")
    first, second = _adapter(spec, 8, seed=20), _adapter(spec, 4, seed=21, targets=("attn_v", "ffn_up", "ffn_down"))
    backend = _loaded(spec, {1: (first, 1.0), 2: (second, 2.0)}, dtype="auto")
    backend.pie_backend_adapter_zo(1, 0.05, np.zeros(0, np.int64), np.zeros(0, np.float32))
    ids, seeds = [1, 2, -1, 1, 2], [0, 0, 0, 7, 0]
    steps = _steps(spec, np.random.default_rng(20), n=len(ids))
    got = _logits(backend, steps, ids, seeds)
    merged = {
        (1, 0): _merged(spec, first, 1.0),
        (2, 0): _merged(spec, second, 2.0),
        (1, 7): _merged(spec, lora.perturbed(first, 0.05, 7), 1.0),
    }
    want = {key: _logits(load_torch(spec, w, page_size=PAGE), steps) for key, w in merged.items()}
    want[(-1, 0)] = _logits(load_torch(spec, page_size=PAGE), steps)
    for j, g in enumerate(got):
        w = want[(ids[j % len(ids)], seeds[j % len(ids)])][j]
        np.testing.assert_allclose(g, w, atol=DEFAULT_MODE_REL * float(np.abs(w).max()), rtol=0, err_msg=f"row block {j}")


@pytest.mark.parametrize("kernel", ["native", "torch"])
def test_a_batch_mixing_adapters_and_plain_requests_equals_each_request_alone(kernel, monkeypatch):
    if kernel == "torch":  # the fallback where the native kernels do not build
        monkeypatch.setattr(native, "ops", lambda: None)
    elif native.ops() is None:
        pytest.skip(f"kernels not built here: {native.unavailable_reason()}")
    spec = spec_of("qwen2")
    adapters = {
        5: (_adapter(spec, 2, seed=10), 1.0),
        6: (_adapter(spec, 8, seed=11, targets=("attn_q", "attn_v")), 2.0),
        7: (_adapter(spec, 4, seed=12, targets=("ffn_gate", "ffn_down"), layers=[1]), 0.7),
        9: (_adapter(spec, 8, seed=13), 1.5),
    }
    ids = [5, -1, 6, 5, 7, 9, -1, 9]  # 5 and 9 twice: groups of scattered tokens
    steps = _steps(spec, np.random.default_rng(3), n=len(ids))
    mixed = _loaded(spec, adapters)
    assert mixed._adapters._kernel == kernel
    got = _logits(mixed, steps, adapters=ids)
    alone = _loaded(spec, adapters)
    want = []
    for reqs in steps:
        for r, a in zip(reqs, ids):
            want.extend(probe_logits(run(alone, _with([r], [a])), [r]))
    _assert_close(got, want)
    pick = [0, 1, 2, 4, 5, 6]  # four groups of one token each, two plain requests
    last = _with([steps[-1][j] for j in pick], [ids[j] for j in pick])
    _assert_close(probe_logits(run(mixed, last), last), [want[-len(ids) + j] for j in pick])


def test_a_created_adapter_changes_nothing_until_loaded_or_moved():
    spec = spec_of("qwen2")
    steps = _steps(spec, np.random.default_rng(4), n=2)
    backend = load_torch(spec, page_size=PAGE)
    backend.pie_backend_adapter_create(0, 4, 2.0)
    backend.pie_backend_adapter_zo(0, 0.0, np.zeros(0, np.int64), np.zeros(0, np.float32))
    got = _logits(backend, steps, adapters=[0, 0], seeds=[0, 17])
    _assert_close(got, _logits(load_torch(spec, page_size=PAGE), steps))


def test_zo_seeds_perturb_reproducibly_as_lora_perturbed():
    spec = spec_of("qwen2")
    tensors = _adapter(spec, 4, seed=5)
    steps = _steps(spec, np.random.default_rng(5), n=4)
    backend = _loaded(spec, {2: (tensors, 1.0)})
    backend.pie_backend_adapter_zo(2, 0.05, np.zeros(0, np.int64), np.zeros(0, np.float32))
    ids, seeds = [2, 2, -1, 2], [11, 12, 0, 11]
    got = _logits(backend, steps, ids, seeds)
    for g, a in zip(got, _logits(backend, steps, ids, seeds)):  # the same pages and seeds again
        np.testing.assert_array_equal(a, g)
    ref = {0: _logits(load_torch(spec, page_size=PAGE), steps)}
    for s in (11, 12):
        ref[s] = _logits(load_torch(spec, _merged(spec, lora.perturbed(tensors, 0.05, s), 1.0), page_size=PAGE), steps)
    _assert_close(got, [ref[seeds[j % 4]][j] for j in range(len(got))])
    second = range(1, len(got), 4)
    _assert_differ([got[j] for j in second], [ref[11][j] for j in second])  # seed 12 is not seed 11


def test_adapter_zo_moves_the_mean_as_lora_moved_and_drops_cached_perturbations():
    spec = spec_of("qwen2")
    tensors = _adapter(spec, 4, seed=6)
    steps = _steps(spec, np.random.default_rng(6), n=1)
    backend = _loaded(spec, {4: (tensors, 1.0)})
    backend.pie_backend_adapter_zo(4, 0.02, np.zeros(0, np.int64), np.zeros(0, np.float32))
    run(backend, _with(steps[0], [4], [8]))  # caches seed 8 under the old mean
    seeds, coefficients = np.array([3, -9], np.int64), np.array([0.05, -0.02], np.float32)
    backend.pie_backend_adapter_zo(4, 0.04, seeds, coefficients)
    mean = lora.moved(tensors, seeds, coefficients)
    saved = backend.pie_backend_adapter_save(4)
    assert saved.keys() == mean.keys()
    for name in mean:
        np.testing.assert_array_equal(saved[name], mean[name])
    fresh = load_torch(spec, _merged(spec, lora.perturbed(mean, 0.04, 8), 1.0), page_size=PAGE)
    _assert_close(_logits(backend, steps, adapters=[4], seeds=[8]), _logits(fresh, steps))


def test_loading_new_weights_replaces_the_old_ones_in_the_forward():
    spec = spec_of("qwen2")
    first, second = _adapter(spec, 4, seed=7), _adapter(spec, 2, seed=8, targets=("attn_v", "ffn_up"))
    steps = _steps(spec, np.random.default_rng(7), n=1)
    backend = _loaded(spec, {1: (first, 1.0)})
    run(backend, _with(steps[0], [1]))
    backend.pie_backend_adapter_load(1, second, 3.0)
    fresh = load_torch(spec, _merged(spec, second, 3.0), page_size=PAGE)
    _assert_close(_logits(backend, steps, adapters=[1]), _logits(fresh, steps))


def test_save_returns_what_load_got():
    spec = spec_of("qwen2")
    tensors = _adapter(spec, 4, seed=9, targets=("attn_q", "ffn_down"))
    backend = _loaded(spec, {0: (tensors, 1.0)})
    saved = backend.pie_backend_adapter_save(0)
    assert saved.keys() == tensors.keys()
    for name, a in tensors.items():
        assert saved[name].dtype == np.float32
        np.testing.assert_array_equal(saved[name], a)
    saved[next(iter(saved))][:] = 7.0  # a copy: the adapter does not change
    np.testing.assert_array_equal(backend.pie_backend_adapter_save(0)[next(iter(saved))], next(iter(tensors.values())))


def test_a_created_adapter_saves_zeros_over_every_target():
    spec = spec_of("qwen2")
    backend = load_torch(spec, page_size=PAGE)
    backend.pie_backend_adapter_create(0, 3, 1.0)
    saved = backend.pie_backend_adapter_save(0)
    assert list(saved) == lora.tensor_names(spec)
    assert all(a.dtype == np.float32 and not a.any() and 3 in a.shape for a in saved.values())


def test_destroy_frees_the_id():
    spec = spec_of("qwen2")
    steps = _steps(spec, np.random.default_rng(8), n=1)
    backend = _loaded(spec, {3: (_adapter(spec, 2, seed=1), 1.0)})
    backend.pie_backend_adapter_destroy(3)
    with pytest.raises(ValueError, match="not held"):
        backend.pie_backend_adapter_save(3)
    with pytest.raises(ValueError, match="not held"):
        run(backend, _with(steps[0], [3]))
    backend.pie_backend_adapter_create(3, 2, 1.0)
    _assert_close(_logits(backend, steps, adapters=[3]), _logits(load_torch(spec, page_size=PAGE), steps))


def test_capabilities_declare_adapters_and_zo():
    caps = load_torch(spec_of("qwen2"), page_size=PAGE).pie_backend_capabilities()
    assert {"adapters", "zo"} <= caps.features
    assert (caps.max_adapters, caps.max_adapter_rank) == (MAX_ADAPTERS, MAX_ADAPTER_RANK)


@pytest.mark.parametrize(
    ("adapter_id", "zo_seed", "match"),
    [(12, 0, "adapter 12, which is not held"), (-1, 5, "zo seed 5 but no adapter")],
)
def test_a_batch_naming_no_held_adapter_is_refused_before_anything_is_written(adapter_id, zo_seed, match):
    spec = spec_of("qwen2")
    backend = _loaded(spec, {0: (_adapter(spec, 2, seed=1), 1.0)})
    reqs = [kv_request([1, 2, 3], [0], PAGE), kv_request([4, 5], [1], PAGE)]
    cache = backend._cache
    assert cache is not None
    before = cache.positions.copy(), cache.device.k.clone()
    with pytest.raises(ValueError, match=match):
        run(backend, _with(reqs, [0, adapter_id], [0, zo_seed]))
    np.testing.assert_array_equal(cache.positions, before[0])
    assert bool((cache.device.k == before[1]).all())


def test_adapter_hooks_refuse_what_breaks_the_contract():
    spec = spec_of("qwen2")
    backend = load_torch(spec, page_size=PAGE)
    with pytest.raises(ValueError, match="rank 65 is outside"):
        backend.pie_backend_adapter_create(0, MAX_ADAPTER_RANK + 1, 1.0)
    with pytest.raises(ValueError, match="not held"):
        backend.pie_backend_adapter_load(0, _adapter(spec, 2, seed=1), 1.0)
    for i in range(MAX_ADAPTERS):
        backend.pie_backend_adapter_create(i, 1, 1.0)
    with pytest.raises(ValueError, match="held already"):
        backend.pie_backend_adapter_create(0, 1, 1.0)
    with pytest.raises(ValueError, match=f"{MAX_ADAPTERS} adapters are held"):
        backend.pie_backend_adapter_create(MAX_ADAPTERS, 1, 1.0)


def _refused_loads(spec) -> list[tuple[dict[str, np.ndarray], float, str]]:
    good = _adapter(spec, 2, seed=1, targets=("attn_q",))
    wide = _adapter(spec, MAX_ADAPTER_RANK + 1, seed=1, targets=("attn_q",))
    a, b = lora.tensor_name(0, "attn_q", "a"), lora.tensor_name(0, "attn_q", "b")
    return [
        (good | {a: good[a][:, :-1]}, 1.0, "has shape"),
        (wide, 1.0, "outside"),
        ({a: good[a]}, 1.0, "comes without"),
        (good | {b: good[b].astype(np.float64)}, 1.0, "float32"),
        (good, float("nan"), "scaling must be finite"),
    ]


def test_a_refused_load_or_zo_leaves_the_adapter_unchanged():
    spec = spec_of("qwen2")
    tensors = _adapter(spec, 4, seed=2)
    steps = _steps(spec, np.random.default_rng(9), n=1)
    backend = _loaded(spec, {0: (tensors, 1.0)})
    want = _logits(backend, steps[:1], adapters=[0])
    for bad, scaling, match in _refused_loads(spec):
        with pytest.raises(ValueError, match=match):
            backend.pie_backend_adapter_load(0, bad, scaling)
    empty_seeds, empty = np.zeros(0, np.int64), np.zeros(0, np.float32)
    for sigma, seeds, coefficients, match in [
        (-1.0, empty_seeds, empty, "sigma"),
        (0.1, np.array([1, 2]), np.array([0.5], np.float32), "one length"),
        (0.1, np.array([0]), np.array([0.5], np.float32), "nonzero"),
        (0.1, np.array([1]), np.array([np.inf], np.float32), "finite"),
    ]:
        with pytest.raises(ValueError, match=match):
            backend.pie_backend_adapter_zo(0, sigma, seeds, coefficients)
    saved = backend.pie_backend_adapter_save(0)
    assert all(np.array_equal(saved[n], tensors[n]) for n in tensors)
    _assert_close(_logits(backend, steps[:1], adapters=[0]), want)  # same pages: rewrites the same K/V


def test_the_triton_path_adds_the_deltas_and_decode_graphs_leave_adapter_steps_to_it():
    pytest.importorskip("triton")
    from pie_backend_torch.cuda_graphs import DecodeGraphs, EagerCapture

    spec = spec_of("qwen2")
    tensors = _adapter(spec, 4, seed=4)
    steps = _steps(spec, np.random.default_rng(10), n=2)
    backend = _loaded(spec, {0: (tensors, 1.0)}, kernels="triton")
    backend._graphs = graphs = DecodeGraphs(backend._model, EagerCapture(), max_pages=8)
    got = _logits(backend, steps, adapters=[0, -1])
    assert not graphs.steps  # every decode step ran an adapter: none was captured
    merged = load_torch(spec, _merged(spec, tensors, 1.0), page_size=PAGE, kernels="triton")
    _assert_close(got[::2], _logits(merged, steps)[::2])
    plain = _logits(load_torch(spec, page_size=PAGE, kernels="triton"), steps)
    _assert_close(got[1::2], plain[1::2])
    reqs = [kv_request([7], pg, PAGE, start=15) for pg in ([0, 1, 2, 3], [10, 11, 12, 13])]
    run(backend, reqs)  # a plain decode step takes the graph
    assert list(graphs.steps) == [2]
