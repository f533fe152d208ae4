"""``--backend-option step_ms=… token_us=… copy_us=…`` reach the dummy backend from ``pie run``
and ``pie serve``: its batches then sleep that long on the backend thread (the sleeps are
recorded here, never slept), and a bad value is refused in one line naming the option."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from pie_core.backend_kit import dummy as dummy_module
from pie_core.host import context as host_context
from pie_core.host.inference import forward
from pie_core.runtime.instance import run_main
from pie_core.server import PieServer
from pie_core.values import SampleSpec


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, str]]:
    """(seconds, thread name) of every sleep the dummy's backend thread asks for. ``time`` is the
    process's module, so other threads (a wasm engine's epoch ticker an earlier test left) still
    really sleep and are not recorded."""
    asked: list[tuple[float, str]] = []
    real = dummy_module.time.sleep

    def sleep(seconds: float) -> None:
        name = threading.current_thread().name
        if name.startswith("pie-backend"):
            asked.append((seconds, name))
        else:
            real(seconds)

    monkeypatch.setattr(dummy_module.time, "sleep", sleep)
    return asked


def test_pie_run_batches_sleep_step_ms_plus_token_us_per_token(pie, tiny_model, sleeps):
    r = pie("run", "text-completion", "--model", str(tiny_model), "--dummy", "--backend-option", "step_ms=10",
            "--backend-option", "token_us=2.5", "--", "--prompt", "hi", "--max-tokens", "3")
    assert r.code == 0, r.err
    assert len(sleeps) >= 3  # the prompt, then one batch per further token
    for seconds, thread in sleeps:
        tokens = (seconds - 10e-3) / 2.5e-6
        assert tokens == pytest.approx(round(tokens)) and round(tokens) >= 1
        assert thread.startswith("pie-backend")


def test_pie_serve_passes_the_options_to_its_dummy(pie, tiny_model, sleeps, monkeypatch):
    """The server stops instead of waiting for a signal, after one batch on its engine."""
    served: list[Any] = []

    async def one_batch_then_stop(self: PieServer) -> None:
        model = next(iter(self.engine.models.values()))

        async def main(_: Any) -> None:
            ctx = host_context.create(model.name)
            await forward(ctx, [1, 2, 3, 4], samples=[SampleSpec(index=3)])
            ctx.release()

        served.append((await run_main(self.engine, main, {}, lambda event: None)).kind)
        await self.close()

    monkeypatch.setattr(PieServer, "serve_until_signalled", one_batch_then_stop)
    r = pie("serve", "--dummy", "--no-auth", "--port", "0", "--isolation", "inprocess", "--model", str(tiny_model),
            "--backend-option", "step_ms=4", "--backend-option", "token_us=100")
    assert r.code == 0 and served == ["return"], r.err
    assert [seconds for seconds, _ in sleeps] == [pytest.approx(4e-3 + 4 * 100e-6)]


def test_a_bad_timing_option_on_pie_serve_is_one_line(pie, tiny_model, monkeypatch):
    async def served(self: PieServer) -> None:  # instead of waiting for a signal
        await self.close()
        raise AssertionError("pie serve started with token_us=-3")

    monkeypatch.setattr(PieServer, "serve_until_signalled", served)
    r = pie("serve", "--dummy", "--no-auth", "--port", "0", "--isolation", "inprocess", "--model", str(tiny_model),
            "--backend-option", "token_us=-3")
    assert r.code == 1 and "Traceback" not in r.err
    (line,) = [line for line in r.err.splitlines() if "error:" in line]
    assert "dummy backend option token_us=-3: expected a number >= 0" in line
