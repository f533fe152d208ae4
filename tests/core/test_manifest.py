from pathlib import Path

import pytest

from pie_core.errors import InvalidInput
from pie_core.runtime.manifest import load_manifest, parse_cli_args

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _inferlet(tmp_path: Path, toml: str, main: str = "async def main(input):\n    return input\n") -> Path:
    (tmp_path / "Pie.toml").write_text(toml)
    (tmp_path / "main.py").write_text(main)
    return tmp_path


def test_text_completion_manifest_types_cli_flags():
    m = load_manifest(EXAMPLES / "text-completion")
    given = parse_cli_args(["--max-tokens", "5", "--temperature=0.7", "--prompt", "hi there"], m)
    assert m.validate_input(given) == {
        "prompt": "hi there",
        "max_tokens": 5,
        "temperature": 0.7,
        "top_p": 0.95,
        "seed": 0,
    }


def test_dash_and_underscore_spellings_are_one_parameter():
    m = load_manifest(EXAMPLES / "text-completion")
    assert parse_cli_args(["--max_tokens", "5"], m) == parse_cli_args(["--max-tokens", "5"], m)


def test_wrong_type_names_the_parameter():
    m = load_manifest(EXAMPLES / "text-completion")
    with pytest.raises(InvalidInput, match="parameter 'max_tokens' must be int, got 'lots'"):
        m.validate_input(parse_cli_args(["--max-tokens", "lots"], m))


def test_missing_required_parameter_names_it(tmp_path):
    m = load_manifest(_inferlet(tmp_path, '[package]\nname = "x"\n[parameters]\ncount = {type = "int"}\n'))
    with pytest.raises(InvalidInput, match="missing required parameter 'count'"):
        m.validate_input({})


def test_unknown_parameter_is_refused_with_the_known_ones(tmp_path):
    m = load_manifest(_inferlet(tmp_path, '[package]\nname = "x"\n[parameters]\ncount = {type = "int"}\n'))
    with pytest.raises(InvalidInput, match="unknown parameter 'cuont'.*parameters: count"):
        m.validate_input({"cuont": 1})


def test_bool_flag_without_value_is_true(tmp_path):
    m = load_manifest(_inferlet(tmp_path, '[package]\nname = "x"\n[parameters]\nloud = {type = "bool", optional = true}\n'))
    assert m.validate_input(parse_cli_args(["--loud"], m)) == {"loud": True}


@pytest.mark.parametrize(
    "toml, message",
    [
        ("[package\nname='x'", "not valid TOML"),
        ("[other]\n", r"\[package\] needs a non-empty string 'name'"),
        ('[package]\nname="x"\n[parameters]\nn = {type = "integer"}\n', "parameter 'n' has type 'integer'"),
        ('[package]\nname="x"\n[runtime]\nentry = "nope.py"\n', "entry module 'nope.py' not found"),
    ],
)
def test_malformed_manifests_say_what_is_wrong(tmp_path, toml, message):
    with pytest.raises(InvalidInput, match=message):
        load_manifest(_inferlet(tmp_path, toml))


def test_folder_without_manifest(tmp_path):
    with pytest.raises(InvalidInput, match="has no Pie.toml"):
        load_manifest(tmp_path)
