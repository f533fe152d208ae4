"""Schemas shared by the grammar tests."""

from __future__ import annotations

import uuid
from typing import Any


def heavy_schema() -> dict[str, Any]:
    """A schema that takes a good fraction of a second to compile (unique, so never cached)."""
    props: dict[str, Any] = {
        f"field_{i}": {"anyOf": [
            {"type": "string", "pattern": "[a-z]{2,%d}" % (5 + i % 7)},
            {"type": "integer", "minimum": 0, "maximum": 10 ** (i % 9 + 1)},
            {"type": "array", "items": {"enum": [f"v{j}" for j in range(30)]}, "maxItems": 12},
        ]}
        for i in range(60)
    }
    props["nonce"] = {"const": uuid.uuid4().hex}
    return {"type": "object", "properties": props, "required": list(props)}


def _str(n: int) -> dict[str, Any]:
    return {"type": "string", "maxLength": n}


def _int(lo: int, hi: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": lo, "maximum": hi}


def _obj(required: list[str] | None = None, **props: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props}
    if required is not None:
        out["required"] = required
    return out


TWENTY: list[tuple[str, dict[str, Any]]] = [
    ("a person", _obj(["name", "age"], name=_str(20), age=_int(0, 120))),
    ("favourite colours", {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3}),
    ("a test result", _obj(["ok"], ok={"type": "boolean"}, score={"type": "number", "minimum": 0, "maximum": 1})),
    ("a city and where it is", _obj(["city", "geo"], city=_str(20),
                                    geo=_obj(["lat", "lon"], lat=_int(-90, 90), lon=_int(-180, 180)))),
    ("an id, a number or a short name", {"anyOf": [{"type": "integer"}, _str(10)]}),
    ("a priority", {"enum": ["low", "medium", "high"]}),
    ("a rating from 1 to 10", _int(1, 10)),
    ("a todo list", {"type": "array", "items": _obj(["id", "done"], id=_int(0, 99), done={"type": "boolean"}),
                     "minItems": 1, "maxItems": 2}),
    ("a book", _obj(["title", "year"], title=_str(30), year=_int(1000, 2100),
                    tags={"type": "array", "items": _str(10), "maxItems": 2})),
    ("a product", _obj(["price", "currency", "in_stock"], price={"type": "number", "minimum": 0, "maximum": 1000},
                       currency={"enum": ["USD", "EUR"]}, in_stock={"type": "boolean"})),
    ("a user's nickname, or null", _obj(["nickname"], nickname={"anyOf": [_str(12), {"type": "null"}]})),
    ("a 2x2 grid of digits", {"type": "array", "items": {"type": "array", "items": _int(0, 9), "minItems": 2,
                                                         "maxItems": 2}, "minItems": 2, "maxItems": 2}),
    ("an event and its date", _obj(["name", "date"], name=_str(20),
                                   date={"type": "string", "pattern": "[0-9]{4}-[0-9]{2}-[0-9]{2}"})),
    ("a versioned status", _obj(["version", "ok"], version={"const": "1.0"}, ok={"type": "boolean"})),
    ("a 2D point", {"type": "array", "items": {"type": "number", "minimum": -5, "maximum": 5},
                    "minItems": 2, "maxItems": 2}),
    ("a recipe", _obj(["name", "ingredients"], name=_str(20),
                      ingredients={"type": "array", "items": _obj(["item", "grams"], item=_str(15), grams=_int(1, 1000)),
                                   "minItems": 1, "maxItems": 1})),
    ("whether the sky is blue", {"type": "boolean"}),
    ("an airport code", {"type": "string", "pattern": "[A-Z]{3}"}),
    ("a pet", {"anyOf": [_obj(["cat"], cat=_str(10)), _obj(["dog"], dog=_str(10))]}),
    ("two optional fields", _obj(None, a=_int(0, 9), b=_str(5))),
]
"""Twenty varied schemas (nested objects, arrays, enums, numbers, optional fields, anyOf), each
bounded so that a reply fits in a few dozen tokens."""
