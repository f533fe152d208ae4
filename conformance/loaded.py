"""A tiny model loaded into the backend under test (with the float64 oracle of it beside it).

Cases talk to the backend only through its hooks: they build
:class:`~pie_core.scheduler.request.ForwardRequest` objects, this module flattens them with the
core's assembler, calls ``pie_backend_forward`` and cuts the output back per request.

To compare numerics the harness *observes* every input row: with a LOGITS probe when the backend
declares ``"probes"``, else with an ARGMAX sample row (then only rows whose reference logits have
a clear winner are compared). Observation rows are appended after the case's own rows, so the
case's sample and probe numbering is unchanged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, NoReturn, Sequence

import numpy as np
import pytest

from pie_core.hookspec import BatchOutput, Capabilities, CopyKind, ForwardBatch, ProbeKind, SamplerKind
from pie_core.models.spec import ModelSpec
from pie_core.scheduler.assemble import assemble
from pie_core.scheduler.request import ForwardRequest, ProbeSpec, SampleSpec

from conformance.batches import KvSequence, request_slices
from conformance.tolerances import Tolerance

__all__ = ["LoadedModel", "Run", "not_supported"]

NOT_SUPPORTED = "not supported: "


def not_supported(reason: str) -> NoReturn:
    """Skip the running case; the report lists it as "not supported" with ``reason``."""
    pytest.skip(NOT_SUPPORTED + reason)


@dataclass(frozen=True, slots=True)
class Run:
    """One forward as the case sees it.

    ``samples[r]`` holds the tokens of request r's own sample rows, ``probes[r]`` its own probe
    values. ``logits[r]`` (``[n_r, vocab]``) or, for backends without probes, ``argmax[r]``
    (``[n_r]``) is the observation of every input row.
    """

    requests: tuple[ForwardRequest, ...]
    batch: ForwardBatch | None  # None for the reference, which runs the requests themselves
    output: BatchOutput | None
    samples: tuple[list[tuple[int, ...]], ...]
    probes: tuple[tuple[Any, ...], ...]
    logits: tuple[np.ndarray, ...] | None
    argmax: tuple[np.ndarray, ...] | None
    source: str = "backend"

    def pick(self, *indices: int) -> Run:
        """The same run seen through some of its requests only (for comparisons)."""

        def sub(items: tuple[Any, ...] | None) -> Any:
            return None if items is None else tuple(items[i] for i in indices)

        return dataclasses.replace(
            self,
            requests=sub(self.requests),
            samples=sub(self.samples),
            probes=sub(self.probes),
            logits=sub(self.logits),
            argmax=sub(self.argmax),
        )


def _observed(req: ForwardRequest, mode: str) -> ForwardRequest:
    rows = range(req.num_tokens)
    if mode == "logits":
        extra_p = tuple(ProbeSpec(index=i, kind=ProbeKind.LOGITS) for i in rows)
        return dataclasses.replace(req, probes=req.probes + extra_p)
    extra_s = tuple(SampleSpec(index=i, kind=SamplerKind.ARGMAX) for i in rows)
    return dataclasses.replace(req, samples=req.samples + extra_s)


class LoadedModel:
    """A model loaded into one backend instance, with fresh-page bookkeeping and comparisons.

    Attributes:
        spec: The model's architecture.
        hook: The bound backend's ``pm.hook``.
        caps: What the backend returned from ``pie_backend_load_model``.
        tolerance: Allowed drift from the reference for ``caps.dtype``.
        reference: The same model in the float64 oracle (:mod:`conformance.reference`), or None
            when numerics are not checked.
        label: Shown in messages ("backend" or "reference").
    """

    def __init__(
        self,
        spec: ModelSpec,
        hook: Any,
        caps: Capabilities,
        tolerance: Tolerance,
        reference: LoadedModel | None,
        label: str,
    ) -> None:
        self.spec = spec
        self.hook = hook
        self.caps = caps
        self.tolerance = tolerance
        self.reference = reference
        self.label = label
        self._page_order = np.random.default_rng(1234).permutation(caps.num_pages)
        self._next_page = 0
        self._next_host = 0
        self.mode = "logits" if "probes" in caps.features else "argmax"

    # -- capabilities -------------------------------------------------------------------------

    @property
    def page_size(self) -> int:
        return self.caps.page_size

    @property
    def vocab(self) -> int:
        return self.caps.vocab_size

    @property
    def features(self) -> frozenset[str]:
        return frozenset(self.caps.features)

    def require(self, *features: str) -> None:
        """Skip as "not supported" unless the backend declares every feature named."""
        missing = [f for f in features if f not in self.caps.features]
        if missing:
            not_supported(f"the backend does not declare {', '.join(repr(f) for f in missing)}")

    def require_reference(self) -> LoadedModel:
        """The reference model; skips as "not supported" when numerics are off."""
        if self.reference is None:
            not_supported("numeric surfaces are off for this backend (weightless, or --pie-numerics off)")
        return self.reference

    # -- pages ------------------------------------------------------------------------------

    def pages(self, n: int) -> list[int]:
        """``n`` distinct device page ids not handed out recently (scattered, non-contiguous)."""
        total = len(self._page_order)
        if n > total:
            raise ValueError(f"{n} pages asked of a pool of {total}")
        picked = self._page_order[(self._next_page + np.arange(n)) % total]
        self._next_page += n
        return [int(x) for x in picked]

    def contiguous_pages(self, n: int) -> list[int]:
        """``n`` consecutive device page ids (for the reference side of layout comparisons)."""
        start = (self._next_page * 7) % max(1, self.caps.num_pages - n)
        self._next_page += n
        return list(range(start, start + n))

    def host_pages(self, n: int) -> list[int]:
        """``n`` distinct host page ids."""
        total = self.caps.num_host_pages
        if n > total:
            raise ValueError(f"{n} host pages asked of a pool of {total}")
        out = [(self._next_host + i) % total for i in range(n)]
        self._next_host += n
        return out

    def pages_for(self, slots: int) -> list[int]:
        """Fresh pages enough for ``slots`` KV slots."""
        return self.pages(-(-slots // self.page_size))

    def sequence(self, slots: int, *, positions_offset: int = 0) -> KvSequence:
        """A new sequence on fresh pages that hold ``slots`` KV slots."""
        return KvSequence(self.pages_for(slots), self.page_size, positions_offset=positions_offset)

    # -- hooks ------------------------------------------------------------------------------

    def forward(self, requests: Sequence[ForwardRequest]) -> tuple[ForwardBatch, BatchOutput]:
        """Assemble ``requests`` (as the core does) and run them through ``pie_backend_forward``."""
        batch = assemble(list(requests), self.caps.vocab_size)
        return batch, self.forward_batch(batch)

    def forward_batch(self, batch: ForwardBatch) -> BatchOutput:
        """Run one already-built batch."""
        out = self.hook.pie_backend_forward(batch=batch)
        assert isinstance(out, BatchOutput), (
            f"pie_backend_forward returned {type(out).__name__}, not a BatchOutput"
        )
        return out

    def copy_pages(self, kind: CopyKind, src: Sequence[int], dst: Sequence[int]) -> None:
        """``pie_backend_copy_pages`` with int32 id arrays."""
        self.hook.pie_backend_copy_pages(
            kind=kind, src=np.asarray(src, dtype=np.int32), dst=np.asarray(dst, dtype=np.int32)
        )

    def run(self, requests: Sequence[ForwardRequest], *, observe: bool = True) -> Run:
        """Forward ``requests`` and cut the output per request (observing every row if asked)."""
        own = list(requests)
        sent = [_observed(r, self.mode) for r in own] if observe else own
        batch, output = self.forward(sent)
        cut = request_slices(sent, output)
        samples, probes = [], []
        logits: list[np.ndarray] = []
        argmax: list[np.ndarray] = []
        for r, (rows, values) in zip(own, cut):
            samples.append(rows[: len(r.samples)])
            probes.append(values[: len(r.probes)])
            if observe and self.mode == "logits":
                logits.append(np.stack([np.asarray(v, dtype=np.float32) for v in values[len(r.probes) :]]))
            elif observe:
                argmax.append(np.array([t[0] for t in rows[len(r.samples) :]], dtype=np.int64))
        return Run(
            requests=tuple(sent),
            batch=batch,
            output=output,
            samples=tuple(samples),
            probes=tuple(probes),
            logits=tuple(logits) if observe and self.mode == "logits" else None,
            argmax=tuple(argmax) if observe and self.mode == "argmax" else None,
            source=self.label,
        )

    def both(
        self, requests: Sequence[ForwardRequest], reference_requests: Sequence[ForwardRequest] | None = None
    ) -> tuple[Run, Run]:
        """Run ``requests`` here and on the reference (``reference_requests`` when they differ)."""
        ref = self.require_reference()
        mine = self.run(requests)
        theirs = ref.run(requests if reference_requests is None else reference_requests)
        return mine, theirs

    def copy_both(self, kind: CopyKind, src: Sequence[int], dst: Sequence[int]) -> None:
        """The same page copy here and on the reference."""
        self.copy_pages(kind, src, dst)
        self.require_reference().copy_pages(kind, src, dst)

    # -- comparisons ------------------------------------------------------------------------

    def assert_close(self, actual: Run, expected: Run, what: str) -> None:
        """Every observed row of ``actual`` matches ``expected`` within the declared tolerance.

        Raises:
            AssertionError: Naming ``what``, the request, row and token, and the size of the gap.
        """
        assert len(actual.requests) == len(expected.requests), "runs of different batches compared"
        for r in range(len(actual.requests)):
            where = f"{what}: request {r}"
            theirs = "the float64 oracle" if expected.source == "reference" else "the backend's own other run"
            if actual.logits is not None and expected.logits is not None:
                self._assert_logits(actual.logits[r], expected.logits[r], where, theirs)
            elif expected.logits is not None and actual.argmax is not None:
                self._assert_argmax(actual.argmax[r], expected.logits[r], where, theirs)
            elif actual.argmax is not None and expected.argmax is not None:
                assert np.array_equal(actual.argmax[r], expected.argmax[r]), (
                    f"{what}: request {r}: argmax tokens {actual.argmax[r].tolist()} "
                    f"!= {expected.argmax[r].tolist()}"
                )
            else:
                raise AssertionError(f"{what}: nothing observed to compare")

    def _assert_logits(self, actual: np.ndarray, expected: np.ndarray, what: str, theirs: str) -> None:
        assert actual.shape == expected.shape, f"{what}: logits of shape {actual.shape}, expected {expected.shape}"
        bad = self.tolerance.bad(actual, expected)
        if bad.any():
            row, tok = (int(x) for x in np.argwhere(bad)[0])
            with np.errstate(invalid="ignore"):
                gap = float(np.nanmax(np.where(bad, np.abs(actual.astype(np.float64) - expected), 0.0)))
            raise AssertionError(
                f"{what}: logits differ from {theirs} in {int(bad.sum())} of {bad.size} "
                f"entries (first at row {row}, token {tok}: {actual[row, tok]:.5g} vs "
                f"{expected[row, tok]:.5g}; largest gap {gap:.3g}; allowed {self.tolerance})"
            )

    def _assert_argmax(self, tokens: np.ndarray, expected: np.ndarray, what: str, theirs: str) -> None:
        top2 = np.sort(expected, axis=1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > 2 * (self.tolerance.atol + self.tolerance.rtol * np.abs(top2[:, 1]))
        want = np.argmax(expected, axis=1)
        wrong = clear & (tokens != want)
        if wrong.any():
            row = int(np.flatnonzero(wrong)[0])
            raise AssertionError(
                f"{what}: argmax at row {row} is token {int(tokens[row])}; {theirs} gives "
                f"{int(want[row])} by a clear margin"
            )

    def own_logits(self, run: Run) -> tuple[np.ndarray, ...]:
        """The logits the backend sampled from in ``run`` (its own LOGITS probes).

        Without probes the reference's logits for the same requests stand in (numeric backends
        only); a weightless backend without probes cannot be checked and is "not supported".
        """
        if run.logits is not None:
            return run.logits
        ref = self.require_reference()
        own = [dataclasses.replace(r, samples=(), probes=()) for r in run.requests]
        rerun = ref.run(own)
        assert rerun.logits is not None
        return rerun.logits
