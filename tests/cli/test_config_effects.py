"""Every key ``pie config show`` lists changes what ``pie run`` (and ``pie serve``) builds: the
model, the backend, the page size and both pools. Each test sets a key with ``pie config set``
and looks at the engine ``pie run`` made, on the dummy backend and a tiny GGUF."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pie_core import config
from pie_core.backend_kit.dummy import page_bytes
from pie_core.backend_kit.pools import DEFAULT_HOST_PAGES
from pie_core.cli import serve as serve_cli
from pie_core.cli.main import main
from pie_core.engine import engine as engine_module


def _set(pie, key: str, value: str) -> None:
    r = pie("config", "set", key, value)
    assert r.code == 0, r.err


def _run(pie, model: Path, *flags: str):
    r = pie("run", "hello-world", "--model", str(model), *flags, "--", "--name", "cfg")
    assert r.code == 0, r.err
    assert r.out.strip() == "hello cfg"
    assert r.engine.pools_whole()
    (loaded,) = r.engine.models.values()
    return r.engine, loaded


def test_every_key_config_show_lists_has_a_test_here(pie):
    shown = pie("config", "show").out
    keys = {f"engine.{line.split('=')[0].strip()}" for line in shown.splitlines() if "=" in line and not line.startswith("#")}
    tested = {"engine.default_model", "engine.default_backend", "engine.page_size", "engine.kv_memory",
              "engine.kv_pages", "engine.host_pages"}
    assert keys == tested


def test_default_model_is_the_model_loaded_without_model(pie, tiny_model):
    _set(pie, "engine.default_model", str(tiny_model))
    r = pie("run", "hello-world", "--dummy", "--", "--name", "cfg")
    assert r.code == 0, r.err
    (loaded,) = r.engine.models.values()
    assert loaded.name == str(tiny_model) and loaded.spec.vocab_size == 258


def test_default_backend_is_the_backend_used_without_backend(pie, tiny_model):
    _set(pie, "engine.default_backend", "dummy")
    engine, loaded = _run(pie, tiny_model)
    assert engine.backend == loaded.backend == "dummy"
    _set(pie, "engine.default_backend", "cpu")
    engine, _ = _run(pie, tiny_model)
    assert engine.backend == "cpu"
    engine, _ = _run(pie, tiny_model, "--backend", "dummy")  # the flag wins
    assert engine.backend == "dummy"
    engine, _ = _run(pie, tiny_model, "--dummy")
    assert engine.backend == "dummy"


def test_auto_backend_is_the_engines_own_choice(pie, tiny_model, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(engine_module, "default_backend_name", lambda: "dummy")  # what auto picks here
    _set(pie, "engine.default_backend", "auto")
    engine, _ = _run(pie, tiny_model)
    assert engine.backend == "dummy"
    _set(pie, "engine.default_backend", "cpu")
    engine, _ = _run(pie, tiny_model)
    assert engine.backend == "cpu"


def test_a_hand_edited_unknown_default_backend_is_one_line_naming_the_key(pie, home, tiny_model):
    doc = config.default_config()
    config.set("engine.default_backend", "torchh", config=doc)
    config.save_config(doc)
    r = pie("run", "hello-world", "--model", str(tiny_model), "--", "--name", "cfg")
    assert r.code == 1 and r.engines == []
    assert "config engine.default_backend = 'torchh' is not an installed backend" in r.err
    assert "pie config set engine.default_backend auto" in r.err


def test_page_size_is_the_loaded_models_page_size(pie, tiny_model):
    _set(pie, "engine.page_size", "4")
    _, loaded = _run(pie, tiny_model, "--dummy")
    assert loaded.caps.page_size == loaded.pool.page_size == 4


def test_kv_memory_sizes_the_device_pool(pie, tiny_model):
    _, loaded = _run(pie, tiny_model, "--dummy")
    per_page = page_bytes(16)
    default_pages = loaded.caps.num_pages
    _set(pie, "engine.kv_memory", "4MiB")
    _, loaded = _run(pie, tiny_model, "--dummy")
    assert loaded.caps.num_pages == loaded.pool.num_pages == (4 << 20) // per_page
    assert loaded.caps.num_pages != default_pages
    _set(pie, "engine.page_size", "8")  # half the bytes per page: twice the pages in the same memory
    _, loaded = _run(pie, tiny_model, "--dummy")
    assert loaded.caps.num_pages == 2 * ((4 << 20) // per_page)


def test_kv_memory_sizes_the_cpu_backends_pool_too(pie, tiny_model):
    _set(pie, "engine.kv_memory", "64KiB")
    _, small = _run(pie, tiny_model, "--backend", "cpu")
    _set(pie, "engine.kv_memory", "128KiB")
    _, large = _run(pie, tiny_model, "--backend", "cpu")
    assert 0 < small.caps.num_pages and large.caps.num_pages in (2 * small.caps.num_pages, 2 * small.caps.num_pages + 1)


def test_kv_pages_overrides_kv_memory(pie, tiny_model):
    _set(pie, "engine.kv_memory", "4MiB")
    _set(pie, "engine.kv_pages", "40")
    _, loaded = _run(pie, tiny_model, "--dummy")
    assert loaded.caps.num_pages == loaded.pool.num_pages == 40
    _, loaded = _run(pie, tiny_model, "--dummy", "--kv-pages", "7")  # the flag wins
    assert loaded.caps.num_pages == 7


def test_host_pages_sizes_the_host_pool(pie, tiny_model):
    engine, loaded = _run(pie, tiny_model, "--dummy")
    assert engine.host_pages is None and loaded.caps.num_host_pages == DEFAULT_HOST_PAGES
    _set(pie, "engine.host_pages", "12")
    engine, loaded = _run(pie, tiny_model, "--dummy")
    assert engine.host_pages == 12 and loaded.caps.num_host_pages == 12
    _set(pie, "engine.host_pages", "0")
    engine, loaded = _run(pie, tiny_model, "--dummy")
    assert engine.host_pages == 0 and loaded.market.is_whole()


class _Built(Exception):
    pass


def test_serve_builds_its_engine_from_the_same_keys(home, monkeypatch: pytest.MonkeyPatch, tiny_model, capsys):
    """``pie serve`` stops here right after building its engine: backend, pools and page size
    come from the configuration as in ``pie run``."""
    for key, value in (("engine.default_backend", "dummy"), ("engine.page_size", "4"), ("engine.kv_pages", "33"),
                       ("engine.host_pages", "5")):
        assert main(["config", "set", key, value]) == 0
    seen: dict[str, Any] = {}

    class StopAfterBuild(engine_module.Engine):
        def __init__(self, backend: Any = None, **kwargs: Any) -> None:
            seen.update(kwargs, backend=backend)
            raise _Built

    monkeypatch.setattr(engine_module, "Engine", StopAfterBuild)
    monkeypatch.setattr(serve_cli, "_isolation", lambda choice: "inprocess")
    with pytest.raises(_Built):
        main(["serve", "--no-auth", "--model", str(tiny_model), "--isolation", "inprocess"])
    options = seen["options"]
    assert seen["backend"] == "dummy" and seen["host_pages"] == 5
    assert (options.page_size, options.kv_pages, options.host_pages) == (4, 33, 5)


def test_replicas_loads_each_model_that_many_times(pie, tiny_model):
    engine, loaded = _run(pie, tiny_model, "--dummy")
    assert engine.replicas[loaded.name] == [loaded]
    _set(pie, "engine.replicas", "2")
    engine, loaded = _run(pie, tiny_model, "--dummy")
    replicas = engine.replicas[loaded.name]
    assert [r.index for r in replicas] == [0, 1] and replicas[0].pool is not replicas[1].pool
    assert pie("config", "set", "engine.replicas", "0").code != 0


def test_serve_replicas_flag_beats_the_key(home, monkeypatch: pytest.MonkeyPatch, tiny_model):
    assert main(["config", "set", "engine.replicas", "3"]) == 0
    seen: dict[str, Any] = {}

    class StopAfterBuild(engine_module.Engine):
        def __init__(self, backend: Any = None, **kwargs: Any) -> None:
            seen.update(kwargs)
            raise _Built

    monkeypatch.setattr(engine_module, "Engine", StopAfterBuild)
    monkeypatch.setattr(serve_cli, "_isolation", lambda choice: "inprocess")
    for flags, want in (([], 3), (["--replicas", "2"], 2)):
        with pytest.raises(_Built):
            main(["serve", "--dummy", "--no-auth", "--model", str(tiny_model), "--isolation", "inprocess", *flags])
        assert seen["replicas"] == want
    assert main(["serve", "--dummy", "--no-auth", "--model", str(tiny_model), "--replicas", "0"]) != 0
