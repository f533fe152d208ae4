import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pie_core import brle
from pie_core.errors import InvalidInput


def test_first_run_is_false():
    assert brle.decode([0, 3, 2]).tolist() == [True, True, True, False, False]
    assert brle.decode([2, 1]).tolist() == [False, False, True]


@given(st.lists(st.booleans(), max_size=200))
def test_encode_decode_round_trip(bits):
    assert brle.decode(brle.encode(bits)).tolist() == bits


def test_length_mismatch_names_the_mask():
    with pytest.raises(InvalidInput, match="attention mask row 2: BRLE covers 5 entries, expected 7"):
        brle.decode([1, 4], 7, "attention mask row 2")


def test_negative_runs_are_refused():
    with pytest.raises(InvalidInput, match=">= 0"):
        brle.decode([1, -1])


def test_pack_bits_is_little_endian_per_byte():
    mask = np.zeros(10, dtype=bool)
    mask[[0, 9]] = True
    assert brle.pack_bits(mask).tolist() == [1, 2]
