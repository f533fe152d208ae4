"""A restricted evaluator for the expressions the model writes.

Only a whitelist of syntax is run: literals (numbers, strings, booleans, None, lists, tuples),
arithmetic, comparisons, ``and``/``or``/``not``, conditional expressions, subscripts, names bound
by earlier results and calls, by name, to a few pure functions (and to those the caller binds). No attributes, no comprehensions, no
lambdas, no imports: nothing reaches an object's internals or the inferlet's globals. Sizes are
bounded before they are built (numbers of at most ``MAX_BITS`` bits, sequences of at most
``MAX_ITEMS`` items, at most ``MAX_NODES`` syntax nodes), so an expression cannot exhaust memory or
time. Everything else raises :class:`Refused` with a one-line reason for the model.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any

MAX_NODES = 200
MAX_BITS = 4096
MAX_ITEMS = 10_000
MAX_SOURCE = 500


class Refused(Exception):
    """The expression is not allowed or failed; the message says why in one line."""


def _range(*args: int) -> list[int]:
    r = range(*args)
    if len(r) > MAX_ITEMS:
        raise Refused(f"range of {len(r)} items exceeds {MAX_ITEMS}")
    return list(r)


FUNCTIONS = {"abs": abs, "min": min, "max": max, "round": round, "sum": sum, "len": len, "sorted": sorted,
             "range": _range, "sqrt": math.sqrt, "int": int, "float": float, "str": str}

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}


def _checked(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_BITS:
        raise Refused(f"a number of more than {MAX_BITS} bits")
    if isinstance(value, (str, list, tuple)) and len(value) > MAX_ITEMS:
        raise Refused(f"a sequence of more than {MAX_ITEMS} items")
    return value


def _binary(op: ast.operator, a: Any, b: Any) -> Any:
    if isinstance(op, ast.Pow) and isinstance(b, (int, float)) and isinstance(a, (int, float)):
        if abs(b) > 1000 or (isinstance(a, int) and isinstance(b, int) and b > 0
                             and abs(a) > 1 and b * math.log2(abs(a)) > MAX_BITS):
            raise Refused(f"{a!r:.20} ** {b!r:.20} is too large")
    if isinstance(op, ast.Mult) and (isinstance(a, (str, list, tuple)) or isinstance(b, (str, list, tuple))):
        count = b if isinstance(a, (str, list, tuple)) else a
        seq = a if isinstance(a, (str, list, tuple)) else b
        if isinstance(count, int) and count * len(seq) > MAX_ITEMS:
            raise Refused(f"a sequence of more than {MAX_ITEMS} items")
    return _BINARY[type(op)](a, b)


class _Evaluator:
    def __init__(self, names: dict[str, Any]) -> None:
        self.names = names

    def run(self, node: ast.AST) -> Any:
        return _checked(self._eval(node))

    def _eval(self, node: ast.AST) -> Any:  # noqa: C901 - one branch per allowed node kind
        match node:
            case ast.Expression(body=body):
                return self.run(body)
            case ast.Constant(value=value) if isinstance(value, (int, float, str, bool, type(None))):
                return value
            case ast.Name(id=name):
                if name in self.names:
                    return self.names[name]
                raise Refused(f"unknown name {name!r}; known: {', '.join(sorted(self.names)) or 'none'}")
            case ast.List(elts=items) | ast.Tuple(elts=items):
                values = [self.run(item) for item in items]
                return values if isinstance(node, ast.List) else tuple(values)
            case ast.BinOp(left=left, op=op, right=right) if type(op) in _BINARY:
                return _binary(op, self.run(left), self.run(right))
            case ast.UnaryOp(op=op, operand=operand) if type(op) in _UNARY:
                return _UNARY[type(op)](self.run(operand))
            case ast.BoolOp(op=ast.And(), values=values):
                result: Any = True
                for v in values:
                    result = self.run(v)
                    if not result:
                        return result
                return result
            case ast.BoolOp(op=ast.Or(), values=values):
                result = False
                for v in values:
                    result = self.run(v)
                    if result:
                        return result
                return result
            case ast.Compare(left=left, ops=ops, comparators=rights) if all(type(o) in _COMPARE for o in ops):
                a = self.run(left)
                for op, right in zip(ops, rights):
                    b = self.run(right)
                    if not _COMPARE[type(op)](a, b):
                        return False
                    a = b
                return True
            case ast.IfExp(test=test, body=body, orelse=orelse):
                return self.run(body) if self.run(test) else self.run(orelse)
            case ast.Subscript(value=value, slice=index):
                return self.run(value)[self.run(index)]
            case ast.Slice(lower=lo, upper=hi, step=step):
                return slice(*(None if p is None else self.run(p) for p in (lo, hi, step)))
            case ast.Call(func=ast.Name(id=name), args=args, keywords=[]):
                fn = FUNCTIONS.get(name) or self.names.get(name)
                if not callable(fn):
                    raise Refused(f"unknown function {name!r}; known: {', '.join(sorted(FUNCTIONS))}")
                return fn(*(self.run(a) for a in args))
            case ast.Call(func=func, keywords=[]):
                raise Refused(f"calling {type(func).__name__} is not allowed: call a function by its name")
        raise Refused(f"{type(node).__name__} is not allowed here")


def evaluate(source: str, names: dict[str, Any] | None = None) -> Any:
    """The value of the expression ``source``, with ``names`` bound.

    Raises:
        Refused: Not an expression, not allowed, too large, or it failed (the reason, one line).
    """
    if len(source) > MAX_SOURCE:
        raise Refused(f"expression longer than {MAX_SOURCE} characters")
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError as exc:
        raise Refused(f"not a Python expression: {exc.msg}") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise Refused(f"expression of more than {MAX_NODES} syntax nodes")
    try:
        return _Evaluator(dict(names or {})).run(tree)
    except Refused:
        raise
    except (ArithmeticError, TypeError, ValueError, IndexError, KeyError, RecursionError) as exc:
        raise Refused(f"{type(exc).__name__}: {exc}") from None
