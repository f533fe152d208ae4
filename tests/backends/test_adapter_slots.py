"""More adapters than the backend holds: idle ones parked on the host, paged in by use.

The slot map is checked with a recording fake (which adapter goes when, what a page-in restores)
and then on the NumPy backend, whose adapter passes must still equal the merged weights after
their adapters were parked and paged back in."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from backend_testkit import load_cpu, tiny_spec
from pie_core.backend.adapter_slots import AdapterSlots, SlotCalls
from pie_core.errors import BackendError
from test_cpu_adapters import logits, merged_logits, random_adapter

NO_STEP = (np.zeros(0, np.int64), np.zeros(0, np.float32))


class Recorder:
    """Slot calls that remember each slot's tensors, rank, scaling and sigma, and log every call."""

    def __init__(self) -> None:
        self.log: list[tuple] = []
        self.slots: dict[int, dict] = {}

    def calls(self) -> SlotCalls:
        def create(slot, rank, scaling):
            assert slot not in self.slots, f"slot {slot} created twice"
            self.slots[slot] = {"rank": rank, "scaling": scaling, "tensors": {"w": np.zeros(1)}, "sigma": 0.0}
            self.log.append(("create", slot))

        def load(slot, tensors, scaling):
            self.slots[slot].update(tensors={k: v.copy() for k, v in tensors.items()}, scaling=scaling)
            self.log.append(("load", slot))

        def save(slot):
            self.log.append(("save", slot))
            return self.slots[slot]["tensors"]

        def destroy(slot):
            del self.slots[slot]
            self.log.append(("destroy", slot))

        def zo(slot, sigma, seeds, coefficients):
            self.slots[slot]["sigma"] = sigma
            self.log.append(("zo", slot))

        return SlotCalls(create, load, save, destroy, zo)


def _weights(value: float) -> dict[str, np.ndarray]:
    return {"w": np.full(1, value)}


def test_the_least_recently_used_adapter_is_parked_and_comes_back_whole():
    rec = Recorder()
    slots = AdapterSlots(2, rec.calls())
    for adapter in (10, 11):
        slots.create(adapter, 4, 0.5)
        slots.load(adapter, _weights(adapter), 0.5)
    slots.zo(10, 0.25, *NO_STEP)
    slots.batch(np.array([11]))  # 10 is now the least recently used
    slots.create(12, 8, 2.0)  # no slot free: 10 goes to the host
    assert slots.resident() == [11, 12] and slots.parks == 1
    assert slots.save(10)["w"].tolist() == [10.0]  # answered from the host, no page-in
    assert slots.page_ins == 0
    mapped = slots.batch(np.array([10, -1, 11, 10]))  # 12 is the one the batch does not name
    assert slots.resident() == [10, 11] and slots.page_ins == 1
    assert mapped[1] == -1 and mapped[0] == mapped[3] != mapped[2]
    back = rec.slots[int(mapped[0])]
    assert back["tensors"]["w"].tolist() == [10.0] and back["scaling"] == 0.5 and back["sigma"] == 0.25
    assert slots.save(12)["w"].tolist() == [0.0]  # parked straight after its create: zeros kept


def test_a_batch_never_loses_an_adapter_it_names_and_too_many_are_refused():
    rec = Recorder()
    slots = AdapterSlots(2, rec.calls())
    for adapter in (1, 2, 3):
        slots.create(adapter, 4, 1.0)
        slots.load(adapter, _weights(adapter), 1.0)
    for pair in ([1, 2], [2, 3], [3, 1], [1, 3]):
        mapped = slots.batch(np.array(pair))
        assert sorted(slots.resident()) == sorted(pair)
        assert [rec.slots[int(s)]["tensors"]["w"][0] for s in mapped] == pair
    with pytest.raises(BackendError, match="names 3 adapters; the backend holds 2"):
        slots.batch(np.array([1, 2, 3]))
    with pytest.raises(BackendError, match="no adapter with id 9"):
        slots.batch(np.array([9]))


def test_destroying_a_parked_adapter_touches_no_slot():
    rec = Recorder()
    slots = AdapterSlots(1, rec.calls())
    slots.create(1, 4, 1.0)
    slots.create(2, 4, 1.0)  # parks 1
    rec.log.clear()
    slots.destroy(1)
    assert rec.log == [] and slots.resident() == [2]
    with pytest.raises(BackendError, match="no adapter with id 1"):
        slots.save(1)


def test_parked_adapters_of_a_real_backend_compute_what_their_weights_say():
    spec = tiny_spec("qwen2")
    backend = load_cpu(spec, page_size=4)
    slots = AdapterSlots(2, SlotCalls(
        create=lambda s, r, sc: backend.pie_backend_adapter_create(adapter_id=s, rank=r, scaling=sc),
        load=lambda s, t, sc: backend.pie_backend_adapter_load(adapter_id=s, tensors=t, scaling=sc),
        save=lambda s: backend.pie_backend_adapter_save(adapter_id=s),
        destroy=lambda s: backend.pie_backend_adapter_destroy(adapter_id=s),
        zo=lambda s, sigma, seeds, c: backend.pie_backend_adapter_zo(adapter_id=s, sigma=sigma, seeds=seeds, coefficients=c),
    ))
    tokens = [3, 1, 4, 1, 5, 9]
    adapters = {i: random_adapter(spec, 4, seed=i) for i in (0, 1, 2, 3)}
    for i, tensors in adapters.items():
        slots.create(i, 4, 0.5)
        slots.load(i, tensors, 0.5)
    assert slots.parks == 2
    for i in (0, 2, 1, 3, 0):  # every one paged in at least once, in an order that parks the rest
        [slot] = slots.batch(np.array([i])).tolist()
        np.testing.assert_allclose(logits(backend, tokens, adapter=slot), merged_logits(spec, tokens, adapters[i], 0.5),
                                   atol=1e-4)
    assert slots.page_ins >= 3
    del backend
    gc.collect()
