"""The contract's adapter tensors and zo noise (pie_core.backend_kit.lora): names, checks, and noise that
must never change between versions, since every backend and every saved experiment relies on it."""

from __future__ import annotations

import numpy as np
import pytest

from pie_core.backend_kit import lora
from pie_core.models.spec import ModelSpec
from conformance.models import tiny_spec


def test_the_noise_is_pinned_to_its_definition():
    # Golden values: a change in NumPy's Philox or float32 normal draw would change every zo run.
    np.testing.assert_array_equal(
        lora.zo_noise(17, 3, (2, 3)),
        np.array([[-1.101115345954895, -1.3914300203323364, 0.6534042954444885],
                  [-1.5359032154083252, -1.4187853336334229, -0.5977587103843689]], dtype=np.float32),
    )
    np.testing.assert_array_equal(lora.zo_noise(-5, 0, (3,)),
                                  np.array([0.5485390424728394, -1.4624873399734497, 0.21985769271850586], np.float32))


def test_noise_depends_on_seed_and_tensor_and_is_standard_normal():
    a = lora.zo_noise(1, 0, (20000,))
    assert abs(float(a.mean())) < 0.03 and abs(float(a.std()) - 1) < 0.03
    assert not np.array_equal(a[:10], lora.zo_noise(2, 0, (10,)))
    assert not np.array_equal(a[:10], lora.zo_noise(1, 1, (10,)))
    np.testing.assert_array_equal(a[:10], lora.zo_noise(1, 0, (10,)))  # element e does not depend on size


def test_tensor_index_follows_the_canonical_order():
    spec = tiny_spec("qwen2")
    names = lora.tensor_names(spec)
    assert [lora.tensor_index(n) for n in names] == list(range(len(names)))
    for bad in ("blk.0.attn_q.weight", "blk.x.attn_q.lora_a", "blk.0.lm_head.lora_a", "layers.0.attn_q.lora_a"):
        with pytest.raises(ValueError):
            lora.tensor_index(bad)


def _adapter(spec: ModelSpec, rank: int, targets=("attn_q", "ffn_down")) -> dict[str, np.ndarray]:
    out = {}
    for t in targets:
        rows, cols = lora.target_shape(spec, t)
        out[lora.tensor_name(0, t, "a")] = np.ones((rank, cols), np.float32)
        out[lora.tensor_name(0, t, "b")] = np.ones((rows, rank), np.float32)
    return out


def test_check_tensors_returns_the_rank_and_refuses_each_broken_rule():
    spec = tiny_spec("qwen2")
    good = _adapter(spec, 3)
    assert lora.check_tensors(spec, good, max_rank=8) == 3
    cases = {
        "half missing": {k: v for k, v in good.items() if not k.endswith("attn_q.lora_b")},
        "wrong shape": {**good, "blk.0.attn_q.lora_b": np.ones((5, 3), np.float32)},
        "float64": {**good, "blk.0.attn_q.lora_a": good["blk.0.attn_q.lora_a"].astype(np.float64)},
        "two ranks": {**_adapter(spec, 3, ("attn_q",)), **_adapter(spec, 2, ("ffn_down",))},
        "nan": {**good, "blk.0.ffn_down.lora_a": np.full_like(good["blk.0.ffn_down.lora_a"], np.nan)},
        "layer out of range": {k.replace("blk.0.", f"blk.{spec.num_layers}."): v for k, v in good.items()},
        "empty": {},
    }
    for what, tensors in cases.items():
        with pytest.raises(ValueError):
            lora.check_tensors(spec, tensors, max_rank=8)
            pytest.fail(what)
    with pytest.raises(ValueError, match="rank 3"):
        lora.check_tensors(spec, good, max_rank=2)


def test_perturbed_and_moved_follow_the_noise():
    spec = tiny_spec("qwen2")
    mean = _adapter(spec, 2)
    seeds, coeffs = np.array([4, 9], np.int64), np.array([0.5, -0.25], np.float32)
    moved = lora.moved(mean, seeds, coeffs)
    pert = lora.perturbed(mean, 0.1, 9)
    for name, a in mean.items():
        i = lora.tensor_index(name)
        np.testing.assert_allclose(moved[name], a + 0.5 * lora.zo_noise(4, i, a.shape) - 0.25 * lora.zo_noise(9, i, a.shape),
                                   rtol=1e-6)
        np.testing.assert_allclose(pert[name], a + np.float32(0.1) * lora.zo_noise(9, i, a.shape), rtol=1e-6)
        assert np.array_equal(mean[name], a)  # inputs untouched
