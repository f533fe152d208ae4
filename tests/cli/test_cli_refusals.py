"""Mistakes of a first hour with ``pie run`` are one line saying what to do: a backend option the
backend does not take, a dtype it cannot compute in, inferlet parameters without the ``--``."""

from __future__ import annotations

import re

import pytest

from pie_backend_cpu import CpuBackend
from pie_core.backend_kit.dummy import DummyBackend
from pie_core.hookspec import BackendOptions
from pie_core.models.gguf_reader import GGUFCheckpoint


def _one_error_line(err: str) -> str:
    errors = [line for line in err.splitlines() if line.startswith("error:") or "error:" in line]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


@pytest.mark.parametrize(("backend", "known"), [(CpuBackend, ": the cpu backend takes no"),
                                                 (DummyBackend, "; known: copy_us, step_ms, token_us")])
def test_backends_refuse_an_option_they_do_not_take_before_reading_weights(backend, known, tiny_model):
    spec = GGUFCheckpoint(tiny_model).spec

    def never_read():
        raise AssertionError("weights were read")
        yield  # pragma: no cover

    with pytest.raises(ValueError, match=r"unknown \w+ backend option\(s\) bogus, threads" + re.escape(known)):
        backend().pie_backend_load_model(spec, never_read(), BackendOptions(extra={"threads": 2, "bogus": True}))


@pytest.mark.parametrize(("flags", "known"), [(["--backend", "cpu"], "takes no --backend-option"),
                                              (["--dummy"], "known: copy_us, step_ms, token_us")])
def test_an_unknown_backend_option_is_one_line(pie, tiny_model, flags, known):
    r = pie("run", "hello-world", "--model", str(tiny_model), *flags, "--backend-option", "quant=int8")
    assert r.code == 1 and r.out == ""
    line = _one_error_line(r.err)
    assert "backend option(s) quant" in line and known in line


@pytest.mark.parametrize("value", ["-5", "slow", "true"])
def test_a_bad_dummy_timing_option_is_one_line_naming_it(pie, tiny_model, value):
    r = pie("run", "hello-world", "--model", str(tiny_model), "--dummy", "--backend-option", f"step_ms={value}")
    assert r.code == 1 and r.out == ""
    line = _one_error_line(r.err)
    assert "dummy backend option step_ms=" in line and "expected a number >= 0" in line


def test_float16_on_the_cpu_backend_is_one_line_naming_the_dtypes_it_takes(pie, tiny_model):
    r = pie("run", "hello-world", "--model", str(tiny_model), "--backend", "cpu", "--dtype", "float16")
    assert r.code == 1
    line = _one_error_line(r.err)
    assert "computes in float32 only, not 'float16'; use --dtype float32 (or auto)" in line


def test_cpu_still_loads_without_options(pie, tiny_model):
    r = pie("run", "hello-world", "--model", str(tiny_model), "--backend", "cpu", "--dtype", "float32", "--", "--name", "x")
    assert r.code == 0 and r.out.strip() == "hello x" and r.engine.pools_whole()


def test_inferlet_parameters_without_the_double_dash_get_a_hint_with_it(pie):
    r = pie("run", "text-completion", "--prompt", "hi", "--max-tokens", "3")
    assert r.code == 2 and r.engines == []
    line = _one_error_line(r.err)
    assert "unrecognized arguments: --prompt hi --max-tokens 3" in line
    assert "inferlet parameters go after '--': pie run text-completion [options] -- --prompt hi --max-tokens 3" in line


def test_other_unknown_flags_keep_argparses_error(pie, capsys):
    with pytest.raises(SystemExit) as exit_:
        pie("backends", "--colour")
    assert exit_.value.code == 2 and "unrecognized arguments: --colour" in capsys.readouterr().err


def test_unknown_pie_flags_after_the_double_dash_reach_the_inferlet(pie, tiny_model):
    r = pie("run", "text-completion", "--model", str(tiny_model), "--dummy", "--", "--prompt", "hi", "--max-tokens", "2")
    assert r.code == 0, r.err
    assert r.out.strip().splitlines()[-1] == '{"tokens": 2}' and r.engine.pools_whole()


