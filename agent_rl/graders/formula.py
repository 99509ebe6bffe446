"""The multi grader's `calculate_output`: arithmetic over sub-grader scores, read with `ast` and never `eval`'d.

The formula comes with the job, so it is untrusted text. It is parsed with Python's parser and only these nodes
are walked: numbers, the sub-graders' names, + - * / ** (and OpenAI's ^, which means power here, not xor),
unary + and -, parentheses, and calls of min, max, abs, sqrt, log, exp, floor, ceil by name. Anything else —
attribute access, subscripts, other names such as __import__, keywords, comparisons — is refused when the
formula is checked, before any grading.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Collection, Mapping

from agent_rl.graders.config import GraderConfigError

MAX_FORMULA_CHARS = 2000
MAX_DEPTH = 100  # nested operations; the walk below recurses once per level


class FormulaError(ArithmeticError):
    """The formula could not be evaluated for these scores (division by zero, log of 0, overflow...)."""


_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.BitXor: operator.pow,  # OpenAI's formulas write power as ^
}
_UNARY: dict[type[ast.unaryop], Callable[[float], float]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
# name -> (function, fewest arguments, most arguments or None for any number)
_FUNCTIONS: dict[str, tuple[Callable[..., float], int, int | None]] = {
    "min": (lambda *xs: min(xs), 1, None),
    "max": (lambda *xs: max(xs), 1, None),
    "abs": (abs, 1, 1),
    "sqrt": (math.sqrt, 1, 1),
    "log": (math.log, 1, 2),  # natural log; log(x, base) as in Python
    "exp": (math.exp, 1, 1),
    "floor": (math.floor, 1, 1),
    "ceil": (math.ceil, 1, 1),
}


def parse_formula(text: str, names: Collection[str]) -> ast.Expression:
    """The checked syntax tree of a formula over `names`; a GraderConfigError says what is not allowed."""
    if len(text) > MAX_FORMULA_CHARS:
        raise GraderConfigError(f"calculate_output is {len(text)} characters, more than {MAX_FORMULA_CHARS}")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise GraderConfigError(f"calculate_output {text!r} is not a formula: {exc}") from None
    _check(tree.body, text, frozenset(names), 0)
    return tree


def _check(node: ast.expr, text: str, names: frozenset[str], depth: int) -> None:
    def refuse(what: str) -> GraderConfigError:
        return GraderConfigError(
            f"calculate_output {text!r}: {what} is not allowed; use numbers, the sub-graders' names "
            f"({', '.join(sorted(names)) or 'none'}), + - * / ** ^, parentheses and {', '.join(_FUNCTIONS)}"
        )

    if depth > MAX_DEPTH:
        raise refuse(f"nesting deeper than {MAX_DEPTH}")
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise refuse(f"the constant {node.value!r}")
    elif isinstance(node, ast.Name):
        if node.id not in names:
            raise refuse(f"the name {node.id!r} (not a sub-grader)")
    elif isinstance(node, ast.BinOp):
        if type(node.op) not in _BINARY:
            raise refuse(f"the operator {type(node.op).__name__}")
        _check(node.left, text, names, depth + 1)
        _check(node.right, text, names, depth + 1)
    elif isinstance(node, ast.UnaryOp):
        if type(node.op) not in _UNARY:
            raise refuse(f"the operator {type(node.op).__name__}")
        _check(node.operand, text, names, depth + 1)
    elif isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCTIONS:
            raise refuse(f"calling {ast.unparse(node.func)}")
        if node.keywords:
            raise refuse(f"keyword arguments to {node.func.id}")
        _, fewest, most = _FUNCTIONS[node.func.id]
        if len(node.args) < fewest or (most is not None and len(node.args) > most):
            raise refuse(f"{node.func.id} with {len(node.args)} argument(s)")
        for argument in node.args:
            _check(argument, text, names, depth + 1)
    else:
        raise refuse(f"{type(node).__name__} ({ast.unparse(node)})")


def evaluate_formula(tree: ast.Expression, scores: Mapping[str, float]) -> float:
    """The formula's value for these sub-scores, as a float; FormulaError when arithmetic fails or is not finite."""
    try:
        value = float(_evaluate(tree.body, scores))
    except (ArithmeticError, ValueError, TypeError) as exc:
        raise FormulaError(f"{type(exc).__name__}: {exc}") from None
    if not math.isfinite(value):
        raise FormulaError(f"the formula's value is {value}")
    return value


def _evaluate(node: ast.expr, scores: Mapping[str, float]) -> float:
    if isinstance(node, ast.Constant):
        return float(node.value)  # floats throughout: 10 ** 10 ** 10 overflows at once instead of filling memory
    if isinstance(node, ast.Name):
        return float(scores[node.id])
    if isinstance(node, ast.BinOp):
        result = _BINARY[type(node.op)](_evaluate(node.left, scores), _evaluate(node.right, scores))
        if isinstance(result, complex):  # (-1) ** 0.5
            raise ValueError("the result is not a real number")
        return result
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_evaluate(node.operand, scores))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        function = _FUNCTIONS[node.func.id][0]
        return float(function(*(_evaluate(arg, scores) for arg in node.args)))
    raise TypeError(f"unexpected {type(node).__name__}")  # parse_formula let nothing else through
