"""More adapters than a backend holds: the idle ones parked on the host, paged in by use (S-LoRA).

The engine names adapters by its own ids, as many as its users create; a backend holds
``max_adapters`` at once, in its slots ``0 .. max_adapters - 1``. :class:`AdapterSlots` maps the
one onto the other on the worker's thread, where every backend call runs in order, so nothing on
the event loop ever sees a slot change under it:

- a batch's adapters are made resident just before the batch runs; when slots run short, the
  least recently used adapter the batch does not name is parked first: its mean weights are saved
  to host memory and its slot is freed;
- every adapter operation (load, save, zo) pages its adapter in first, except a save of a parked
  adapter, which is answered from host memory;
- a parked adapter keeps what re-creating it takes: its rank, scaling, zo sigma and mean weights.

The batcher never puts more distinct adapters in one batch than the backend holds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pie_core.errors import BackendError

__all__ = ["AdapterSlots", "SlotCalls"]

_NO_SEEDS = np.zeros(0, np.int64)
_NO_COEFFS = np.zeros(0, np.float32)


@dataclass(frozen=True, slots=True)
class SlotCalls:
    """The backend's adapter hooks, called with slot ids."""

    create: Callable[[int, int, float], None]
    load: Callable[[int, dict[str, np.ndarray], float], None]
    save: Callable[[int], dict[str, np.ndarray]]
    destroy: Callable[[int], None]
    zo: Callable[[int, float, np.ndarray, np.ndarray], None]


@dataclass(slots=True)
class _Adapter:
    rank: int
    scaling: float
    sigma: float | None = None  # the zo sigma set last (None: never set)
    slot: int | None = None  # None: parked
    parked: dict[str, np.ndarray] | None = None
    used: int = 0  # when it was last used (a counter): the least recently used goes first


class AdapterSlots:
    """Engine adapter ids onto a backend's ``capacity`` slots (see the module doc).

    Raises (every method):
        BackendError: An id the engine never created, or a batch naming more adapters than
            there are slots.
    """

    def __init__(self, capacity: int, calls: SlotCalls) -> None:
        self.capacity = capacity
        self._calls = calls
        self._adapters: dict[int, _Adapter] = {}
        self._slots: dict[int, int] = {}  # slot -> adapter id
        self._clock = 0
        self.parks = 0
        self.page_ins = 0

    def resident(self) -> list[int]:
        """The adapter ids in slots now."""
        return sorted(self._slots.values())

    def create(self, adapter_id: int, rank: int, scaling: float) -> None:
        if adapter_id in self._adapters:
            raise BackendError(f"adapter id {adapter_id} exists already")
        slot = self._free_slot(keep=())
        self._calls.create(slot, rank, scaling)
        self._adapters[adapter_id] = _Adapter(rank, scaling)
        self._place(adapter_id, slot)

    def load(self, adapter_id: int, tensors: dict[str, np.ndarray], scaling: float) -> None:
        self._calls.load(self._resident(adapter_id, keep=()), tensors, scaling)
        self._adapters[adapter_id].scaling = scaling

    def save(self, adapter_id: int) -> dict[str, np.ndarray]:
        adapter = self._get(adapter_id)
        if adapter.slot is None:
            assert adapter.parked is not None
            return {name: t.copy() for name, t in adapter.parked.items()}
        return self._calls.save(adapter.slot)

    def zo(self, adapter_id: int, sigma: float, seeds: np.ndarray, coefficients: np.ndarray) -> None:
        self._calls.zo(self._resident(adapter_id, keep=()), sigma, seeds, coefficients)
        self._adapters[adapter_id].sigma = sigma

    def destroy(self, adapter_id: int) -> None:
        adapter = self._get(adapter_id)
        if adapter.slot is not None:
            self._calls.destroy(adapter.slot)
            del self._slots[adapter.slot]
        del self._adapters[adapter_id]

    def batch(self, adapter_ids: np.ndarray) -> np.ndarray:
        """A batch's per-request adapter ids (-1: none) as slot ids, every adapter made resident."""
        named = {int(a) for a in np.unique(adapter_ids[adapter_ids >= 0])}
        if len(named) > self.capacity:
            raise BackendError(f"a batch names {len(named)} adapters; the backend holds {self.capacity} at once")
        slots = adapter_ids.copy()
        for adapter_id in named:
            slots[adapter_ids == adapter_id] = self._resident(adapter_id, keep=named)
        return slots

    def _get(self, adapter_id: int) -> _Adapter:
        adapter = self._adapters.get(adapter_id)
        if adapter is None:
            raise BackendError(f"no adapter with id {adapter_id} on this backend")
        return adapter

    def _resident(self, adapter_id: int, keep: set[int] | tuple[()]) -> int:
        adapter = self._get(adapter_id)
        if adapter.slot is None:
            slot = self._free_slot(keep)
            assert adapter.parked is not None
            self._calls.create(slot, adapter.rank, adapter.scaling)
            self._calls.load(slot, adapter.parked, adapter.scaling)
            if adapter.sigma is not None:
                self._calls.zo(slot, adapter.sigma, _NO_SEEDS, _NO_COEFFS)
            adapter.parked = None
            self._place(adapter_id, slot)
            self.page_ins += 1
        self._clock += 1
        adapter.used = self._clock
        assert adapter.slot is not None
        return adapter.slot

    def _place(self, adapter_id: int, slot: int) -> None:
        adapter = self._adapters[adapter_id]
        adapter.slot = slot
        self._slots[slot] = adapter_id
        self._clock += 1
        adapter.used = self._clock

    def _free_slot(self, keep: set[int] | tuple[()]) -> int:
        for slot in range(self.capacity):
            if slot not in self._slots:
                return slot
        idle = [a for a in self._slots.values() if a not in keep]
        if not idle:
            raise BackendError(f"every one of the backend's {self.capacity} adapter slots is needed at once")
        victim = min(idle, key=lambda a: self._adapters[a].used)
        adapter = self._adapters[victim]
        assert adapter.slot is not None
        slot = adapter.slot
        adapter.parked = {name: np.array(t, copy=True) for name, t in self._calls.save(slot).items()}
        self._calls.destroy(slot)
        del self._slots[slot]
        adapter.slot = None
        self.parks += 1
        return slot
