"""``main``'s return value becomes the Return event as JSON (the reference's entry point); a value
that is not JSON is an error event naming its type, never its ``str()`` or ``repr()``.

The process and wasm runners give the same events: tests/server/test_return_value_isolated.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from inferlet import Context, Model, runtime
from pie_core.runtime.instance import check_return

ADVICE = "return JSON-compatible values (dict, list, str, int, float, bool or None)"


@dataclass
class Point:
    x: int


BAD = [
    ({1, 2}, "main returned a value of type set, which is not JSON-serialisable"),
    ({"blob": b"\x00"}, "main returned a value of type dict holding a value of type bytes, which is not JSON-serialisable"),
    ([Point(1)], "main returned a value of type list holding a value of type Point, which is not JSON-serialisable"),
    (float("nan"), "main returned a value of type float that is or holds NaN or infinity, which JSON cannot represent"),
    ({"x": [float("inf")]}, "main returned a value of type dict that is or holds NaN or infinity"),
    ({(1, 2): "pair"}, "main returned a value of type dict with a dict key that is not a str, int, float, bool or None"),
]


@pytest.mark.parametrize("value, message", BAD, ids=["set", "bytes-inside", "object-inside", "nan", "inf-inside", "tuple-key"])
def test_a_non_json_return_value_is_a_one_line_error_naming_its_type(dummy, value, message):
    async def main(_):
        ctx = Context(Model.load(runtime.models()[0]))  # left open: the runner still frees it
        ctx.user("hold a page")
        await ctx.flush()
        return value

    final, events = dummy.run(main)
    assert final.kind == "error", final
    assert final.value.startswith("TypeError: " + message)
    assert final.value.endswith(": " + ADVICE) and "\n" not in final.value
    assert [e.kind for e in events] == ["error"]  # no Return event before it


@pytest.mark.parametrize("value", ["hello", 3, 2.5, True, None, [1, "a", None], {"a": {"b": [1.5, False]}}, (1, 2), {1: "x"}])
def test_json_values_are_returned_as_they_are(dummy, value):
    async def main(_):
        return value

    assert dummy.value(main) == value


def test_a_self_containing_list_is_refused_not_recursed_forever():
    loop: list = []
    loop.append(loop)
    with pytest.raises(TypeError, match="main returned a value of type list that contains itself: return JSON"):
        check_return(loop)
