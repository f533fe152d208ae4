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


@pytest.mark.parametrize("entry", ["/etc/passwd", "/etc/no-such-file", "../main.py", "sub/../../x.py", "", "a\\b.py"])
def test_entry_must_be_a_relative_path_inside_the_folder(tmp_path, entry):
    folder = tmp_path / "inferlet"
    folder.mkdir()
    with pytest.raises(InvalidInput, match=r"\[runtime\] entry must be a relative path to a file inside") as err:
        load_manifest(_inferlet(folder, f"[package]\nname = 'x'\n[runtime]\nentry = '{entry}'\n"))
    assert "no-such-file" not in str(err.value).replace(entry, "") and "not found" not in str(err.value)


def test_entry_symlinked_out_of_the_folder_is_refused_like_a_missing_one(tmp_path):
    folder = tmp_path / "inferlet"
    folder.mkdir()
    (tmp_path / "outside.py").write_text("async def main(input):\n    return 1\n")
    (folder / "real.py").symlink_to(tmp_path / "outside.py")
    (folder / "dangling.py").symlink_to(tmp_path / "missing.py")
    (folder / "loop.py").symlink_to(folder / "loop.py")
    messages = []
    for entry in ("real.py", "dangling.py", "loop.py"):
        with pytest.raises(InvalidInput, match="inside the inferlet folder") as err:
            load_manifest(_inferlet(folder, f'[package]\nname = "x"\n[runtime]\nentry = "{entry}"\n'))
        messages.append(str(err.value).replace(entry, "<entry>"))
    assert len(set(messages)) == 1


def test_entry_in_a_subfolder_resolves_inside(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "app.py").write_text("async def main(input):\n    return 1\n")
    m = load_manifest(_inferlet(tmp_path, '[package]\nname = "x"\n[runtime]\nentry = "./src/app.py"\n'))
    assert m.entry_path.resolve() == (tmp_path / "src" / "app.py").resolve()


@pytest.mark.parametrize(
    "toml, message",
    [
        ('[package]\nname = "x"\n#' + "x" * 70_000 + "\n", "over 65536 bytes"),
        ('[package]\nname = "x"\nv = ' + "[" * 3000 + "]" * 3000 + "\n", "nested over 16 deep"),
        ("[" + ".".join(f"t{i}" for i in range(20)) + ']\n[package]\nname = "x"\n', "nested over 16 deep"),
        ('parameters = [1]\n[package]\nname = "x"\n', r"\[parameters\] must be a table"),
        ('[package]\nname = "x"\n[parameters]\n' + "".join(f'p{i} = "int"\n' for i in range(300)), "300 parameters"),
    ],
)
def test_oversized_or_deeply_nested_manifests_are_refused(tmp_path, toml, message):
    with pytest.raises(InvalidInput, match=message):
        load_manifest(_inferlet(tmp_path, toml))


def test_shown_as_keeps_the_folder_path_out_of_messages(tmp_path):
    with pytest.raises(InvalidInput, match=r"^the archive/Pie.toml: \[package\]") as err:
        load_manifest(_inferlet(tmp_path, "[other]\n"), shown_as="the archive")
    assert str(tmp_path) not in str(err.value)
