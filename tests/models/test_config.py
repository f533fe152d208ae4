"""~/.pie/config.toml through tomlkit: dotted keys, defaults, comments preserved."""

from __future__ import annotations

from pathlib import Path

import pytest

from pie_core import config
from pie_core.errors import InvalidInput


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("PIE_HOME", str(tmp_path))
    return tmp_path


def test_missing_file_reads_as_defaults(home: Path) -> None:
    assert config.config_path() == home / "config.toml"
    assert config.get("engine.default_model") == "qwen2.5-coder-0.5b-instruct"
    assert config.get("engine.page_size") == 16
    assert config.get("engine.nope", default=3) == 3


def test_set_preserves_comments_and_layout(home: Path) -> None:
    text = "# my settings\n[engine]\n# pages!\npage_size = 8  # small\n\n[extra]\nkeep = 'me'\n"
    (home / "config.toml").write_text(text)
    config.set("engine.page_size", 32)
    assert (home / "config.toml").read_text() == text.replace("page_size = 8", "page_size = 32")
    assert config.get("engine.page_size") == 32 and config.get("extra.keep") == "me"


def test_round_trip_of_the_default_document(home: Path) -> None:
    doc = config.load_config()
    config.save_config(doc)
    assert config.load_config().as_string() == doc.as_string()
    assert "# Model used when none is named" in (home / "config.toml").read_text()


def test_model_entries_with_dots_in_their_names(home: Path) -> None:
    config.set("model.qwen2.5-local.path", "/models/q.gguf")
    config.set("model.qwen2.5-local.format", "gguf")
    config.set('model."my.model".path', "/x")
    text = (home / "config.toml").read_text()
    assert '[model."qwen2.5-local"]' in text and "[model]" not in text
    assert config.get("model.qwen2.5-local") == {"path": "/models/q.gguf", "format": "gguf"}
    assert config.get("model.my.model.path") == "/x"


def test_in_memory_changes_do_not_touch_the_file(home: Path) -> None:
    doc = config.load_config()
    config.set("engine.page_size", 64, config=doc)
    assert config.get("engine.page_size", doc) == 64 and not (home / "config.toml").exists()


def test_bad_keys_and_values(home: Path) -> None:
    with pytest.raises(InvalidInput):
        config.split_key("engine..x")
    config.set("engine.page_size", 16)
    with pytest.raises(InvalidInput, match="not a table"):
        config.set("engine.page_size.deeper", 1)
    (home / "config.toml").write_text("[engine\n")
    with pytest.raises(InvalidInput, match="not valid TOML"):
        config.load_config()


def test_value_and_size_parsing() -> None:
    assert config.parse_value("16") == 16 and config.parse_value("true") is True
    assert config.parse_value("/a/b.gguf") == "/a/b.gguf" and config.parse_value('"x"') == "x"
    assert config.parse_bytes("2GiB") == 2 << 30 and config.parse_bytes("512MiB") == 512 << 20
    assert config.parse_bytes(1000) == 1000
    with pytest.raises(InvalidInput, match="2GiB"):
        config.parse_bytes("lots")
