"""The backend binds, says who it is, declares what it loaded, and refuses what it must."""

from __future__ import annotations

import pytest

from pie_core.errors import ContractError
from pie_core.hookspec import CONTRACT_VERSION, BackendInfo, Capabilities, hookimpl
from pie_core.plugins import bind_plugin
from pie_core.scheduler.assemble import assemble

from conformance.batches import kv_request
from conformance.harness import KNOWN_FEATURES, Harness
from conformance.loaded import LoadedModel
from conformance.models import random_weights, tiny_spec

SURFACE = "contract"

_HOOKS = (
    "pie_backend_info",
    "pie_backend_load_model",
    "pie_backend_capabilities",
    "pie_backend_forward",
    "pie_backend_copy_pages",
)


def _major(version: str) -> int:
    return int(str(version).split(".", 1)[0])


class _Proxy:
    """Stands in for the backend's plugin object with one thing changed."""

    PIE_CONTRACT_VERSION: object = None


def _proxy(plugin: object, **changes: object) -> _Proxy:
    proxy = _Proxy()
    proxy.PIE_CONTRACT_VERSION = getattr(plugin, "PIE_CONTRACT_VERSION", None)
    for name in _HOOKS:
        method = getattr(plugin, name, None)
        if method is not None:
            setattr(proxy, name, method)
    for name, value in changes.items():
        setattr(proxy, name, value)
    return proxy


def test_backend_binds_with_a_compatible_contract_version(pie_conformance: Harness) -> None:
    info = pie_conformance.info()
    assert isinstance(info, BackendInfo), f"pie_backend_info returned {type(info).__name__}, not BackendInfo"
    assert info.name and info.version, "BackendInfo needs a name and a version"
    assert _major(info.contract_version) == _major(CONTRACT_VERSION), (
        f"backend speaks contract {info.contract_version}; this engine speaks {CONTRACT_VERSION}"
    )


def test_declared_features_are_contract_feature_names(pie_conformance: Harness, model: LoadedModel) -> None:
    unknown = {
        where: sorted(set(features) - KNOWN_FEATURES)
        for where, features in (("Capabilities", model.caps.features), ("BackendInfo", pie_conformance.info().features))
    }
    assert not any(unknown.values()), (
        "unknown features declared ("
        + "; ".join(f"{where}.features: {names}" for where, names in unknown.items() if names)
        + f"), which the core never uses; the contract's are {sorted(KNOWN_FEATURES)}"
    )


def test_backend_info_and_capabilities_declare_the_same_features(
    pie_conformance: Harness, model: LoadedModel
) -> None:
    declared = set(model.caps.features)
    offered = set(pie_conformance.info().features)
    beyond = sorted(declared - offered)
    assert not beyond, f"Capabilities.features declares {beyond} that BackendInfo.features does not offer"
    unused = sorted(offered - declared)
    assert not unused, (
        f"BackendInfo.features offers {unused} that the loaded model's Capabilities.features does not "
        f"declare, so the core never uses them and the suite never checks them"
    )


def test_capabilities_describe_the_loaded_model(pie_conformance: Harness, model: LoadedModel) -> None:
    caps = model.caps
    assert isinstance(caps, Capabilities), f"pie_backend_load_model returned {type(caps).__name__}"
    assert caps.vocab_size == model.spec.vocab_size, f"vocab_size {caps.vocab_size}, model has {model.spec.vocab_size}"
    assert caps.page_size == pie_conformance.options.page_size, (
        f"page_size {caps.page_size}; the suite asked for {pie_conformance.options.page_size}"
    )
    limits = ["num_pages", "max_batch_tokens", "max_batch_requests", "max_sample_rows"]
    limits += ["max_mask_bytes"] if "custom_mask" in caps.features else []
    for limit in limits:
        assert getattr(caps, limit) >= 1, f"{limit} must be >= 1, got {getattr(caps, limit)}"
    if "offload" in caps.features:
        assert caps.num_host_pages >= 1, "a backend declaring 'offload' needs host pages"
    assert model.hook.pie_backend_capabilities() == caps, "pie_backend_capabilities differs from what load returned"


def test_forward_before_load_is_refused(pie_conformance: Harness) -> None:
    pm = pie_conformance.bind()
    spec = tiny_spec(pie_conformance.options.archs[0])
    batch = assemble([kv_request([1, 2, 3], [0, 1, 2], pie_conformance.options.page_size)], spec.vocab_size)
    with pytest.raises(Exception):
        pm.hook.pie_backend_forward(batch=batch)


def test_load_refuses_a_missing_weight(pie_conformance: Harness) -> None:
    pie_conformance.require_numerics()
    spec = tiny_spec(pie_conformance.options.archs[0])
    weights = [(n, w) for n, w in random_weights(spec) if n != "blk.0.attn_q.weight"]
    options = pie_conformance.backend_options(kv_pages=8, host_pages=1)
    with pytest.raises(ValueError):
        pie_conformance.bind().hook.pie_backend_load_model(spec=spec, weights=iter(weights), options=options)


def test_load_refuses_a_misshapen_weight(pie_conformance: Harness) -> None:
    pie_conformance.require_numerics()
    spec = tiny_spec(pie_conformance.options.archs[0])
    weights = [
        (n, w[:, :-1] if n == "blk.1.ffn_up.weight" else w) for n, w in random_weights(spec)
    ]
    options = pie_conformance.backend_options(kv_pages=8, host_pages=1)
    with pytest.raises(ValueError):
        pie_conformance.bind().hook.pie_backend_load_model(spec=spec, weights=iter(weights), options=options)


def test_incompatible_contract_version_is_refused_naming_the_version(pie_conformance: Harness) -> None:
    plugin = pie_conformance.factory()()
    wrong = f"{_major(CONTRACT_VERSION) + 1}.0"
    with pytest.raises(ContractError) as err:
        bind_plugin(_proxy(plugin, PIE_CONTRACT_VERSION=wrong), pie_conformance.name)
    assert wrong in str(err.value) and CONTRACT_VERSION in str(err.value), str(err.value)


def test_wrong_hook_signature_is_refused_naming_the_hook(pie_conformance: Harness) -> None:
    plugin = pie_conformance.factory()()

    @hookimpl
    def pie_backend_forward(batch, stream):  # type: ignore[no-untyped-def]
        raise AssertionError("never called")

    with pytest.raises(ContractError) as err:
        bind_plugin(_proxy(plugin, pie_backend_forward=pie_backend_forward), pie_conformance.name)
    assert "pie_backend_forward" in str(err.value), str(err.value)


def test_missing_hook_is_refused_naming_the_hook(pie_conformance: Harness) -> None:
    plugin = pie_conformance.factory()()
    proxy = _proxy(plugin)
    delattr(proxy, "pie_backend_copy_pages")
    with pytest.raises(ContractError) as err:
        bind_plugin(proxy, pie_conformance.name)
    assert "pie_backend_copy_pages" in str(err.value), str(err.value)


def test_load_honours_the_requested_pool(pie_conformance: Harness) -> None:
    spec = tiny_spec(pie_conformance.options.archs[0])
    options = pie_conformance.backend_options(kv_pages=24, host_pages=3)
    caps = pie_conformance.bind().hook.pie_backend_load_model(spec=spec, weights=random_weights(spec), options=options)
    assert caps.num_pages == 24, f"asked for kv_pages=24, capabilities say num_pages={caps.num_pages}"
    if "offload" in caps.features:
        assert caps.num_host_pages == 3, f"asked for host_pages=3, capabilities say {caps.num_host_pages}"
