"""What a def accepts, read with :mod:`ast`: its kind, the names it binds, whether a call fits its parameters.

:mod:`converter.verify` checks each call of a function the generated module
defines against it; these are the rules it applies, as Python binds arguments.
"""

from __future__ import annotations

import ast

_SIGNATURE_KEEPING = frozenset({"staticmethod", "classmethod"})


def _decorator_name(node: ast.expr) -> str:
    while isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def module_rebinds(module: ast.Module) -> set[str]:
    """Names module-level code assigns (outside defs and classes): such a name may not be its def."""
    names: set[str] = set()
    pending: list[ast.AST] = [s for s in module.body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                            ast.ClassDef))]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            pending.extend(ast.iter_child_nodes(node))
    return names


def function_kind(function: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """"static", "class" or "plain"; None when a decorator may change the signature."""
    names = [_decorator_name(d) for d in function.decorator_list]
    if any(name not in _SIGNATURE_KEEPING for name in names):
        return None
    if "staticmethod" in names:
        return "static"
    return "class" if "classmethod" in names else "plain"


def bound_names(function: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> set[str]:
    """Names a function binds locally (parameters, assignments, nested defs, imports)."""
    arguments = function.args
    names = {a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]}
    names |= {a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None}
    body = function.body if isinstance(function.body, list) else [function.body]
    for statement in body:
        for node in ast.walk(statement):
            if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                names.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return names


def binding_problem(call: ast.Call, function: ast.FunctionDef | ast.AsyncFunctionDef, drop_first: bool) -> str | None:
    """Why ``call`` cannot bind to ``function``'s parameters (the first dropped for a bound method), or None."""
    arguments = function.args
    positional = [a.arg for a in [*arguments.posonlyargs, *arguments.args]]
    defaults = len(arguments.defaults)
    required = positional[:len(positional) - defaults]
    posonly = {a.arg for a in arguments.posonlyargs}
    if drop_first:
        if not positional:
            return "it takes no positional argument to bind the instance to"
        positional, required = positional[1:], required[1:]
    kwonly = [a.arg for a in arguments.kwonlyargs]
    kwonly_required = [a.arg for a, default in zip(arguments.kwonlyargs, arguments.kw_defaults) if default is None]
    starred = any(isinstance(arg, ast.Starred) for arg in call.args)
    splatted = any(keyword.arg is None for keyword in call.keywords)
    given = sum(not isinstance(arg, ast.Starred) for arg in call.args)
    if given > len(positional) and arguments.vararg is None:
        return f"it takes {len(positional)} positional arguments but {given} were given"
    filled = set(positional[:given])
    for keyword in call.keywords:
        name = keyword.arg
        if name is None:
            continue
        if name in posonly:
            return f"{name!r} is positional-only"
        if name in positional or name in kwonly:
            if name in filled:
                return f"it got multiple values for argument {name!r}"
            filled.add(name)
        elif arguments.kwarg is None:
            return f"it got an unexpected keyword argument {name!r}"
    if not splatted:
        missing = [name for name in ([] if starred else required) + kwonly_required if name not in filled]
        if missing:
            return f"it is missing the required argument {missing[0]!r}"
    return None
