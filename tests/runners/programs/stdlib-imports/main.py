"""The standard library an inferlet can count on: every module of a common list imports, and
``struct`` decodes a Logits probe as ``array`` does (the one place this suite uses ``struct``)."""

import importlib
from array import array

from inferlet import Context, Logits, Model, runtime

MODULES = ["abc", "array", "asyncio", "base64", "binascii", "bisect", "codecs", "collections", "contextlib", "copy",
           "csv", "dataclasses", "datetime", "decimal", "difflib", "enum", "fractions", "functools", "hashlib", "heapq",
           "hmac", "html", "io", "itertools", "json", "math", "operator", "os", "pathlib", "pprint", "random", "re",
           "statistics", "string", "struct", "sys", "textwrap", "time", "typing", "unicodedata", "uuid", "zlib"]


async def main(input):
    missing = []
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001
            missing.append([name, f"{type(exc).__name__}: {exc}"])
    model = Model.load(runtime.models()[0])
    with Context(model) as ctx:
        fwd = ctx.forward()
        fwd.input([1, 2, 3])
        h = fwd.probe(2, Logits())
        raw = (await fwd.execute()).logits(h)
    by_array = array("f")
    by_array.frombytes(raw)
    try:
        import struct

        by_struct = struct.unpack(f"={len(raw) // 4}f", raw)
        struct_agrees = list(by_struct) == list(by_array)
    except Exception as exc:  # noqa: BLE001
        struct_agrees = f"{type(exc).__name__}: {exc}"
    return {"missing": missing, "struct_agrees_with_array": struct_agrees, "floats": len(by_array)}
