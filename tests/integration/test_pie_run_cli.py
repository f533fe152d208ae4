"""``pie run`` as a user types it: the console script in a subprocess, with a private PIE_HOME.

The model cache (``PIE_CACHE_DIR``) is left alone so the assembled default model is reused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pie_core.plugins import available_backends


def _pie_command() -> list[str]:
    script = Path(sys.executable).with_name("pie")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "pie_core.cli.main"]


@pytest.fixture
def pie_cli(tmp_path: Path):
    """Run ``pie ARGS...``; returns the CompletedProcess (text mode)."""
    env = {**os.environ, "PIE_HOME": str(tmp_path / "pie-home")}

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*_pie_command(), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout
        )

    return run


def test_hello_world_greets_the_given_name(pie_cli):
    r = pie_cli("run", "hello-world", "--dummy", "--", "--name", "bob")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "hello bob"


def test_text_completion_runs_on_the_dummy_backend(pie_cli):
    r = pie_cli("run", "text-completion", "--dummy", "--", "--max-tokens", "5", "--prompt", "hi")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"tokens": 5}


def test_events_jsonl_prints_one_object_per_line_ending_with_return(pie_cli):
    r = pie_cli("run", "text-completion", "--dummy", "--events", "jsonl", "--", "--max-tokens", "3")
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in r.stdout.splitlines()]
    assert events and all(set(e) == {"event", "value"} for e in events)
    assert events[-1] == {"event": "return", "value": {"tokens": 3}}
    assert [e["event"] for e in events[:-1]] == ["stdout"] * (len(events) - 1)


def test_unknown_model_fails_and_lists_the_model_names(pie_cli):
    r = pie_cli("run", "hello-world", "--dummy", "--model", "nope")
    assert r.returncode == 1
    assert "nope" in r.stderr and "qwen2.5-coder-0.5b-instruct" in r.stderr


def test_unknown_backend_fails_and_lists_the_installed_backends(pie_cli):
    r = pie_cli("run", "hello-world", "--backend", "nope")
    assert r.returncode == 1
    assert "nope" in r.stderr
    for name in available_backends():
        assert name in r.stderr


@pytest.mark.parametrize(
    "trailing, message",
    [
        (["--max-tokens", "lots"], "max_tokens"),
        (["--max-tokens"], "max_tokens"),
        (["--max-tokns", "3"], "max_tokns"),
    ],
    ids=["not-an-int", "no-value", "misspelt"],
)
def test_bad_parameter_is_named_before_any_model_loads(pie_cli, trailing, message):
    # --model nope would fail on loading: the parameter error must come first
    r = pie_cli("run", "text-completion", "--model", "nope", "--", *trailing)
    assert r.returncode == 1
    assert message in r.stderr and "unknown model" not in r.stderr, r.stderr


def test_inferlet_that_raises_exits_1_with_its_message_on_stderr(pie_cli, tmp_path):
    folder = tmp_path / "boom"
    folder.mkdir()
    (folder / "Pie.toml").write_text(
        '[package]\nname = "boom"\nversion = "0.1.0"\ndescription = "Always fails."\n\n[parameters]\n'
    )
    (folder / "main.py").write_text(
        "async def main(input: dict) -> str:\n    raise RuntimeError('the boom inferlet failed on purpose')\n"
    )
    r = pie_cli("run", str(folder), "--dummy")
    assert r.returncode == 1
    assert "the boom inferlet failed on purpose" in r.stderr
    assert "Traceback" not in r.stderr


def test_unknown_example_name_lists_the_examples(pie_cli):
    r = pie_cli("run", "no-such-example", "--dummy")
    assert r.returncode == 1
    assert "no-such-example" in r.stderr
    assert "hello-world" in r.stderr and "text-completion" in r.stderr


@pytest.mark.model
def test_text_completion_on_the_cpu_backend_prints_a_reply(pie_cli):
    r = pie_cli(
        "run", "text-completion", "--backend", "cpu", "--", "--prompt", "Say hi", "--max-tokens", "8", timeout=300
    )
    assert r.returncode == 0, r.stderr
    *text, last = r.stdout.strip().splitlines()
    generated = json.loads(last)["tokens"]
    assert 1 <= generated <= 8
    assert "".join(text).strip(), f"no reply text printed: {r.stdout!r}"


@pytest.mark.skipif("torch" not in available_backends(), reason="the torch backend is not installed")
def test_backend_options_reach_the_backend_which_refuses_unknown_ones(pie_cli):
    r = pie_cli("run", "hello-world", "--backend", "torch", "--backend-option", "quant=int3")
    assert r.returncode == 1
    assert "unsupported quant 'int3'" in r.stderr


def test_print_in_an_inferlet_is_a_stdout_event_not_a_raw_line(pie_cli, tmp_path):
    (tmp_path / "Pie.toml").write_text('[package]\nname = "printer"\nversion = "0.1.0"\ndescription = "prints"\n')
    (tmp_path / "main.py").write_text(
        "async def main(input):\n    print('partial', end='')\n    print(' line')\n    print('second')\n    return 1\n")
    r = pie_cli("run", str(tmp_path), "--dummy", "--events", "jsonl")
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in r.stdout.splitlines()]
    assert events == [{"event": "stdout", "value": "partial line\n"}, {"event": "stdout", "value": "second\n"},
                      {"event": "return", "value": 1}]
