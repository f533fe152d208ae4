"""The whole SDK behaves the same in every runner.

Each program of ``programs/`` exercises one area of the SDK, checks its own invariants (it raises
when one fails) and returns what it observed: tokens, texts, lengths, page counts, probe values to
six significant digits, the class and message of every refused call. The programs run through a
real server once per runner (in-process, a worker process, the wasm sandbox) on the dummy backend,
whose outputs depend only on each row's (token, position), so a sandboxed run must return exactly
the in-process value and send the same Stdout and File events (and the same Stderr text).

Two differences are the runners' own, by design: the synchronous forms block, which only the
sandboxed runners allow (in-process they raise Unsupported, and a plain ``def main`` is refused).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from runner_harness import Outcome, program_folders
from runner_scenarios import (EXPECTED_ERRORS, IN_PROCESS_ONLY, MAIN_EXIT_CASES, RUNNERS, SANDBOXED, SCENARIOS,
                              SYNC_FORMS_IN_PROCESS, SYNC_FORMS_SANDBOXED)

IDS = [sc.id for sc in SCENARIOS]
DIFFERS_BY_DESIGN = {"sync-forms", "sync-main"}  # checked by their own tests below


def expected_end(runner: str, scenario_id: str) -> tuple[str, str | None]:
    """How a run should end: ``("return", None)`` or ``("error", text)``."""
    if runner == "in-process" and scenario_id in IN_PROCESS_ONLY:
        return IN_PROCESS_ONLY[scenario_id]
    if scenario_id in EXPECTED_ERRORS:
        return "error", EXPECTED_ERRORS[scenario_id]
    return "return", None


def output_events(outcome: Outcome) -> dict[str, object]:
    """What a run sent besides its value: Stdout and File events in order, and its Stderr text."""
    return {"stdout_and_files": outcome.of_kind("stdout", "file"),
            "stderr": "".join(value for _, value in outcome.of_kind("stderr"))}


def test_every_program_folder_has_a_scenario():
    assert sorted({sc.program for sc in SCENARIOS}) == program_folders()
    assert len(set(IDS)) == len(IDS)
    for folder in program_folders():
        assert (Path(__file__).parent / "programs" / folder / "main.py").is_file()


@pytest.mark.parametrize("scenario_id", IDS)
@pytest.mark.parametrize("runner", RUNNERS)
def test_each_program_ends_as_expected_in_each_runner(runs, engine, runner, scenario_id):
    outcome = runs.of(runner)[scenario_id]
    kind, text = expected_end(runner, scenario_id)
    assert outcome.final[0] == kind, outcome.final
    if text is not None:
        assert outcome.final[1] == text
    assert runs.pools_whole[runner] and engine.pools_whole(), f"the {runner} runs left KV pages allocated"


@pytest.mark.parametrize("scenario_id", [i for i in IDS if i not in DIFFERS_BY_DESIGN])
@pytest.mark.parametrize("runner", SANDBOXED)
def test_each_program_returns_the_in_process_value_and_output_in_the_sandboxed_runners(runs, engine, runner, scenario_id):
    here, there = runs.of("in-process")[scenario_id], runs.of(runner)[scenario_id]
    assert there.final == here.final
    assert output_events(there) == output_events(here)
    assert runs.pools_whole[runner] and engine.pools_whole(), f"the {runner} runs left KV pages allocated"


@pytest.mark.parametrize("how", sorted(MAIN_EXIT_CASES))
@pytest.mark.parametrize("runner", RUNNERS)
def test_sys_exit_and_keyboard_interrupt_end_the_inferlet_after_its_output_in_each_runner(runs, engine, runner, how):
    out = runs.of(runner)[f"main-exits[{how}]"]
    text = MAIN_EXIT_CASES[how]
    assert out.final == (("return", None) if text is None else ("error", text))
    assert out.of_kind("stdout")[-2:] == [("stdout", "a whole line\n"), ("stdout", "and a partial one")]
    assert runs.pools_whole[runner] and engine.pools_whole(), f"the {runner} runs left KV pages allocated"


def test_synchronous_forms_raise_unsupported_in_process_naming_the_async_form(runs, engine):
    out = runs.of("in-process")["sync-forms"]
    assert out.final[0] == "return", out.final
    assert out.final[1]["forms"] == SYNC_FORMS_IN_PROCESS
    assert engine.pools_whole()


@pytest.mark.parametrize("runner", SANDBOXED)
def test_synchronous_forms_give_what_the_async_forms_give_where_a_runner_may_block(runs, engine, runner):
    here, there = runs.of("in-process")["sync-forms"], runs.of(runner)["sync-forms"]
    assert there.final[0] == "return", there.final
    assert there.final[1]["forms"] == SYNC_FORMS_SANDBOXED
    assert there.final[1]["reference"] == here.final[1]["reference"]
    assert engine.pools_whole()


@pytest.mark.parametrize("runner", SANDBOXED)
def test_a_plain_def_main_gets_the_values_async_code_awaits_where_a_runner_may_block(runs, engine, runner):
    reference = runs.of("in-process")["sync-forms"].final[1]["reference"]
    plain = runs.of(runner)["sync-main"]
    assert plain.final[0] == "return", plain.final
    value = plain.final[1]
    assert (value["text"], value["tokens"]) == (reference["text"], reference["tokens"])
    assert (value["message"], value["file"], value["pulled"], value["next"], value["mcp"]) == \
        ("hi", "blob", "queued", "x", {"result": 3})
    assert value == runs.of(SANDBOXED[0])["sync-main"].final[1]  # the process and wasm runners agree
    assert engine.pools_whole()
