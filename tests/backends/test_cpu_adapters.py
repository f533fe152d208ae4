"""LoRA adapters and zo perturbations in the NumPy backend, checked against merged base weights.

An adapter's pass must equal the base model loaded with ``W + scaling * B @ A`` on every target
it holds; a zo pass the same with :func:`pie_core.backend_kit.lora.perturbed` tensors. Requests with
different adapters and seeds share a batch without seeing each other's deltas.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from backend_testkit import kv_request, load_cpu, probe_logits, random_weights, run, tiny_spec
from pie_backend_cpu.adapters import MAX_ADAPTER_RANK, MAX_ADAPTERS
from pie_core.backend_kit import lora
from pie_core.backend_kit.adapter_bank import PERTURBED_CACHE_SIZE
from pie_core.models.spec import ModelSpec
from pie_core.scheduler.request import ForwardRequest

PAGE_SIZE = 4
ATOL = 1e-4
NO_STEP = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32))
"""Empty ``seeds`` and ``coefficients``: ``pie_backend_adapter_zo`` only sets sigma."""


def random_adapter(
    spec: ModelSpec, rank: int, targets: tuple[str, ...] = lora.TARGETS, seed: int = 0
) -> dict[str, np.ndarray]:
    """LoRA tensors on ``targets`` of every layer, sized so the delta is comparable to ``W``."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for i in range(spec.num_layers):
        for target in targets:
            out, inp = lora.target_shape(spec, target)
            tensors[lora.tensor_name(i, target, "a")] = (rng.standard_normal((rank, inp)) / np.sqrt(inp)).astype(
                np.float32
            )
            tensors[lora.tensor_name(i, target, "b")] = (rng.standard_normal((out, rank)) / np.sqrt(rank)).astype(
                np.float32
            )
    return tensors


def merged_weights(spec: ModelSpec, tensors: dict[str, np.ndarray], scaling: float) -> list[tuple[str, np.ndarray]]:
    """The base random weights with ``scaling * B @ A`` added to every target ``tensors`` holds."""
    weights = dict(random_weights(spec))
    for name, a in tensors.items():
        if name.endswith(".lora_a"):
            _, layer, target, _ = name.split(".")
            b = tensors[lora.tensor_name(int(layer), target, "b")]
            key = f"blk.{layer}.{target}.weight"
            weights[key] = (weights[key] + np.float32(scaling) * (b @ a)).astype(np.float32)
    return list(weights.items())


def request(tokens, first_page: int = 0, start: int = 0, adapter: int = -1, seed: int = 0) -> ForwardRequest:
    """Tokens written from slot ``start`` of pages ``first_page, first_page + 1, ...``, probing every row."""
    pages = list(range(first_page, first_page + 8))
    return dataclasses.replace(kv_request(tokens, pages, PAGE_SIZE, start=start), adapter_id=adapter, zo_seed=seed)


def logits(backend, tokens, adapter: int = -1, seed: int = 0) -> np.ndarray:
    """``[n, vocab]`` logits of a prefill of ``tokens`` run alone."""
    req = request(tokens, adapter=adapter, seed=seed)
    return probe_logits(run(backend, [req]), [req])[0]


def merged_logits(spec: ModelSpec, tokens, tensors: dict[str, np.ndarray], scaling: float) -> np.ndarray:
    return logits(load_cpu(spec, merged_weights(spec, tensors, scaling), page_size=PAGE_SIZE), tokens)


@pytest.fixture
def spec() -> ModelSpec:
    return tiny_spec("qwen2")


@pytest.fixture
def backend(spec):
    return load_cpu(spec, page_size=PAGE_SIZE)


@pytest.fixture
def tokens(spec) -> np.ndarray:
    return np.random.default_rng(7).integers(0, spec.vocab_size, 6)


def test_capabilities_declare_adapters_zo_and_their_limits(backend):
    caps = backend.pie_backend_capabilities()
    assert {"adapters", "zo"} <= caps.features
    assert {"adapters", "zo"} <= backend.pie_backend_info().features
    assert (caps.max_adapters, caps.max_adapter_rank) == (MAX_ADAPTERS, MAX_ADAPTER_RANK)


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3", "gemma3"])
def test_an_adapter_on_every_target_equals_the_merged_weights(arch):
    spec = tiny_spec(arch)
    backend = load_cpu(spec, page_size=PAGE_SIZE)
    tokens = np.random.default_rng(3).integers(0, spec.vocab_size, 7)
    tensors = random_adapter(spec, rank=4)
    backend.pie_backend_adapter_create(5, 4, 1.0)
    backend.pie_backend_adapter_load(5, tensors, 0.75)
    mine = logits(backend, tokens, adapter=5)
    assert not np.allclose(mine, logits(backend, tokens), atol=1e-2), "the adapter changed nothing"
    np.testing.assert_allclose(mine, merged_logits(spec, tokens, tensors, 0.75), atol=ATOL, rtol=0)


def test_an_adapter_on_q_and_v_only_equals_the_merged_weights(spec, backend, tokens):
    tensors = random_adapter(spec, rank=3, targets=("attn_q", "attn_v"), seed=1)
    backend.pie_backend_adapter_create(0, 8, 1.0)
    backend.pie_backend_adapter_load(0, tensors, 2.0)
    np.testing.assert_allclose(logits(backend, tokens, adapter=0), merged_logits(spec, tokens, tensors, 2.0), atol=ATOL)


def test_an_adapter_on_one_ffn_part_equals_the_merged_weights(spec, backend, tokens):
    tensors = random_adapter(spec, rank=2, targets=("ffn_up", "attn_output"), seed=2)
    backend.pie_backend_adapter_create(0, 8, 1.0)
    backend.pie_backend_adapter_load(0, tensors, 0.5)
    np.testing.assert_allclose(logits(backend, tokens, adapter=0), merged_logits(spec, tokens, tensors, 0.5), atol=ATOL)


def _two_steps(backend, plan: list[tuple[int, int, int]], together: bool) -> list[np.ndarray]:
    """Prefill then decode one token for each ``(length, adapter, seed)``; per request, the logits
    of both steps stacked. ``together``: each step as one batch; else every request alone."""
    rng = np.random.default_rng(11)
    vocab = backend.pie_backend_capabilities().vocab_size
    prompts = [rng.integers(0, vocab, n) for n, _, _ in plan]
    nexts = rng.integers(0, vocab, len(plan))
    steps = []
    for step in range(2):
        reqs = [
            request(p, 8 * r, adapter=a, seed=s) if step == 0 else request([t], 8 * r, len(p), adapter=a, seed=s)
            for r, (p, t, (_, a, s)) in enumerate(zip(prompts, nexts, plan))
        ]
        if together:
            steps.append(probe_logits(run(backend, reqs), reqs))
        else:
            steps.append([probe_logits(run(backend, [req]), [req])[0] for req in reqs])
    return [np.concatenate([first, second]) for first, second in zip(*steps)]


def test_a_batch_mixing_adapters_equals_each_request_alone(spec, backend):
    for adapter in range(4):
        backend.pie_backend_adapter_create(adapter, 8, 1.0)
        targets = lora.TARGETS if adapter % 2 == 0 else ("attn_k", "ffn_gate", "ffn_down")
        tensors = random_adapter(spec, 2 + adapter, targets, seed=adapter)
        backend.pie_backend_adapter_load(adapter, tensors, 0.5 + adapter)
    plan = [(5, 0, 0), (1, 1, 0), (3, -1, 0), (4, 2, 0), (2, 2, 0), (6, 3, 0), (2, 1, 0), (1, -1, 0)]
    together = _two_steps(backend, plan, together=True)
    alone = _two_steps(backend, plan, together=False)
    for r, (mine, ref) in enumerate(zip(together, alone)):
        np.testing.assert_allclose(mine, ref, atol=ATOL, err_msg=f"request {r} (adapter {plan[r][1]})")


def test_a_created_adapter_changes_nothing(backend, tokens):
    backend.pie_backend_adapter_create(3, 16, 2.0)
    np.testing.assert_array_equal(logits(backend, tokens, adapter=3), logits(backend, tokens))


def test_zo_seeds_perturb_reproducibly_as_lora_perturbed(spec, backend, tokens):
    backend.pie_backend_adapter_create(1, 4, 1.0)
    backend.pie_backend_adapter_load(1, random_adapter(spec, 4, seed=5), 1.5)
    backend.pie_backend_adapter_zo(1, 0.3, *NO_STEP)
    mean = backend.pie_backend_adapter_save(1)
    first, again, other = (logits(backend, tokens, adapter=1, seed=s) for s in (41, 41, 42))
    np.testing.assert_array_equal(first, again)
    assert not np.allclose(first, other, atol=1e-2), "two zo seeds gave the same logits"
    np.testing.assert_allclose(first, merged_logits(spec, tokens, lora.perturbed(mean, 0.3, 41), 1.5), atol=ATOL)
    np.testing.assert_allclose(logits(backend, tokens, adapter=1), merged_logits(spec, tokens, mean, 1.5), atol=ATOL)


def test_zo_seeds_of_one_adapter_share_a_batch_with_plain_requests(spec, backend):
    backend.pie_backend_adapter_create(2, 4, 1.0)
    backend.pie_backend_adapter_zo(2, 0.5, *NO_STEP)
    plan = [(3, 2, 7), (2, 2, 8), (4, -1, 0), (1, 2, 7), (2, 2, 0)]
    together = _two_steps(backend, plan, together=True)
    alone = _two_steps(backend, plan, together=False)
    for r, (mine, ref) in enumerate(zip(together, alone)):
        np.testing.assert_allclose(mine, ref, atol=ATOL, err_msg=f"request {r} (seed {plan[r][2]})")


def test_more_zo_seeds_than_the_cache_holds_share_one_batch(backend):
    backend.pie_backend_adapter_create(0, 2, 1.0)
    backend.pie_backend_adapter_zo(0, 0.5, *NO_STEP)
    plan = [(2, 0, seed) for seed in range(1, PERTURBED_CACHE_SIZE + 5)]
    together = _two_steps(backend, plan, together=True)
    alone = _two_steps(backend, plan, together=False)
    for r, (mine, ref) in enumerate(zip(together, alone)):
        np.testing.assert_allclose(mine, ref, atol=ATOL, err_msg=f"request {r} (seed {plan[r][2]})")


def test_adapter_zo_moves_the_mean_as_lora_moved(spec, backend, tokens):
    backend.pie_backend_adapter_create(0, 3, 1.0)
    backend.pie_backend_adapter_load(0, random_adapter(spec, 3, ("attn_v", "ffn_down"), seed=9), 1.0)
    backend.pie_backend_adapter_zo(0, 0.2, *NO_STEP)
    logits(backend, tokens, adapter=0, seed=13)  # caches the perturbation of the old mean
    before = backend.pie_backend_adapter_save(0)
    seeds, coefficients = np.array([13, -4, 99], dtype=np.int64), np.array([0.5, -0.25, 1.0], dtype=np.float32)
    backend.pie_backend_adapter_zo(0, 0.1, seeds, coefficients)
    after = backend.pie_backend_adapter_save(0)
    expected = lora.moved(before, seeds, coefficients)
    assert after.keys() == expected.keys()
    for name in expected:
        np.testing.assert_array_equal(after[name], expected[name], err_msg=name)
    perturbed = merged_logits(spec, tokens, lora.perturbed(expected, 0.1, 13), 1.0)
    np.testing.assert_allclose(logits(backend, tokens, adapter=0, seed=13), perturbed, atol=ATOL)


def test_loading_drops_the_cached_perturbations(spec, backend, tokens):
    backend.pie_backend_adapter_create(0, 4, 1.0)
    backend.pie_backend_adapter_zo(0, 0.4, *NO_STEP)
    logits(backend, tokens, adapter=0, seed=3)
    tensors = random_adapter(spec, 2, ("attn_q",), seed=4)
    backend.pie_backend_adapter_load(0, tensors, 1.0)
    expected = merged_logits(spec, tokens, lora.perturbed(tensors, 0.4, 3), 1.0)
    np.testing.assert_allclose(logits(backend, tokens, adapter=0, seed=3), expected, atol=ATOL)


def test_save_returns_copies_of_what_load_got(spec, backend):
    tensors = random_adapter(spec, 5, ("attn_k", "ffn_gate"), seed=6)
    backend.pie_backend_adapter_create(4, 1, 1.0)
    backend.pie_backend_adapter_load(4, tensors, 1.0)
    original = {name: a.copy() for name, a in tensors.items()}
    next(iter(tensors.values()))[:] = 9.0
    saved = backend.pie_backend_adapter_save(4)
    assert saved.keys() == original.keys()
    for name in original:
        assert saved[name].dtype == np.float32
        np.testing.assert_array_equal(saved[name], original[name], err_msg=name)
    first = next(iter(original))
    saved[first][:] = 9.0
    np.testing.assert_array_equal(backend.pie_backend_adapter_save(4)[first], original[first])


def test_save_of_a_created_adapter_holds_every_target_as_zeros(spec, backend):
    backend.pie_backend_adapter_create(0, 6, 1.0)
    saved = backend.pie_backend_adapter_save(0)
    assert list(saved) == lora.tensor_names(spec)
    assert lora.check_tensors(spec, saved, MAX_ADAPTER_RANK) == 6
    assert not any(a.any() for a in saved.values())


def test_destroy_frees_the_id(backend, tokens):
    backend.pie_backend_adapter_create(9, 4, 1.0)
    backend.pie_backend_adapter_destroy(9)
    with pytest.raises(ValueError, match="adapter 9"):
        logits(backend, tokens, adapter=9)
    with pytest.raises(ValueError, match="adapter 9"):
        backend.pie_backend_adapter_save(9)
    backend.pie_backend_adapter_create(9, 2, 1.0)


def test_a_batch_naming_an_unknown_adapter_is_refused_before_writing(spec, backend, tokens):
    backend.pie_backend_adapter_create(0, 4, 1.0)
    run(backend, [request(tokens[:4])])
    with pytest.raises(ValueError, match="adapter 7"):
        run(backend, [request(tokens[2:6], adapter=0), request(tokens[:3], first_page=8, adapter=7)])
    with pytest.raises(ValueError, match="adapter -3"):
        run(backend, [request(tokens[2:6], adapter=-3)])
    decode = request(tokens[4:5], start=4)
    reference = load_cpu(spec, page_size=PAGE_SIZE)
    run(reference, [request(tokens[:4])])
    np.testing.assert_array_equal(
        probe_logits(run(backend, [decode]), [decode])[0], probe_logits(run(reference, [decode]), [decode])[0]
    )


def test_a_zo_seed_without_an_adapter_is_refused(backend, tokens):
    backend.pie_backend_adapter_create(0, 4, 1.0)
    with pytest.raises(ValueError, match="zo seed 5 but no adapter"):
        run(backend, [request(tokens, adapter=0, seed=3), request(tokens, first_page=8, seed=5)])
    with pytest.raises(ValueError, match="zo seed 5 but no adapter"):
        logits(backend, tokens, seed=5)


def test_create_refuses_bad_ranks_held_ids_and_too_many_adapters(backend):
    with pytest.raises(ValueError, match=f"rank {MAX_ADAPTER_RANK + 1}"):
        backend.pie_backend_adapter_create(0, MAX_ADAPTER_RANK + 1, 1.0)
    with pytest.raises(ValueError, match="rank 0"):
        backend.pie_backend_adapter_create(0, 0, 1.0)
    with pytest.raises(ValueError, match="-1"):
        backend.pie_backend_adapter_create(-1, 4, 1.0)
    with pytest.raises(ValueError, match="scaling"):
        backend.pie_backend_adapter_create(0, 4, float("nan"))
    for adapter in range(MAX_ADAPTERS):
        backend.pie_backend_adapter_create(adapter, 1, 1.0)
    with pytest.raises(ValueError, match="held already"):
        backend.pie_backend_adapter_create(3, 1, 1.0)
    with pytest.raises(ValueError, match=f"{MAX_ADAPTERS} adapters are held"):
        backend.pie_backend_adapter_create(MAX_ADAPTERS, 1, 1.0)
    backend.pie_backend_adapter_destroy(0)
    backend.pie_backend_adapter_create(MAX_ADAPTERS, 1, 1.0)


def test_a_refused_load_leaves_the_adapter_unchanged(spec, backend, tokens):
    tensors = random_adapter(spec, 4, ("attn_q", "ffn_down"), seed=8)
    backend.pie_backend_adapter_create(1, 4, 1.0)
    backend.pie_backend_adapter_load(1, tensors, 1.0)
    before = logits(backend, tokens, adapter=1)
    too_big = random_adapter(spec, MAX_ADAPTER_RANK + 1, ("attn_q",))
    misshapen = dict(tensors, **{"blk.0.attn_q.lora_b": np.zeros((5, 4), dtype=np.float32)})
    half = {"blk.0.attn_q.lora_a": tensors["blk.0.attn_q.lora_a"]}
    for bad, message in ((too_big, "rank 65"), (misshapen, "blk.0.attn_q.lora_b has shape"), (half, "without")):
        with pytest.raises(ValueError, match=f"adapter 1: .*{message}"):
            backend.pie_backend_adapter_load(1, bad, 3.0)
    with pytest.raises(ValueError, match="adapter 2 is not held"):
        backend.pie_backend_adapter_load(2, tensors, 1.0)
    np.testing.assert_array_equal(logits(backend, tokens, adapter=1), before)
    assert backend.pie_backend_adapter_save(1).keys() == tensors.keys()


def test_a_refused_zo_changes_nothing(spec, backend, tokens):
    backend.pie_backend_adapter_create(1, 2, 1.0)
    backend.pie_backend_adapter_zo(1, 0.2, np.array([5], dtype=np.int64), np.array([1.0], dtype=np.float32))
    before = logits(backend, tokens, adapter=1, seed=6)
    mean = backend.pie_backend_adapter_save(1)
    one, f32 = np.array([3], dtype=np.int64), np.array([1.0], dtype=np.float32)
    for sigma, seeds, coefficients, message in (
        (-0.1, one, f32, "sigma"),
        (float("inf"), one, f32, "sigma"),
        (0.1, np.array([3, 4], dtype=np.int64), f32, "one length"),
        (0.1, np.array([0], dtype=np.int64), f32, "nonzero"),
        (0.1, np.array([2.0]), f32, "nonzero int64"),
        (0.1, one, np.array([np.nan], dtype=np.float32), "finite"),
    ):
        with pytest.raises(ValueError, match=f"adapter 1: .*{message}"):
            backend.pie_backend_adapter_zo(1, sigma, seeds, coefficients)
    with pytest.raises(ValueError, match="adapter 8 is not held"):
        backend.pie_backend_adapter_zo(8, 0.1, one, f32)
    np.testing.assert_array_equal(logits(backend, tokens, adapter=1, seed=6), before)
    for name, a in backend.pie_backend_adapter_save(1).items():
        np.testing.assert_array_equal(a, mean[name], err_msg=name)
