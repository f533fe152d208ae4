"""``pie examples`` lists what ``pie run NAME`` finds, and tables printed off a terminal are
never cut to 80 columns (rich's guess when stdout is a pipe)."""

from __future__ import annotations

import json

import pytest

from pie_core.bundled import examples_dir
from pie_core.runtime.library import list_examples


def test_examples_lists_every_bundled_example_with_its_parameters(pie) -> None:
    result = pie("examples", "--json")
    assert result.code == 0
    listed = {e["name"]: e for e in json.loads(result.out)}
    bundled = {p.parent.name for p in examples_dir().glob("*/Pie.toml")}
    assert bundled <= set(listed) and "hello-world" in listed
    assert listed["hello-world"]["parameters"]["name"]["type"] == "string"
    assert "backends" not in listed  # examples/backends holds a backend package, not an inferlet


def test_a_local_examples_folder_shadows_a_bundled_example_of_the_same_name(pie, home) -> None:
    local = home.parent / "examples" / "hello-world"
    local.mkdir(parents=True)
    (local / "Pie.toml").write_text('[package]\nname = "hello-world"\nversion = "9.9.9"\ndescription = "mine"\n')
    (local / "main.py").write_text("async def main(input):\n    return 'mine'\n")
    mine = {m.name: m for m in list_examples()}["hello-world"]
    assert mine.version == "9.9.9"


def test_tables_off_a_terminal_keep_every_cell_whole(pie, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    longest = max(list_examples(), key=lambda m: len(m.description))
    assert len(longest.description) > 80
    out = pie("examples").out
    assert any(longest.description in line for line in out.splitlines())  # one line, not folded
    assert max(len(line) for line in out.splitlines()) > 120


def test_columns_still_sets_the_width_off_a_terminal(pie, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    out = pie("examples").out
    assert max(len(line) for line in out.splitlines()) <= 100
