"""The suite's view of one backend: how it is found, bound, loaded, and compared.

A backend is named either by its entry point in ``pie.backends`` (``cpu``, ``torch``, ...) or,
for a plugin not installed yet, by an import path ``package.module:Factory``. Every model the
cases need is loaded into a fresh instance of the backend and, when numerics are checked, into
the suite's own float64 oracle (:mod:`conformance.oracle`, no backend's code) with the same
random weights.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import pluggy
import pytest

from pie_core.errors import ContractError, NotFound, Unsupported
from pie_core.hookspec import BackendInfo, BackendOptions, Capabilities
from pie_core.models.spec import ModelSpec
from pie_core.plugins import available_backends, bind_plugin

from conformance.loaded import LoadedModel, not_supported
from conformance.adapters import merged
from conformance.models import ARCHITECTURES, random_weights, tiny_spec, with_twin
from conformance.oracle import Oracle
from conformance.reference import ReferenceModel
from conformance.tolerances import Tolerance, tolerance_for

__all__ = ["SuiteOptions", "Harness", "require_installed", "resolve_factory", "KNOWN_FEATURES"]

KNOWN_FEATURES = frozenset(
    {"custom_mask", "logit_mask", "probes", "embeddings", "adapters", "zo", "offload", "system_speculation"}
)
"""Feature names the contract defines (a misspelt feature would silently never be used)."""

DEFAULT_KV_PAGES = 512
DEFAULT_HOST_PAGES = 16


@dataclass(frozen=True, slots=True)
class SuiteOptions:
    """What the suite was asked to check.

    Attributes:
        backend: Entry-point name or ``module:factory`` import path.
        device: ``BackendOptions.device`` for the backend under test.
        dtype: ``BackendOptions.dtype`` (None: the options' default).
        page_size: Slots per KV page.
        archs: Architectures the numeric cases run on.
        numerics: ``"auto"`` (on unless the backend is the weightless dummy), ``"on"`` or ``"off"``.
        atol, rtol: Override the declared tolerance of the backend's dtype.
        extra: ``BackendOptions.extra`` for the backend under test (``--backend-option
            KEY=VALUE``).
    """

    backend: str
    device: str = "cpu"
    dtype: str | None = None
    page_size: int = 16
    archs: tuple[str, ...] = ARCHITECTURES
    numerics: str = "auto"
    atol: float | None = None
    rtol: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = [a for a in self.archs if a not in ARCHITECTURES]
        if unknown or not self.archs:
            raise ValueError(f"--pie-arch must name architectures among {', '.join(ARCHITECTURES)}, got {unknown}")
        if self.numerics not in ("auto", "on", "off"):
            raise ValueError(f"--pie-numerics must be auto, on or off, not {self.numerics!r}")
        if self.page_size < 1:
            raise ValueError(f"--pie-page-size must be >= 1, got {self.page_size}")


def require_installed(name: str) -> None:
    """Check that an entry-point name belongs to an installed backend (an import path always passes).

    Raises:
        NotFound: No such entry point (the message lists the installed ones).
    """
    if ":" in name:
        return
    backends = available_backends()
    if name not in backends:
        names = ", ".join(sorted(backends)) or "none"
        raise NotFound(f"unknown backend {name!r}; installed backends: {names}")


def resolve_factory(name: str) -> Callable[[], Any]:
    """The zero-argument factory of a backend named by entry point or ``module:attr`` path.

    Raises:
        NotFound: No such entry point (the message lists the installed ones).
        ImportError, AttributeError: The import path does not resolve.
    """
    require_installed(name)
    if ":" in name:
        module, _, attr = name.partition(":")
        target: Any = importlib.import_module(module)
        for part in attr.split("."):
            target = getattr(target, part)
        return target  # type: ignore[no-any-return]
    return available_backends()[name].entry_point.load()  # type: ignore[no-any-return]


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return "; ".join(line.strip() for line in text.splitlines() if line.strip()) or "(no message)"


class Harness:
    """Binds the backend under test and loads the tiny models the cases use (each once)."""

    def __init__(self, options: SuiteOptions) -> None:
        self.options = options
        self._factory: Callable[[], Any] | None = None
        self._models: dict[tuple[Any, ...], LoadedModel] = {}
        self._info: BackendInfo | None = None
        self.error: str | None = None
        """Why the backend did not bind or load (set by :meth:`check`); the cases then do not run."""

    @property
    def name(self) -> str:
        return self.options.backend

    def factory(self) -> Callable[[], Any]:
        """The backend's factory (resolved once)."""
        if self._factory is None:
            self._factory = resolve_factory(self.options.backend)
        return self._factory

    def bind(self) -> pluggy.PluginManager:
        """A fresh backend instance, bound and validated against the hook spec."""
        return bind_plugin(self.factory()(), self.name)

    def info(self) -> BackendInfo:
        if self._info is None:
            self._info = self.bind().hook.pie_backend_info()
        return self._info

    def check(self) -> str | None:
        """Bind the backend and load its first tiny model once, before any case runs.

        A backend that cannot do this would fail every case with the same traceback; the suite
        reports this one line instead (and :attr:`error` keeps it).

        Returns:
            None when the backend binds and loads (or declines the architecture with
            ``Unsupported``, which the cases report as not supported), else one line naming the
            backend and the cause.
        """
        self.error = self._first_failure()
        return self.error

    def _first_failure(self) -> str | None:
        try:
            self.info()
        except ContractError as exc:  # its message names the backend and the hook or version
            return _one_line(exc)
        except Exception as exc:
            return f"backend {self.name!r} did not load: {type(exc).__name__}: {_one_line(exc)}"
        arch = self.options.archs[0]
        try:
            self.model(arch)
        except pytest.skip.Exception:
            pass  # the architecture is not supported: the cases say so
        except Exception as exc:
            return (
                f"backend {self.name!r} failed to load the tiny {arch} model: "
                f"{type(exc).__name__}: {_one_line(exc)}"
            )
        return None

    @property
    def numeric(self) -> bool:
        """Whether the numeric surfaces run (they compare against the float64 oracle)."""
        if self.options.numerics != "auto":
            return self.options.numerics == "on"
        from pie_core.backend_kit import DummyBackend

        factory = self.factory()
        return not (isinstance(factory, type) and issubclass(factory, DummyBackend))

    def backend_options(self, kv_pages: int, host_pages: int) -> BackendOptions:
        """What the backend under test is loaded with (``--backend-option`` in ``extra``)."""
        dtype: dict[str, Any] = {} if self.options.dtype is None else {"dtype": self.options.dtype}
        return BackendOptions(
            device=self.options.device,
            page_size=self.options.page_size,
            kv_pages=kv_pages,
            host_pages=host_pages,
            extra=dict(self.options.extra),
            **dtype,
        )

    def model(self, arch: str | None = None) -> LoadedModel:
        """The tiny ``arch`` model (the first selected architecture by default), loaded once."""
        return self.load(arch or self.options.archs[0])

    def load(
        self,
        arch: str,
        kv_pages: int = DEFAULT_KV_PAGES,
        host_pages: int = DEFAULT_HOST_PAGES,
        *,
        reference: bool = True,
        twins: tuple[int, int] | None = None,
    ) -> LoadedModel:
        """Load ``arch`` into a fresh backend instance (cached per pool size).

        ``twins=(token, twin)`` loads the weights of :func:`conformance.models.with_twin`
        (the two tokens' logits tie exactly).

        An ``Unsupported`` error from the load makes the case "not supported" (the backend does
        not run that architecture); any other error fails it.

        Raises:
            Exception: Whatever binding or ``pie_backend_load_model`` raised.
        """
        key = (arch, kv_pages, host_pages, reference, twins)
        if key in self._models:
            return self._models[key]
        spec = tiny_spec(arch)

        def weights() -> Iterator[tuple[str, np.ndarray]]:
            plain = random_weights(spec)
            return plain if twins is None else with_twin(spec, plain, *twins)

        pm = self.bind()
        try:
            caps = pm.hook.pie_backend_load_model(
                spec=spec, weights=weights(), options=self.backend_options(kv_pages, host_pages)
            )
        except Unsupported as exc:  # a backend may leave an architecture out, saying so
            not_supported(f"the backend does not run {arch}: {exc}")
        tol = self.tolerance(caps.dtype)
        ref = self._reference(spec, weights(), caps) if reference and self.numeric else None
        model = LoadedModel(spec, pm.hook, caps, tol, ref, "backend")
        self._models[key] = model
        return model

    def tolerance(self, dtype: str) -> Tolerance:
        return tolerance_for(dtype, self.options.atol, self.options.rtol)

    def _reference(self, spec: ModelSpec, weights: Iterable[tuple[str, np.ndarray]], caps: Capabilities) -> LoadedModel:
        """The oracle of ``spec`` on a pool the size of the backend's ``caps`` (same page ids)."""
        pool = dataclasses.replace(caps, num_host_pages=max(caps.num_host_pages, 1), dtype="float64", device="cpu")
        oracle = Oracle(spec, weights, pool.num_pages, pool.num_host_pages, pool.page_size)
        return ReferenceModel(spec, oracle, pool, self.tolerance("float32"))

    def merged_reference(self, model: LoadedModel, tensors: dict[str, np.ndarray], scaling: float) -> LoadedModel:
        """The oracle of ``model``'s architecture with an adapter merged into its weights (see
        :mod:`conformance.adapters`); a fresh one each call, with ``model``'s pool size so the
        same page ids work on both."""
        return self._reference(model.spec, merged(random_weights(model.spec), tensors, scaling), model.caps)

    def require_numerics(self) -> None:
        """Skip as "not supported" when the numeric surfaces are off."""
        if not self.numeric:
            not_supported("numeric surfaces are off for this backend (weightless, or --pie-numerics off)")

    def describe(self) -> dict[str, Any]:
        """What the report header shows; never raises (a broken backend shows its error)."""
        out: dict[str, Any] = {"device": self.options.device}
        if self.options.extra:
            out["options"] = dict(self.options.extra)
        if self.error is not None:
            out["error"] = self.error
            return out
        try:
            info = self.info()
            out.update(version=info.version, contract=info.contract_version)
        except Exception as exc:  # the cases report the failure itself
            out["error"] = f"{type(exc).__name__}: {exc}"
            return out
        loaded = next(iter(self._models.values()), None)
        if loaded is not None:
            out.update(dtype=loaded.caps.dtype, tolerance=str(loaded.tolerance))
            out["features"] = sorted(loaded.caps.features)
        out["numerics"] = "on" if self.numeric else "off"
        return out
