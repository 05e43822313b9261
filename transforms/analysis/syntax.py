"""Small questions about syntax every transform asks: a node's code, dotted names, statement kinds."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import TypeVar

import libcst as cst

_EMPTY = cst.Module(body=[])
_Item = TypeVar("_Item", cst.Arg, cst.Param, cst.ImportAlias)


_FIELDS: dict[type, tuple[str, ...]] = {}
# isinstance against libcst's abstract base classes is slow; the walk asks once per type.
_IS_NODE: dict[type, bool] = {tuple: False, list: False, type(None): False}


def field_names(node: cst.CSTNode) -> tuple[str, ...]:
    """The names of a node's fields that may hold child nodes (parentheses left out)."""
    kind = type(node)
    if kind not in _FIELDS:
        _FIELDS[kind] = tuple(f.name for f in dataclasses.fields(node) if f.name not in ("lpar", "rpar"))
    return _FIELDS[kind]


def is_node(value: object) -> bool:
    kind = type(value)
    flag = _IS_NODE.get(kind)
    if flag is None:
        flag = _IS_NODE[kind] = isinstance(value, cst.CSTNode)
    return flag


def children(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """The node's children in field order (source order, except a def's decorators come last)."""
    for name in field_names(node):
        value = getattr(node, name)
        if is_node(value):
            yield value
        elif type(value) is tuple or type(value) is list:
            yield from (item for item in value if is_node(item))


# Node kinds that only format code: two trees differing in them mean the same.
_FORMATTING = (cst.BaseParenthesizableWhitespace, cst.Comma, cst.AssignEqual, cst.Colon, cst.Dot)


def same_code(a: cst.CSTNode, b: cst.CSTNode) -> bool:
    """Whether two trees are the same code up to formatting (whitespace, line breaks, parentheses, commas).

    ``deep_equals`` also compares the formatting: a recipe's one-line expression
    would not match the same call broken over three lines in the source.
    """
    if type(a) is not type(b):
        return False
    for name in field_names(a):
        left, right = getattr(a, name), getattr(b, name)
        if is_node(left):
            if isinstance(left, _FORMATTING) or name.startswith("whitespace"):
                continue
            if not is_node(right) or not same_code(left, right):
                return False
        elif type(left) is tuple or type(left) is list:
            if type(right) is not tuple and type(right) is not list:
                return False
            kept = [item for item in left if not isinstance(item, _FORMATTING)]
            other = [item for item in right if not isinstance(item, _FORMATTING)]
            if len(kept) != len(other) or not all(same_code(x, y) for x, y in zip(kept, other)):
                return False
        elif left != right and not (isinstance(left, cst.MaybeSentinel) or isinstance(right, cst.MaybeSentinel)):
            return False
    return True


def descendants(node: cst.CSTNode) -> list[cst.CSTNode]:
    """``node`` and every node under it (in no particular order)."""
    found, pending = [], [node]
    while pending:
        current = pending.pop()
        found.append(current)
        pending.extend(children(current))
    return found


def code_of(node: cst.CSTNode) -> str:
    """The source text of ``node`` (default formatting of a module with no header)."""
    return _EMPTY.code_for_node(node)


def dotted_name(node: cst.CSTNode) -> str | None:
    """``"a.b.c"`` for a plain chain of names and attributes, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        head = dotted_name(node.value)
        return None if head is None else f"{head}.{node.attr.value}"
    return None


def root_name(node: cst.CSTNode, through_calls: bool = False) -> str | None:
    """The name an attribute chain starts from (``a`` of ``a.b.c``).

    With ``through_calls`` the chain may also pass through calls and
    subscripts (``a`` of ``a.b(x)[0].c``).
    """
    while True:
        if isinstance(node, cst.Attribute) or (through_calls and isinstance(node, cst.Subscript)):
            node = node.value
        elif through_calls and isinstance(node, cst.Call):
            node = node.func
        else:
            break
    return node.value if isinstance(node, cst.Name) else None


def is_docstring(statement: cst.CSTNode) -> bool:
    """A line holding only a string literal: a docstring when it opens a module, class or function."""
    return (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
            and isinstance(statement.body[0], cst.Expr)
            and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))


def is_import_line(statement: cst.CSTNode) -> bool:
    """A line made only of ``import``/``from ... import`` statements."""
    return (isinstance(statement, cst.SimpleStatementLine) and bool(statement.body)
            and all(isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body))


def all_params(params: cst.Parameters, starred: bool = False) -> list[cst.Param]:
    """The named parameters in order; with ``starred``, ``*args`` and ``**kwargs`` too."""
    found = [*params.posonly_params, *params.params, *params.kwonly_params]
    if starred:
        found += [p for p in (params.star_arg, params.star_kwarg) if isinstance(p, cst.Param)]
    return found


def drop_items(items: Sequence[_Item], keep: Sequence[bool]) -> list[_Item]:
    """Remove items from a comma-separated list, keeping the original trailing-comma style."""
    kept = [item for item, flag in zip(items, keep) if flag]
    if kept and not keep[-1]:
        # The new last item takes the old last one's comma, and with it the
        # whitespace before the closing parenthesis.
        kept[-1] = kept[-1].with_changes(comma=items[-1].comma)
    return kept


def append_item(items: Sequence[_Item], new: _Item) -> list[_Item]:
    """Add an item at the end of a comma-separated list, keeping its layout (one item a line stays so)."""
    if not items:
        return [new]
    last = items[-1]
    # The new item takes the old last one's comma (and the whitespace before the closing parenthesis);
    # the old last one takes its predecessor's, which leads to the next item.
    separator = items[-2].comma if len(items) > 1 else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    if not isinstance(separator, cst.Comma):
        separator = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    result = list(items[:-1])
    result += [last.with_changes(comma=separator), new.with_changes(comma=last.comma)]
    return result


def indented(statements: Sequence[cst.BaseStatement], block: cst.BaseSuite) -> cst.BaseSuite:
    """``block`` holding ``statements`` (``pass`` when there are none)."""
    body = list(statements) or [cst.SimpleStatementLine([cst.Pass()])]
    if isinstance(block, cst.IndentedBlock):
        return block.with_changes(body=body)
    return cst.IndentedBlock(body=body)


def without_semicolon_at_end(statement: cst.SimpleStatementLine,
                             kept: list[cst.BaseSmallStatement]) -> cst.SimpleStatementLine:
    """``statement`` holding only ``kept`` (non-empty), the last one without a trailing semicolon."""
    kept[-1] = kept[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
    return statement.with_changes(body=kept)
