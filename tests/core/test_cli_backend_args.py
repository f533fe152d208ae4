"""``--dtype`` / ``--backend-option``: parsed into the ``BackendOptions`` the engine passes on."""

from __future__ import annotations

import argparse

import pytest

from pie_core.cli.backend_args import add_backend_arguments, backend_options
from pie_core.errors import InvalidInput


def _parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_backend_arguments(p)
    return p.parse_args(list(argv))


def test_defaults_ask_for_the_backends_best_precision_and_no_extras():
    opts = backend_options(_parse())
    assert opts.dtype == "auto" and opts.extra == {}


def test_options_are_typed_and_repeatable():
    opts = backend_options(
        _parse("--dtype", "float32", "--backend-option", "quant=int8", "--backend-option", "threads=2",
               "--backend-option", "weights_cache=False", "--backend-option", "kernels = torch")
    )
    assert opts.dtype == "float32"
    assert opts.extra == {"quant": "int8", "threads": 2, "weights_cache": False, "kernels": "torch"}


@pytest.mark.parametrize("bad", ["quant", "=int8", ""])
def test_an_option_without_key_and_value_is_refused(bad):
    with pytest.raises(InvalidInput, match="expected KEY=VALUE"):
        backend_options(_parse("--backend-option", bad))
