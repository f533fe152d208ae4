"""Fixtures for the MCP tests: a temporary PIE_HOME whose config names the fixture server."""

from pathlib import Path

import pytest

from mcp_harness import fixture_entry, write_servers
from pie_core.engine.engine import Engine


@pytest.fixture
def pie_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PIE_HOME", str(tmp_path))
    write_servers(tmp_path, {"calc": fixture_entry()})
    return tmp_path


@pytest.fixture
def engine(pie_home: Path) -> Engine:
    return Engine("dummy")  # reads [mcp.servers] from $PIE_HOME/config.toml on first use
