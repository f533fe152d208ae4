"""``pie config set`` checks keys and values against the schema before writing: unknown keys,
wrong types, out-of-range numbers and bad sizes are refused in one line and the file is left
as it was; good values are stored typed."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomlkit

from pie_core.cli.config_schema import SETTINGS, known_keys


def _file(home: Path) -> str:
    path = home / "config.toml"
    return path.read_text() if path.exists() else ""


def _refused(pie, home: Path, key: str, value: str) -> str:
    before = _file(home)
    r = pie("config", "set", key, value)
    assert r.code == 1, r.out
    assert _file(home) == before  # nothing written
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.err
    return lines[0]


def test_an_unknown_key_is_refused_with_the_nearest_key_and_every_valid_key(pie, home):
    line = _refused(pie, home, "engine.pag_size", "3")
    assert "unknown config key 'engine.pag_size' (did you mean engine.page_size?)" in line
    for key in known_keys():
        assert key in line


@pytest.mark.parametrize("key", ["engine", "engine.page_size.deeper", "enigne.page_size", "model.x.pth", "server.nope"])
def test_keys_outside_the_schema_are_refused(pie, home, key):
    assert "unknown config key" in _refused(pie, home, key, "1")


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("engine.page_size", "abc", "engine.page_size takes a whole number from 1 to 1024, got 'abc'"),
        ("engine.page_size", "0", "engine.page_size takes a whole number from 1 to 1024, got '0'"),
        ("engine.page_size", "2048", "from 1 to 1024, got '2048'"),
        ("engine.page_size", "1.5", "got '1.5'"),
        ("engine.page_size", '"16"', "got '\"16\"'"),
        ("engine.kv_pages", "-1", "engine.kv_pages takes a whole number >= 0"),
        ("engine.kv_pages", "true", "engine.kv_pages takes a whole number >= 0"),
        ("engine.host_pages", "-2", "engine.host_pages takes a whole number >= -1"),
        ("engine.kv_memory", "lots", "engine.kv_memory takes a size such as 2GiB, 512MiB or a byte count, got 'lots'"),
        ("engine.kv_memory", "2 parsecs", "engine.kv_memory takes a size"),
        ("engine.kv_memory", "0", "engine.kv_memory: the size must be at least one byte"),
        ("engine.default_backend", "torchh", "engine.default_backend takes 'auto' or an installed backend: "),
        ("engine.default_model", "no-such-model", "engine.default_model: unknown model 'no-such-model'; models available"),
        ("model.mine.path", "/no/such/model.gguf", "model.mine.path: model path /no/such/model.gguf does not exist"),
        ("model.mine.format", "ggml", "model.mine.format takes 'gguf' or 'hf', got 'ggml'"),
        ("server.worker_wall_s", "-3", "server.worker_wall_s takes a number of seconds >= 0"),
        ("server.worker_memory", "big", "server.worker_memory takes a size"),
        ("server.cors_origins", "https://a.example/path", "is not an origin like"),
        ("server.cors_origins", "[1]", "server.cors_origins takes a list of web origins"),
        ("server.quotas.pagez", "3", "unknown quota server.quotas.pagez; known keys:"),
        ("server.quotas.inbox_bytes", "lots", "server.quotas.inbox_bytes"),
        ("mcp.servers.fs.timeout", "-1", "'timeout' must be a positive number of seconds"),
        ("mcp.servers.fs.colour", "red", "unknown keys ['colour']"),
        ("auth.users.bob.token_sha256", "x", "users are kept by 'pie auth add NAME'"),
    ],
)
def test_a_value_of_the_wrong_type_or_range_is_refused_saying_what_the_key_takes(pie, home, key, value, message):
    assert message in _refused(pie, home, key, value)


def test_a_refusal_leaves_an_existing_file_byte_for_byte(pie, home):
    assert pie("config", "set", "engine.page_size", "8").code == 0
    _refused(pie, home, "engine.page_size", "eight")
    assert tomlkit.parse(_file(home))["engine"]["page_size"] == 8  # type: ignore[index]


@pytest.mark.parametrize(
    "key, value, stored",
    [
        ("engine.page_size", "8", 8),
        ("engine.kv_memory", "512MiB", "512MiB"),
        ("engine.kv_memory", "1.5GiB", "1.5GiB"),
        ("engine.kv_memory", "4096", 4096),
        ("engine.kv_pages", "100", 100),
        ("engine.host_pages", "-1", -1),
        ("engine.default_backend", "dummy", "dummy"),
        ("engine.default_backend", "auto", "auto"),
        ("engine.default_model", "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-0.5b-instruct"),
        ("model.mine.format", "hf", "hf"),
        ("server.worker_wall_s", "2.5", 2.5),
        ("server.worker_memory", "4GiB", "4GiB"),
        ("server.cors_origins", '["https://app.example"]', ["https://app.example"]),
        ("server.cors_origins", "https://a.example, https://b.example", ["https://a.example", "https://b.example"]),
        ("server.quotas.pages", "0.5", 0.5),
        ("mcp.servers.fs.args", '["-y", "server"]', ["-y", "server"]),
    ],
)
def test_good_values_are_stored_typed(pie, home, key, value, stored):
    r = pie("config", "set", key, value)
    assert r.code == 0, r.err
    node = tomlkit.parse(_file(home)).unwrap()
    for part in key.split("."):
        node = node[part]
    assert node == stored and type(node) is type(stored)


def test_a_model_path_is_checked_and_stored_absolute(pie, home, tiny_model, tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "t.gguf").symlink_to(tiny_model)
    assert pie("config", "set", "model.tiny.path", "models/t.gguf").code == 0
    assert tomlkit.parse(_file(home))["model"]["tiny"]["path"] == str(tmp_path / "models" / "t.gguf")  # type: ignore[index]
    assert pie("config", "set", "engine.default_model", "tiny").code == 0  # a config entry is a model name
    line = _refused(pie, home, "model.x.path", str(tmp_path))
    assert "is a folder without config.json" in line


def test_comments_survive_a_checked_set(pie, home):
    assert pie("config", "set", "engine.kv_memory", "1GiB").code == 0
    text = _file(home)
    assert "# Tokens per KV-cache page." in text and 'kv_memory = "1GiB"' in text


def test_get_of_an_unknown_key_lists_the_keys_and_of_an_unset_key_says_how_to_set_it(pie, home):
    r = pie("config", "get", "engine.nope")
    assert r.code == 1 and "unknown config key 'engine.nope'" in r.err and "engine.page_size" in r.err
    r = pie("config", "get", "model.x.path")
    assert r.code == 1 and "pie config set model.x.path VALUE" in r.err
    assert pie("config", "get", "engine.page_size").out.strip() == "16"


def test_set_help_lists_every_key_with_what_it_takes(pie, capsys):
    with pytest.raises(SystemExit):
        pie("config", "set", "--help")
    out = capsys.readouterr().out
    for setting in SETTINGS.values():
        assert f"{setting.key}: {setting.expected}" in out
