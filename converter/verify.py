"""Checks of generated code: it compiles, its calls fit the functions it defines, its classes trace.

A transform that rewrites a definition and misses a call site (a parameter dropped
from a method while a caller still passes it positionally) produces code that
compiles and fails only when that call runs.  :func:`static_problem` finds both
kinds of fault cheaply, with :mod:`ast`:

- the module compiles;
- every call whose callee the module itself defines binds to the callee's
  parameters the way Python would: ``f(...)`` of a module-level function,
  ``C(...)`` of a class (its ``__init__``), ``self.m(...)`` inside a class
  (looked up along the class's bases in this file) and ``C.m(...)``.

Callees whose signature the module cannot know are skipped: methods reached
through a base defined elsewhere, decorated functions (a decorator may change
the signature), names rebound locally, instance attributes.

:mod:`converter.checks` then builds the classes and traces them with torch.fx (and, for an
unverified release, compares them with stock), in a process of its own: the converter never imports torch.
"""

from __future__ import annotations

import ast
import warnings
from dataclasses import dataclass

from converter.signatures import binding_problem, bound_names, function_kind, module_rebinds

_UNKNOWN = object()


@dataclass(frozen=True)
class Problem:
    key: str  # the kind of fault and its callee: the same fault in another version of the file has the same key
    message: str  # one line naming the file, the line, the fault and the code


def static_problem(code: str, filename: str, key: str | None = None) -> Problem | None:
    """The first fault of ``code`` (only faults with ``key``, when given), or None.

    Besides errors, the compiler's warnings about an operation that always fails
    (``None[0]``, ``None(x)``: a constant substituted where a value was expected)
    are faults.
    """
    lines = code.splitlines()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SyntaxWarning)
        try:
            compile(code, filename, "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as error:
            line = getattr(error, "lineno", None) or 0
            text = (getattr(error, "text", None) or "").strip()
            message = getattr(error, "msg", None) or str(error)
            return Problem("compile", f"{filename}:{line} does not compile ({type(error).__name__}: {message}): "
                                      f"`{text}`")
    for warning in caught:
        message = str(warning.message)
        if issubclass(warning.category, SyntaxWarning) and ("is not subscriptable" in message
                                                            or "is not callable" in message):
            line = warning.lineno or 0
            text = lines[line - 1].strip() if 0 < line <= len(lines) else ""
            return Problem("compile", f"{filename}:{line} always fails ({message}): `{text}`")
    if key == "compile":
        return None
    for problem in _CallChecker(ast.parse(code), filename, lines).problems():
        if key is None or problem.key == key:
            return problem
    return None


class _CallChecker:
    def __init__(self, module: ast.Module, filename: str, lines: list[str]) -> None:
        self.filename = filename
        self.lines = lines
        rebound = module_rebinds(module)
        self.functions = {s.name: s for s in module.body
                          if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name not in rebound}
        self.classes = {s.name: s for s in module.body if isinstance(s, ast.ClassDef) and s.name not in rebound}
        self.module = module
        self.found: list[Problem] = []

    def problems(self) -> list[Problem]:
        self._scan(self.module.body, None, None, set())
        return self.found

    def _scan(self, statements: list[ast.stmt], owner: ast.ClassDef | None, receiver: str | None,
              local: set[str]) -> None:
        """Check the calls in ``statements``; ``owner``/``receiver``: the class and instance name of a method."""
        pending: list[ast.AST] = list(statements)
        while pending:
            node = pending.pop()
            if isinstance(node, ast.ClassDef):
                pending.extend(node.decorator_list + node.bases)
                for statement in node.body:
                    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        self._function(statement, node, local)
                    else:
                        pending.append(statement)
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                self._function(node, None, local, receiver if owner is not None else None, owner)
                continue
            if isinstance(node, ast.Call):
                self._check(node, owner, receiver, local)
            pending.extend(ast.iter_child_nodes(node))

    def _function(self, function: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, cls: ast.ClassDef | None,
                  outer: set[str], receiver: str | None = None, owner: ast.ClassDef | None = None) -> None:
        """A method of ``cls`` (its receiver is its first parameter), or a nested function seeing ``owner``."""
        if not isinstance(function, ast.Lambda):
            for node in [*function.decorator_list, *(d for d in function.args.defaults), *function.args.kw_defaults]:
                if node is not None:
                    self._scan([ast.Expr(node)], owner, receiver, outer)
        local = outer | bound_names(function)
        if cls is not None:
            owner = cls
            receiver = None
            kind = function_kind(function) if not isinstance(function, ast.Lambda) else None
            parameters = [*function.args.posonlyargs, *function.args.args]
            if kind == "plain" and parameters:
                receiver = parameters[0].arg
        elif receiver is not None and receiver in bound_names(function):
            receiver = None  # a nested function rebinding the receiver's name
        body: list[ast.stmt] = function.body if isinstance(function.body, list) else [ast.Expr(function.body)]
        self._scan(body, owner, receiver, local)

    def _check(self, call: ast.Call, owner: ast.ClassDef | None, receiver: str | None, local: set[str]) -> None:
        func = call.func
        target: tuple[str, ast.FunctionDef | ast.AsyncFunctionDef, bool] | None = None
        if isinstance(func, ast.Name) and func.id not in local:
            if func.id in self.functions:
                function = self.functions[func.id]
                if function_kind(function) == "plain":
                    target = (func.id, function, False)
            elif func.id in self.classes:
                init = self._lookup(self.classes[func.id], "__init__")
                if isinstance(init, (ast.FunctionDef, ast.AsyncFunctionDef)) and function_kind(init) == "plain":
                    target = (f"{func.id}.__init__", init, True)
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            name = func.value.id
            if owner is not None and name == receiver:
                method = self._lookup(owner, func.attr)
                if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                        and not self._is_instance_attribute(owner, func.attr):
                    kind = function_kind(method)
                    if kind is not None:
                        target = (f"{owner.name}.{func.attr}", method, kind != "static")
            elif name in self.classes and name not in local:
                method = self._lookup(self.classes[name], func.attr)
                if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    kind = function_kind(method)
                    if kind is not None:
                        target = (f"{name}.{func.attr}", method, kind == "class")
        if target is None:
            return
        callee, function, drop_first = target
        problem = binding_problem(call, function, drop_first)
        if problem is not None:
            text = self.lines[call.lineno - 1].strip() if 0 < call.lineno <= len(self.lines) else ""
            self.found.append(Problem(f"call {callee}", f"{self.filename}:{call.lineno}: the call of {callee} (defined "
                                                        f"at line {function.lineno}) does not fit its signature: "
                                                        f"{problem}: `{text}`"))

    def _lookup(self, cls: ast.ClassDef, name: str, seen: frozenset[str] = frozenset()) -> object:
        """The function ``name`` resolves to on ``cls``: a def, None (not there) or _UNKNOWN (a base defined elsewhere)."""
        if cls.name in seen:
            return _UNKNOWN
        for statement in cls.body:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)) and statement.name == name:
                return statement
            if isinstance(statement, (ast.Assign, ast.AnnAssign)):
                targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    return _UNKNOWN
        for base in cls.bases:
            if not (isinstance(base, ast.Name) and base.id in self.classes):
                return _UNKNOWN
            found = self._lookup(self.classes[base.id], name, seen | {cls.name})
            if found is not None:
                return found
        return None

    def _is_instance_attribute(self, cls: ast.ClassDef, name: str) -> bool:
        """Whether some method of ``cls`` (or of its in-file bases) assigns ``<receiver>.name``."""
        classes, seen = [cls], set()
        while classes:
            current = classes.pop()
            if current.name in seen:
                continue
            seen.add(current.name)
            for node in ast.walk(current):
                if isinstance(node, ast.Attribute) and node.attr == name and isinstance(node.ctx, ast.Store):
                    return True
            classes += [self.classes[b.id] for b in current.bases if isinstance(b, ast.Name) and b.id in self.classes]
        return False
