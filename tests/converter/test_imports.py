"""converter/imports.py: scheduled import removals decided from the module index give libcst's own result.

Each case is a module and the removals scheduled on it; the expected code is what libcst's
``RemoveImportsVisitor`` (scope metadata) writes, checked against the inline text, and the
fast path must either write the same or hand the case to libcst.
"""

from __future__ import annotations

import libcst as cst
import pytest
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import RemoveImportsVisitor

from converter.imports import _decide, remove_imports

SCHEDULED = [("torch.nn", "CrossEntropyLoss", None), ("typing", "Optional", None), ("os", None, None)]

CASES = {
    # name: (before, after, decided without libcst's metadata)
    "unused names go, used ones stay": (
        "import os\nfrom torch.nn import CrossEntropyLoss, MSELoss\nfrom typing import Optional\n\n"
        "def f(x):\n    return MSELoss()(x)\n",
        "from torch.nn import MSELoss\n\n"
        "def f(x):\n    return MSELoss()(x)\n",
        True),
    "a read in a function keeps it": (
        "import os\nfrom torch.nn import CrossEntropyLoss\n\ndef f(x):\n    return CrossEntropyLoss()(x), os.sep\n",
        "import os\nfrom torch.nn import CrossEntropyLoss\n\ndef f(x):\n    return CrossEntropyLoss()(x), os.sep\n",
        True),
    "a module-level read after the import keeps it": (
        "from typing import Optional\nX = Optional[int]\n",
        "from typing import Optional\nX = Optional[int]\n",
        True),
    "a docstring naming it does not keep it": (
        'from typing import Optional\nDOC = """Optional arguments"""\n\ndef f():\n    """Optional."""\n',
        'DOC = """Optional arguments"""\n\ndef f():\n    """Optional."""\n',
        True),
    "a string annotation keeps it (libcst decides)": (
        'from typing import Optional\n\ndef f(x: "Optional[int]"):\n    return x\n',
        'from typing import Optional\n\ndef f(x: "Optional[int]"):\n    return x\n',
        False),
    "__all__ keeps it (libcst decides)": (
        'from typing import Optional\n__all__ = ["Optional"]\n',
        'from typing import Optional\n__all__ = ["Optional"]\n',
        False),
    "a read shadowed by a local does not count (libcst decides)": (
        "from typing import Optional\n\ndef f(Optional):\n    return Optional\n",
        "\ndef f(Optional):\n    return Optional\n",
        False),
    "a read before the import does not count (libcst decides)": (
        "X = Optional\nfrom typing import Optional\n",
        "X = Optional\n",
        False),
    "an import inside a function (libcst decides)": (
        "def f():\n    import os\n    return 1\n",
        "def f():\n    return 1\n",
        False),
}


def _context() -> CodemodContext:
    context = CodemodContext(full_module_name="pkg.mod", full_package_name="pkg")
    for module, obj, alias in SCHEDULED:
        RemoveImportsVisitor.remove_unused_import(context, module, obj, alias)
    return context


@pytest.mark.parametrize("name", CASES)
def test_the_same_removals_as_libcst(name: str) -> None:
    before, after, fast = CASES[name]
    tree = cst.parse_module(before)
    assert RemoveImportsVisitor(_context()).transform_module(tree).code == after  # the reference
    assert (_decide(tree, _context()) is not None) == fast
    assert remove_imports(tree, _context()).code == after


def test_no_op_and_idempotence() -> None:
    before, after, _ = CASES["unused names go, used ones stay"]
    once = remove_imports(cst.parse_module(before), _context())
    assert remove_imports(once, _context()).code == after
    untouched = "from torch.nn import MSELoss\nMSELoss()\n"
    assert remove_imports(cst.parse_module(untouched), _context()).code == untouched
