"""LoRA adapters and zeroth-order (zo) perturbations, where declared.

The oracle for adapter numerics is the float64 oracle loaded with the adapter merged into its
weights (``W + scaling * B @ A``, :mod:`conformance.adapters`), which runs no adapter code; for
zo it is the same merge of :func:`pie_core.backend_kit.lora.perturbed`, the noise the contract defines, so
a backend drawing other numbers fails. Every case destroys the adapters it made.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np
import pytest

from conformance.adapters import random_adapter
from conformance.batches import kv_request
from conformance.harness import Harness
from conformance.loaded import LoadedModel, Run
from pie_core.backend_kit import lora

SURFACE = "adapters"

_SCALING = 0.5
_SIGMA = 0.05
_NO_SEEDS = np.zeros(0, dtype=np.int64)
_NO_COEFFS = np.zeros(0, dtype=np.float32)


@pytest.fixture
def base(pie_conformance: Harness) -> LoadedModel:
    """The primary model with its reference (adapter checks do not depend on the architecture)."""
    pie_conformance.require_numerics()
    return pie_conformance.model()


class Adapters:
    """Adapters made on one backend for one case, destroyed at its end."""

    def __init__(self, model: LoadedModel) -> None:
        self.model = model
        self.held: list[int] = []

    def load(self, tensors: dict[str, np.ndarray], scaling: float = _SCALING) -> int:
        adapter_id = len(self.held)
        rank = next(a.shape[0] for n, a in tensors.items() if n.endswith("lora_a"))
        self.model.hook.pie_backend_adapter_create(adapter_id=adapter_id, rank=rank, scaling=scaling)
        self.held.append(adapter_id)
        self.model.hook.pie_backend_adapter_load(adapter_id=adapter_id, tensors=tensors, scaling=scaling)
        return adapter_id

    def destroy_all(self) -> None:
        for adapter_id in self.held:
            self.model.hook.pie_backend_adapter_destroy(adapter_id=adapter_id)
        self.held.clear()


@pytest.fixture
def adapters(base: LoadedModel) -> Iterator[Adapters]:
    base.require("adapters")
    made = Adapters(base)
    yield made
    made.destroy_all()


def _request(model: LoadedModel, prompt: np.ndarray, adapter_id: int = -1, zo_seed: int = 0):
    req = kv_request(prompt, model.pages_for(len(prompt)), model.page_size)
    return dataclasses.replace(req, adapter_id=adapter_id, zo_seed=zo_seed)


def _merged_run(pie_conformance: Harness, model: LoadedModel, tensors, scaling: float, prompt: np.ndarray) -> Run:
    ref = pie_conformance.merged_reference(model, tensors, scaling)
    return ref.run([_request(ref, prompt)])


def test_requests_without_an_adapter_run_the_base_model(base: LoadedModel, rng: np.random.Generator) -> None:
    base.require("adapters")
    req = kv_request(rng.integers(0, base.vocab, 6), base.pages_for(6), base.page_size)
    mine, ref = base.both([dataclasses.replace(req, adapter_id=-1)], [req])
    base.assert_close(mine, ref, "adapter_id -1")


def test_an_adapter_the_backend_does_not_hold_is_refused(model: LoadedModel, rng: np.random.Generator) -> None:
    model.require("adapters")
    req = kv_request(rng.integers(0, model.vocab, 3), model.pages_for(3), model.page_size)
    with pytest.raises(Exception):
        model.run([dataclasses.replace(req, adapter_id=model.caps.max_adapters - 1)])


def test_an_adapter_equals_its_weights_merged(
    pie_conformance: Harness, base: LoadedModel, adapters: Adapters, rng: np.random.Generator
) -> None:
    tensors = random_adapter(base.spec, rank=4, seed=11)
    adapter_id = adapters.load(tensors)
    prompt = rng.integers(0, base.vocab, 7)
    mine = base.run([_request(base, prompt, adapter_id)])
    base.assert_close(mine, _merged_run(pie_conformance, base, tensors, _SCALING, prompt), "a rank-4 adapter")
    plain = base.require_reference().run([_request(base.require_reference(), prompt)])
    assert base.tolerance.bad(mine.logits[0], plain.logits[0]).any(), "the adapter left the logits unchanged"


def test_an_adapter_of_some_targets_equals_its_weights_merged(
    pie_conformance: Harness, base: LoadedModel, adapters: Adapters, rng: np.random.Generator
) -> None:
    tensors = random_adapter(base.spec, rank=2, seed=12, targets=("attn_q", "attn_v", "ffn_down"), layers=[0])
    adapter_id = adapters.load(tensors, scaling=2.0)
    prompt = rng.integers(0, base.vocab, 5)
    mine = base.run([_request(base, prompt, adapter_id)])
    base.assert_close(mine, _merged_run(pie_conformance, base, tensors, 2.0, prompt), "q, v and down of layer 0")


def test_a_mixed_batch_equals_each_adapter_merged(
    pie_conformance: Harness, base: LoadedModel, adapters: Adapters, rng: np.random.Generator
) -> None:
    made = [random_adapter(base.spec, rank=r, seed=20 + r) for r in (1, 2, 4)]
    ids = [adapters.load(t) for t in made]
    prompts = [rng.integers(0, base.vocab, n) for n in (4, 1, 6, 3, 5)]
    order = [ids[2], -1, ids[0], ids[1], ids[2]]  # a repeated adapter, and a plain request between
    mine = base.run([_request(base, p, a) for p, a in zip(prompts, order)])
    for r, (prompt, adapter_id) in enumerate(zip(prompts, order)):
        if adapter_id < 0:
            ref = base.require_reference()
            expected = ref.run([_request(ref, prompt)])
        else:
            expected = _merged_run(pie_conformance, base, made[ids.index(adapter_id)], _SCALING, prompt)
        base.assert_close(mine.pick(r), expected, f"request {r} (adapter {adapter_id}) of a mixed batch")


def test_save_returns_what_load_got(base: LoadedModel, adapters: Adapters) -> None:
    tensors = random_adapter(base.spec, rank=3, seed=13, targets=("attn_k", "ffn_up"))
    adapter_id = adapters.load(tensors)
    saved = base.hook.pie_backend_adapter_save(adapter_id=adapter_id)
    assert sorted(saved) == sorted(tensors)
    for name, array in tensors.items():
        np.testing.assert_array_equal(saved[name], array, err_msg=name)


def test_a_bad_load_is_refused_and_changes_nothing(base: LoadedModel, adapters: Adapters) -> None:
    tensors = random_adapter(base.spec, rank=2, seed=14, targets=("attn_q",))
    adapter_id = adapters.load(tensors)
    wrong = dict(tensors)
    wrong[lora.tensor_name(0, "attn_q", "b")] = np.zeros((3, 2), dtype=np.float32)
    with pytest.raises(ValueError):
        base.hook.pie_backend_adapter_load(adapter_id=adapter_id, tensors=wrong, scaling=_SCALING)
    saved = base.hook.pie_backend_adapter_save(adapter_id=adapter_id)
    for name, array in tensors.items():
        np.testing.assert_array_equal(saved[name], array, err_msg=name)
    with pytest.raises(ValueError):
        base.hook.pie_backend_adapter_create(adapter_id=adapter_id, rank=2, scaling=1.0)  # held already


def test_zo_seed_without_an_adapter_is_refused(base: LoadedModel, rng: np.random.Generator) -> None:
    base.require("zo")
    with pytest.raises(Exception):
        base.run([_request(base, rng.integers(0, base.vocab, 3), -1, zo_seed=5)])


def _zo_adapter(base: LoadedModel, adapters: Adapters) -> tuple[int, dict[str, np.ndarray]]:
    base.require("zo")
    tensors = random_adapter(base.spec, rank=2, seed=15)
    adapter_id = adapters.load(tensors)
    base.hook.pie_backend_adapter_zo(adapter_id=adapter_id, sigma=_SIGMA, seeds=_NO_SEEDS, coefficients=_NO_COEFFS)
    return adapter_id, tensors


def test_a_zo_pass_runs_the_contracts_noise(
    pie_conformance: Harness, base: LoadedModel, adapters: Adapters, rng: np.random.Generator
) -> None:
    adapter_id, tensors = _zo_adapter(base, adapters)
    prompt = rng.integers(0, base.vocab, 5)
    first = base.run([_request(base, prompt, adapter_id, zo_seed=17)])
    again = base.run([_request(base, prompt, adapter_id, zo_seed=17)])
    other = base.run([_request(base, prompt, adapter_id, zo_seed=18)])
    base.assert_close(again, first, "the same zo seed twice")
    assert base.tolerance.bad(first.logits[0], other.logits[0]).any(), "zo seeds 17 and 18 gave the same logits"
    expected = _merged_run(pie_conformance, base, lora.perturbed(tensors, _SIGMA, 17), _SCALING, prompt)
    base.assert_close(first, expected, "zo seed 17 against the contract's noise merged")


def test_zo_requests_leave_their_neighbours_alone(
    pie_conformance: Harness, base: LoadedModel, adapters: Adapters, rng: np.random.Generator
) -> None:
    adapter_id, tensors = _zo_adapter(base, adapters)
    prompt = rng.integers(0, base.vocab, 5)
    mine = base.run([_request(base, prompt, adapter_id, zo_seed=23), _request(base, prompt, adapter_id),
                     _request(base, prompt)])
    base.assert_close(mine.pick(1), _merged_run(pie_conformance, base, tensors, _SCALING, prompt),
                      "the adapter's mean beside a zo request")
    ref = base.require_reference()
    base.assert_close(mine.pick(2), ref.run([_request(ref, prompt)]), "a plain request beside a zo request")


def test_a_zo_update_moves_the_mean_as_the_contract_says(base: LoadedModel, adapters: Adapters) -> None:
    adapter_id, tensors = _zo_adapter(base, adapters)
    seeds = np.array([3, -9, 1 << 40], dtype=np.int64)
    coefficients = np.array([0.02, -0.01, 0.005], dtype=np.float32)
    base.hook.pie_backend_adapter_zo(adapter_id=adapter_id, sigma=_SIGMA, seeds=seeds, coefficients=coefficients)
    saved = base.hook.pie_backend_adapter_save(adapter_id=adapter_id)
    for name, expected in lora.moved(tensors, seeds, coefficients).items():
        np.testing.assert_allclose(saved[name], expected, rtol=1e-6, atol=1e-7, err_msg=name)
