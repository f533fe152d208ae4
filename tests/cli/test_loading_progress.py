"""Model loading says what it is doing: one line per phase on stderr when it is not a terminal,
a bar on a terminal that turns to the backend's work (no frozen 100%) once the weights are read."""

from __future__ import annotations

import io

from pie_core.cli.progress import LoadReporter, loading_bar

FIRST_LOAD = [
    "fingerprinting tiny-qwen2.gguf",
    "reading the model's header and tokenizer",
    "dequantising weights into the cache (first load of this model)",
    "backend preparing the weights",
]


def _phases(err: str, label: str) -> list[str]:
    return [line[len(label) + 2 :] for line in err.splitlines() if line.startswith(f"{label}: ")]


def test_a_first_load_off_a_terminal_prints_each_phase_once_in_order_then_the_time(pie, tiny_model):
    r = pie("run", "hello-world", "--backend", "cpu", "--model", str(tiny_model), "--", "--name", "p")
    assert r.code == 0, r.err
    phases = _phases(r.err, f"loading {tiny_model}")
    assert len(phases) == len(FIRST_LOAD)
    assert all(phase.startswith(expected) for phase, expected in zip(phases, FIRST_LOAD)), phases
    last = r.err.strip().splitlines()[-1]
    assert last.startswith(f"loaded {tiny_model} on cpu in ") and last.endswith("s")
    assert r.engine.pools_whole()


def test_a_second_load_reads_the_cache_and_does_not_fingerprint_again(pie, tiny_model):
    pie("run", "hello-world", "--backend", "cpu", "--model", str(tiny_model), "--", "--name", "p")
    r = pie("run", "hello-world", "--backend", "cpu", "--model", str(tiny_model), "--", "--name", "p")
    assert _phases(r.err, f"loading {tiny_model}") == [
        "reading the model's header and tokenizer", "reading cached weights", "backend preparing the weights"]


def test_the_dummy_backend_reads_no_weights_and_says_so_by_omission(pie, tiny_model):
    pie("run", "hello-world", "--dummy", "--model", str(tiny_model), "--", "--name", "p")  # fingerprinted once
    r = pie("run", "hello-world", "--dummy", "--model", str(tiny_model), "--", "--name", "p")
    assert _phases(r.err, f"loading {tiny_model}") == ["reading the model's header and tokenizer"]


def test_quiet_prints_nothing_but_the_output(pie, tiny_model):
    r = pie("run", "hello-world", "--dummy", "--quiet", "--model", str(tiny_model), "--", "--name", "p")
    assert r.code == 0 and r.err == "" and r.out.strip() == "hello p"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_bar_follows_the_phases_and_is_indeterminate_while_the_backend_works():
    with loading_bar("loading m", stream=_Terminal()) as progress:
        assert progress.mode == "bar"
        progress.phase("reading cached weights")
        progress(50, 100)
        progress(100, 100)
        (task,) = progress._bar.tasks  # type: ignore[union-attr]
        assert task.description == "loading m: reading cached weights" and task.percentage == 100
        progress.phase("backend preparing the weights")
        (task,) = progress._bar.tasks  # type: ignore[union-attr]
        assert task.description == "loading m: backend preparing the weights"
        assert task.total is None and task.completed == 0  # a pulsing bar, not 100%


def test_off_a_terminal_a_repeated_phase_is_one_line_and_bytes_print_nothing():
    out = io.StringIO()
    reporter = LoadReporter("loading m", "lines", out)
    reporter.phase("reading cached weights")
    for done in range(0, 101, 10):
        reporter(done, 100)
    reporter.phase("reading cached weights")
    reporter.phase("backend preparing the weights")
    assert out.getvalue().splitlines() == ["loading m: reading cached weights", "loading m: backend preparing the weights"]
