"""``[mcp.servers.NAME]`` entries are read strictly: a broken entry names itself and the fix."""

import pytest
import tomlkit

from pie_core.errors import InvalidInput
from pie_core.mcp import StdioServerSpec, configured_servers


def _config(text: str):
    return tomlkit.parse(text)


def test_entries_become_specs():
    doc = _config('[mcp.servers.calc]\ncommand = "python"\nargs = ["-m", "calc"]\nenv = {K = "v"}\ntimeout = 5\n')
    assert configured_servers(doc) == {
        "calc": StdioServerSpec("calc", "python", ("-m", "calc"), {"K": "v"}, None, 5.0)
    }


def test_no_mcp_table_means_no_servers():
    assert configured_servers(_config('[engine]\npage_size = 16\n')) == {}


@pytest.mark.parametrize(
    ("entry", "complaint"),
    [
        ('args = ["x"]', "needs 'command'"),
        ('command = "x"\nargs = "-v"', "'args' must be a list of strings"),
        ('command = "x"\nenv = {N = 1}', "'env' must be a table of string values"),
        ('command = "x"\ntimeout = 0', "'timeout' must be a positive number"),
        ('command = "x"\ncomand = "y"', "unknown keys ['comand']"),
    ],
)
def test_a_malformed_entry_is_invalid_input_naming_the_entry(entry, complaint):
    with pytest.raises(InvalidInput, match=r"\[mcp\.servers\.bad\]") as err:
        configured_servers(_config(f"[mcp.servers.bad]\n{entry}\n"))
    assert complaint in str(err.value)
