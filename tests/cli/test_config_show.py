"""``pie config show`` names the config file only once it exists; before, it says the defaults are
shown and which file ``pie config set`` would create."""

from __future__ import annotations


def test_show_without_a_file_says_it_would_be_created(pie, home) -> None:
    r = pie("config", "show")
    first = r.out.splitlines()[0]
    assert r.code == 0 and first.startswith("# No config file yet: these are the defaults.")
    assert f"'pie config set KEY VALUE' would create {home / 'config.toml'}" in first
    assert not (home / "config.toml").exists()


def test_show_with_a_file_names_it(pie, home) -> None:
    assert pie("config", "set", "engine.page_size", "32").code == 0
    r = pie("config", "show")
    assert r.out.splitlines()[0] == f"# {home / 'config.toml'}" and "page_size = 32" in r.out
