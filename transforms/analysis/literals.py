"""Literal predicates: which expressions are constants, and their Python values.

A *constant* is a literal atom a recipe can name: ``None``, ``True``, ``False``,
numbers (with a sign) and plain strings.  A *literal* also allows tuples and
lists of literals and implicitly concatenated strings: a value that is the
same wherever and whenever it is evaluated.
"""

from __future__ import annotations

import ast

import libcst as cst

from transforms.analysis.syntax import code_of

NO_VALUE = object()
"""What :func:`literal_value` returns for an expression that is not a constant."""

_ATOMS = (cst.Name, cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString, cst.UnaryOperation)


def literal_value(node: cst.CSTNode) -> object:
    """The Python value of a constant, or ``NO_VALUE``."""
    if isinstance(node, _ATOMS):
        try:
            return ast.literal_eval(code_of(node).strip())
        except (ValueError, SyntaxError):
            return NO_VALUE
    return NO_VALUE


def is_constant(node: cst.CSTNode) -> bool:
    return literal_value(node) is not NO_VALUE


def is_literal(node: cst.CSTNode) -> bool:
    """A constant, or a tuple, list or concatenation made only of literals."""
    if isinstance(node, (cst.Tuple, cst.List)):
        return all(isinstance(e, cst.Element) and is_literal(e.value) for e in node.elements)
    if isinstance(node, cst.ConcatenatedString):
        return is_literal(node.left) and is_literal(node.right)
    return is_constant(node)


def is_bool(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Name) and node.value in ("True", "False")


def constant(value: object) -> cst.BaseExpression:
    """The expression spelling ``value`` (a constant's value)."""
    return cst.parse_expression(repr(value))


def truth(node: cst.CSTNode) -> bool | None:
    """The truth of a constant, None for anything else."""
    value = literal_value(node)
    return None if value is NO_VALUE else bool(value)
