"""The engine flags of ``pie run`` / ``pie serve`` and the ``[engine]`` config keys: parsed into the
``BackendOptions`` and engine keywords the engine passes on. Flags override the configuration."""

from __future__ import annotations

import argparse

import pytest
import tomlkit

from pie_core import config
from pie_core.cli.backend_args import HOST_PAGES_BACKEND_DEFAULT, add_backend_arguments, engine_options
from pie_core.errors import InvalidInput
from pie_core.hookspec import BackendOptions


def _parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_backend_arguments(p)
    return p.parse_args(list(argv))


def _config(**engine: object):
    doc = config.default_config()
    for key, value in engine.items():
        config.set(f"engine.{key}", value, config=doc)
    return doc


def test_defaults_ask_for_the_backends_best_precision_and_no_extras():
    opts = engine_options(_parse(), _config()).backend
    assert opts.dtype == "auto" and opts.extra == {}


def test_options_are_typed_and_repeatable():
    opts = engine_options(
        _parse("--dtype", "float32", "--backend-option", "quant=int8", "--backend-option", "threads=2",
               "--backend-option", "weights_cache=False", "--backend-option", "kernels = torch"),
        _config(),
    ).backend
    assert opts.dtype == "float32"
    assert opts.extra == {"quant": "int8", "threads": 2, "weights_cache": False, "kernels": "torch"}


@pytest.mark.parametrize("bad", ["quant", "=int8", ""])
def test_an_option_without_key_and_value_is_refused(bad):
    with pytest.raises(InvalidInput, match="expected KEY=VALUE"):
        engine_options(_parse("--backend-option", bad), _config())


def test_the_default_config_sizes_the_pool_from_kv_memory_with_the_backends_host_pool():
    opts = engine_options(_parse(), _config())
    assert (opts.backend.page_size, opts.backend.kv_pages, opts.backend.kv_memory_bytes) == (16, 0, 2 << 30)
    assert opts.backend.host_pages == 0 and opts.host_pages is None
    assert opts.engine_kwargs() == {"options": opts.backend}  # no host_pages: the engine uses the backend's


def test_a_missing_engine_table_reads_as_the_defaults():
    opts = engine_options(_parse(), tomlkit.document())
    assert opts == engine_options(_parse(), _config())


def test_config_keys_take_effect():
    opts = engine_options(_parse(), _config(page_size=8, kv_memory="512MiB", kv_pages=100, host_pages=12))
    assert opts.backend == BackendOptions(dtype="auto", page_size=8, kv_memory_bytes=512 << 20, kv_pages=100,
                                          host_pages=12)
    assert opts.host_pages == 12 and opts.engine_kwargs() == {"options": opts.backend, "host_pages": 12}


@pytest.mark.parametrize(
    "text, size",
    [("1B", 1), ("3KiB", 3 << 10), ("512MiB", 512 << 20), ("2GiB", 2 << 30), ("2gib", 2 << 30), ("5KB", 5000),
     ("7MB", 7 * 10**6), ("1GB", 10**9), ("1.5GiB", 3 << 29), ("1000", 1000)],
)
def test_kv_memory_takes_units(text, size):
    assert engine_options(_parse(), _config(kv_memory=text)).backend.kv_memory_bytes == size


def test_kv_memory_may_be_a_plain_byte_count():
    assert engine_options(_parse(), _config(kv_memory=4096)).backend.kv_memory_bytes == 4096


def test_flags_give_the_pool_sizes():
    opts = engine_options(_parse("--kv-pages", "64", "--host-pages", "8"), _config())
    assert (opts.backend.kv_pages, opts.backend.host_pages, opts.host_pages) == (64, 8, 8)
    assert opts.engine_kwargs()["host_pages"] == 8


def test_flags_override_the_config():
    opts = engine_options(_parse("--kv-pages", "64", "--host-pages", "8"), _config(kv_pages=100, host_pages=12))
    assert (opts.backend.kv_pages, opts.host_pages) == (64, 8)


def test_host_pages_zero_turns_offload_off_in_the_core_and_leaves_the_backend_default():
    for opts in (engine_options(_parse("--host-pages", "0"), _config()),
                 engine_options(_parse(), _config(host_pages=0))):
        assert opts.host_pages == 0 and opts.engine_kwargs()["host_pages"] == 0
        assert opts.backend.host_pages == 0  # the backend's 0 is "its default"; the core uses none of it


def test_host_pages_flag_zero_overrides_a_configured_pool():
    assert engine_options(_parse("--host-pages", "0"), _config(host_pages=12)).host_pages == 0


def test_the_host_pages_sentinel_keeps_the_backends_pool():
    opts = engine_options(_parse(), _config(host_pages=HOST_PAGES_BACKEND_DEFAULT))
    assert opts.host_pages is None and "host_pages" not in opts.engine_kwargs()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--kv-pages", "0"], "--kv-pages '0': expected a whole number >= 1"),
        (["--kv-pages", "-3"], "--kv-pages '-3': expected a whole number >= 1"),
        (["--kv-pages", "lots"], "--kv-pages 'lots'"),
        (["--kv-pages", "1.5"], "--kv-pages '1.5'"),
        (["--host-pages", "-1"], "--host-pages '-1': expected a whole number >= 0"),
        (["--host-pages", "8x"], "--host-pages '8x'"),
    ],
)
def test_bad_flags_are_refused_naming_the_flag(argv, message):
    with pytest.raises(InvalidInput, match=message):
        engine_options(_parse(*argv), _config())


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("kv_memory", "lots", "engine.kv_memory: not a size: 'lots'"),
        ("kv_memory", "2 parsecs", "engine.kv_memory: not a size"),
        ("kv_memory", 2.5, "engine.kv_memory: not a size: 2.5"),
        ("kv_memory", 0, "engine.kv_memory = 0: the KV cache needs at least one byte"),
        ("kv_memory", -5, "engine.kv_memory"),
        ("page_size", 0, "engine.page_size = 0: expected a whole number >= 1"),
        ("page_size", "16", "engine.page_size = '16'"),
        ("kv_pages", -1, "engine.kv_pages = -1: expected a whole number >= 0"),
        ("kv_pages", True, "engine.kv_pages = True"),
        ("kv_pages", 1.5, "engine.kv_pages = 1.5"),
        ("host_pages", -2, "engine.host_pages = -2: expected a whole number >= -1"),
        ("host_pages", "all", "engine.host_pages = 'all'"),
    ],
)
def test_bad_config_values_are_refused_naming_the_key(key, value, message):
    with pytest.raises(InvalidInput, match=message) as info:
        engine_options(_parse(), _config(**{key: value}))
    assert "\n" not in str(info.value) and f"pie config set engine.{key}" in str(info.value)


def test_each_flag_has_a_one_line_help():
    p = argparse.ArgumentParser()
    add_backend_arguments(p)
    helps = {a.option_strings[0]: a.help for a in p._actions if a.option_strings and a.dest != "help"}
    assert set(helps) == {"--dtype", "--device", "--backend-option", "--kv-pages", "--host-pages"}
    assert all(h and "\n" not in h for h in helps.values())
