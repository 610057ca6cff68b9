"""The condition language of job dependencies: comparisons of reported metrics, joined by
`and`, `or` and `not`. Nothing else.

    accuracy > 0.95
    loss <= 0.1 and not (epochs < 3)
    0.9 <= accuracy < 0.99 or f1 == 1

Python's own parser reads the text (`ast.parse(mode="eval")`) and every node of the tree is
checked against a whitelist before anything is evaluated; evaluation walks the checked tree
itself. No `eval`, no attribute access, calls, subscripts, arithmetic or names other than
metrics, so a condition cannot do anything but compare numbers.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass

MAX_LENGTH = 500

_COMPARE: dict[type[ast.cmpop], Callable[[float, float], bool]] = {
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}


class ConditionError(ValueError):
    """The text is not a condition of the language (the message says what is not allowed)."""


@dataclass(frozen=True)
class Condition:
    text: str
    tree: ast.expr
    names: frozenset[str]  # the metrics it reads


def parse_condition(text: str) -> Condition:
    """Check `text` against the language; raise ConditionError naming the first offence."""
    if not isinstance(text, str) or not text.strip():
        raise ConditionError("a condition must be a non-empty string")
    if len(text) > MAX_LENGTH:
        raise ConditionError(f"a condition is at most {MAX_LENGTH} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise ConditionError(f"not a valid expression: {exc.msg}") from None
    names: set[str] = set()
    _check_bool(tree, names)
    return Condition(text.strip(), tree, frozenset(names))


def _what(node: ast.AST) -> str:
    return type(node).__name__


def _check_bool(node: ast.expr, names: set[str]) -> None:
    """A boolean position: a comparison, or and/or/not of boolean positions."""
    if isinstance(node, ast.BoolOp):
        for value in node.values:
            _check_bool(value, names)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        _check_bool(node.operand, names)
    elif isinstance(node, ast.Compare):
        for op in node.ops:
            if type(op) not in _COMPARE:
                raise ConditionError(f"operator {_what(op)} is not allowed (use > >= < <= == !=)")
        for operand in (node.left, *node.comparators):
            _check_value(operand, names)
    else:
        raise ConditionError(
            f"{_what(node)} is not allowed here: a condition is comparisons joined by and, or, not"
        )


def _check_value(node: ast.expr, names: set[str]) -> None:
    """A compared value: a metric name or a number (a leading minus allowed)."""
    if isinstance(node, ast.Name):
        names.add(node.id)
    elif not _is_literal(node):
        raise ConditionError(f"{_what(node)} is not allowed: compare metric names and numbers only")


def _is_literal(node: ast.expr) -> bool:
    """A number, with a leading sign allowed."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        node = node.operand
    return isinstance(node, ast.Constant) and _is_number(node.value)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def evaluate(cond: Condition, metrics: Mapping[str, float]) -> bool:
    """The condition over `metrics`; raise ConditionError when a metric it reads is missing."""
    missing = sorted(cond.names - set(metrics))
    if missing:
        raise ConditionError(f"metric(s) not reported: {', '.join(missing)}")
    return _truth(cond.tree, metrics)


def _truth(node: ast.expr, metrics: Mapping[str, float]) -> bool:
    if isinstance(node, ast.BoolOp):
        values = (_truth(v, metrics) for v in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.UnaryOp):  # `not`: the only unary operator in a bool position
        return not _truth(node.operand, metrics)
    assert isinstance(node, ast.Compare)
    left = _value(node.left, metrics)
    for op, right_node in zip(node.ops, node.comparators, strict=True):
        right = _value(right_node, metrics)
        if not _COMPARE[type(op)](left, right):
            return False
        left = right
    return True


def _value(node: ast.expr, metrics: Mapping[str, float]) -> float:
    if isinstance(node, ast.Name):
        return float(metrics[node.id])
    if isinstance(node, ast.UnaryOp):
        number = _value(node.operand, metrics)
        return -number if isinstance(node.op, ast.USub) else number
    assert isinstance(node, ast.Constant) and isinstance(node.value, int | float)
    return float(node.value)
