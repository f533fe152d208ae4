"""main's return value must be strict JSON: NaN, a set or bytes end the run with one Error line
naming the type; a tuple is a JSON list; a deep dict crosses whole."""

VALUES = {
    "nan": lambda: {"score": float("nan")},
    "set": lambda: {1, 2},
    "bytes": lambda: b"raw",
    "tuple": lambda: (1, "a", [2.5, None, True]),
    "nested": lambda: {"a": [{"b": {"c": [1, 2, {"d": "é✓"}]}}], "big": 2**53, "neg": -0.5},
}


async def main(input):
    return VALUES[input["value"]]()
