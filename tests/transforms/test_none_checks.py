from __future__ import annotations

import builtins
import re
import warnings
from functools import partial
from textwrap import dedent
from types import SimpleNamespace
from typing import Any

import libcst as cst
import libcst.matchers as m
from conftest import T5_SOURCE
from hypothesis import given, settings
from hypothesis import strategies as st
from support import transform_helpers
from support.transform_helpers import assert_rewrites, assert_unchanged

from stateless.checks import is_None, is_not_None
from transforms.none_checks import NoneChecks

IMPORTS = "from stateless import is_None\n\n"
IMPORTS_NOT = "from stateless import is_not_None\n\n"
IMPORTS_BOTH = "from stateless import is_None, is_not_None\n\n"


rewrite = partial(transform_helpers.run_reporting, NoneChecks)


class NoneComparisons(cst.CSTVisitor):
    """Collects the comparisons that still compare identity with ``None``, and the helper calls."""

    def __init__(self) -> None:
        self.comparisons: list[cst.Comparison] = []
        self.helper_calls: list[cst.Call] = []

    def visit_Comparison(self, node: cst.Comparison) -> None:
        operands = [node.left, *(target.comparator for target in node.comparisons)]
        if any(isinstance(target.operator, (cst.Is, cst.IsNot))
               and (m.matches(left, m.Name("None")) or m.matches(target.comparator, m.Name("None")))
               for left, target in zip(operands, node.comparisons)):
            self.comparisons.append(node)

    def visit_Call(self, node: cst.Call) -> None:
        if m.matches(node.func, m.Name("is_None") | m.Name("is_not_None")):
            self.helper_calls.append(node)


def none_comparisons(code: str) -> NoneComparisons:
    found = NoneComparisons()
    cst.parse_module(code).visit(found)
    return found


def test_helpers_are_identity_checks() -> None:
    assert is_None(None) and not is_None(0) and not is_None("") and not is_None([])
    assert is_not_None(0) and is_not_None(False) and not is_not_None(None)


# --- operand kinds -----------------------------------------------------------------------------

def test_name_is_none() -> None:
    assert_rewrites(NoneChecks, "y = x is None\n", IMPORTS + "y = is_None(x)\n")


def test_name_is_not_none() -> None:
    assert_rewrites(NoneChecks, "y = x is not None\n", IMPORTS_NOT + "y = is_not_None(x)\n")


def test_call_with_several_arguments_stays_whole() -> None:
    assert_rewrites(NoneChecks, "y = foo(a, b) is None\n", IMPORTS + "y = is_None(foo(a, b))\n")


def test_subscript_of_attribute_with_arithmetic() -> None:
    assert_rewrites(NoneChecks, "y = a.b[c - 1] is None\n", IMPORTS + "y = is_None(a.b[c - 1])\n")


def test_attribute_chain() -> None:
    assert_rewrites(NoneChecks, "y = self.config.model.bias is not None\n",
                    IMPORTS_NOT + "y = is_not_None(self.config.model.bias)\n")


def test_parenthesized_operand_keeps_its_parentheses() -> None:
    assert_rewrites(NoneChecks, "y = (a or b) is None\n", IMPORTS + "y = is_None((a or b))\n")


def test_tuple_operand_stays_one_argument() -> None:
    assert_rewrites(NoneChecks, "y = (a, b) is None\n", IMPORTS + "y = is_None((a, b))\n")


def test_none_on_the_left() -> None:
    assert_rewrites(NoneChecks, "y = None is x\n", IMPORTS + "y = is_None(x)\n")
    assert_rewrites(NoneChecks, "y = None is not f(a, b)\n", IMPORTS_NOT + "y = is_not_None(f(a, b))\n")


def test_nested_checks_inside_an_operand() -> None:
    assert_rewrites(NoneChecks, "y = f(a is None) is not None\n", IMPORTS_BOTH + "y = is_not_None(f(is_None(a)))\n")


# --- contexts ----------------------------------------------------------------------------------

def test_if_elif_while() -> None:
    assert_rewrites(NoneChecks, """\
        if x is None:
            pass
        elif y is not None:
            pass
        while z is None:
            z = step()
        """, IMPORTS_BOTH + dedent("""\
        if is_None(x):
            pass
        elif is_not_None(y):
            pass
        while is_None(z):
            z = step()
        """))


def test_assert_keeps_its_message() -> None:
    assert_rewrites(NoneChecks, 'assert pad is not None, "pad must be set"\n',
                    IMPORTS_NOT + 'assert is_not_None(pad), "pad must be set"\n')


def test_ternary() -> None:
    assert_rewrites(NoneChecks, "use = use if use is not None else default\n",
                    IMPORTS_NOT + "use = use if is_not_None(use) else default\n")


def test_comprehension_element_and_filter() -> None:
    assert_rewrites(NoneChecks, "ys = [v is None for v in xs if v is not None]\n",
                    IMPORTS_BOTH + "ys = [is_None(v) for v in xs if is_not_None(v)]\n")


def test_generator_and_dict_comprehension() -> None:
    assert_rewrites(NoneChecks, "t = tuple(v for v in xs if v is not None)\nd = {k: v for k, v in kv if v is None}\n",
                    IMPORTS_BOTH + "t = tuple(v for v in xs if is_not_None(v))\nd = {k: v for k, v in kv if is_None(v)}\n")


def test_lambda_body() -> None:
    assert_rewrites(NoneChecks, "keep = lambda v: v is not None\n", IMPORTS_NOT + "keep = lambda v: is_not_None(v)\n")


def test_call_arguments_positional_and_keyword() -> None:
    assert_rewrites(NoneChecks, "f(x is None, cached=past is not None)\n",
                    IMPORTS_BOTH + "f(is_None(x), cached=is_not_None(past))\n")


def test_boolean_combinations() -> None:
    assert_rewrites(NoneChecks, "y = not a is None and (b is not None or c is None)\n",
                    IMPORTS_BOTH + "y = not is_None(a) and (is_not_None(b) or is_None(c))\n")


def test_return_value() -> None:
    assert_rewrites(NoneChecks, "def f(x):\n    return x is None\n", IMPORTS + "def f(x):\n    return is_None(x)\n")


def test_fstring_replacement_field_is_code() -> None:
    assert_rewrites(NoneChecks, 'msg = f"cached: {past is not None}"\n',
                    IMPORTS_NOT + 'msg = f"cached: {is_not_None(past)}"\n')


# --- layout ------------------------------------------------------------------------------------

def test_parenthesized_comparison_keeps_its_parentheses() -> None:
    assert_rewrites(NoneChecks, "y = (x is None)\n", IMPORTS + "y = (is_None(x))\n")


def test_surrounding_comments_and_whitespace_are_kept() -> None:
    assert_rewrites(NoneChecks, """\
        if  x is None :  # no past
            pass
        """, IMPORTS + dedent("""\
        if  is_None(x) :  # no past
            pass
        """))


def test_comments_inside_a_multiline_comparison_are_kept() -> None:
    assert_rewrites(NoneChecks, """\
        def f():
            return (x  # first
                    is  # second
                    None)
        """, IMPORTS + dedent("""\
        def f():
            return (is_None(x  # first
                    # second
                    ))
        """))


# --- chained comparisons -----------------------------------------------------------------------

def test_chain_split_at_a_name() -> None:
    assert_rewrites(NoneChecks, "y = 0 < x is not None\n", IMPORTS_NOT + "y = (0 < x and is_not_None(x))\n")


def test_chain_of_two_none_checks() -> None:
    assert_rewrites(NoneChecks, "y = a is None is b\n", IMPORTS + "y = (is_None(a) and is_None(b))\n")


def test_chain_keeps_other_comparisons_grouped() -> None:
    assert_rewrites(NoneChecks, "y = a is None < b < c is None\n",
                    IMPORTS + "y = (is_None(a) and None < b < c and is_None(c))\n")


def test_split_chain_under_not_is_parenthesized() -> None:
    assert_rewrites(NoneChecks, "y = not a is None is b\n", IMPORTS + "y = not (is_None(a) and is_None(b))\n")


def test_split_chain_reuses_existing_parentheses() -> None:
    assert_rewrites(NoneChecks, "y = (1 < x is None)\n", IMPORTS + "y = (1 < x and is_None(x))\n")


def test_chain_through_a_call_is_left_and_reported() -> None:
    code = "y = a < f(b) is None\n"
    assert_unchanged(NoneChecks, code)
    assert rewrite(code)[1] == ["line 1: `a < f(b) is None` chains a None check through an operand that splitting "
                                "would evaluate twice; left as is"]


def test_chain_without_none_check_is_untouched() -> None:
    assert_unchanged(NoneChecks, "y = a < b is c\n")


# --- no-op cases -------------------------------------------------------------------------------

def test_identity_between_names_is_untouched() -> None:
    assert_unchanged(NoneChecks, "y = x is y\nz = x is not y\n")


def test_equality_with_none_is_untouched() -> None:
    assert_unchanged(NoneChecks, "y = x == None\nz = x != None\n")


def test_strings_docstrings_and_comments_are_untouched() -> None:
    code = '''\
        """A module where x is None."""

        def f(x):
            """Return early if x is None."""
            # x is not None here
            return "x is None" + 'y is not None'
        '''
    assert_unchanged(NoneChecks, code)
    assert rewrite(code)[1] == []


def test_existing_helper_calls_are_untouched() -> None:
    assert_unchanged(NoneChecks, IMPORTS_BOTH + "y = is_None(x) or is_not_None(z)\n")


# --- True / False identity checks --------------------------------------------------------------

def test_identity_with_true_or_false_is_reported_not_rewritten() -> None:
    code = "a = 1\nif use_cache is True:\n    pass\nb = flag is not False\n"
    assert_unchanged(NoneChecks, code)
    assert rewrite(code)[1] == [
        "line 2: `use_cache is True` is an identity check against True/False, which a tracer folds into a "
        "constant; left as is",
        "line 4: `flag is not False` is an identity check against True/False, which a tracer folds into a "
        "constant; left as is",
    ]


def test_equality_with_true_is_not_reported() -> None:
    assert rewrite("y = x == True\n")[1] == []


# --- imports -----------------------------------------------------------------------------------

def test_import_added_once_after_existing_imports() -> None:
    assert_rewrites(NoneChecks, "import torch\n\na = x is None\nb = y is None\n",
                    "import torch\nfrom stateless import is_None\n\na = is_None(x)\nb = is_None(y)\n")


def test_no_import_without_none_checks() -> None:
    assert_unchanged(NoneChecks, "import torch\n\ny = x is True\n")


def test_helpers_module_option() -> None:
    # transform_helpers.run takes ``module`` for the file's own name, so call the transform directly.
    result, _ = rewrite("y = x is None\n", module="generated.runtime")
    assert result == "from generated.runtime import is_None\n\ny = is_None(x)\n"
    assert rewrite(result, module="generated.runtime")[0] == result


# --- the real T5 source ------------------------------------------------------------------------

def test_t5_has_no_none_comparison_left() -> None:
    source = T5_SOURCE.read_text()
    result, reports = rewrite(source)
    before, after = none_comparisons(source), none_comparisons(result)
    assert len(before.comparisons) > 70 and before.helper_calls == []
    assert after.comparisons == []
    assert len(after.helper_calls) == len(before.comparisons)
    compile(result, "modeling_t5.py", "exec")
    assert "from stateless import is_None, is_not_None\n" in result
    for line in ("        use_cache = use_cache if is_not_None(use_cache) else self.config.use_cache\n",
                 "        if is_not_None(input_ids) and is_not_None(inputs_embeds):\n",
                 "            assert is_None(labels), \"Decoder should not use cached key value states when training.\"\n",
                 "            return ((loss,) + output) if is_not_None(loss) else output\n",
                 "                if is_not_None(v)\n",
                 "        do_cross_attention = self.is_decoder and is_not_None(encoder_hidden_states)\n"):
        assert line in result
    # The attention docstring mentions the check in prose and keeps it.
    assert "Self-attention (if key_value_states is None) or attention" in result
    assert len(reports) == 1 and reports[0].startswith("line 888: `use_cache is True` is an identity check")


# --- property: same values, no None comparison left --------------------------------------------

ATOM, COMPARISON, NOT, AND, OR, TERNARY, LAMBDA = range(7)
Expr = tuple[str, int]  # source text, and how loosely it binds
VALUES: dict[str, object] = {"None": None, "zero": 0, "one": 1, "empty": "", "nil": [], "obj": SimpleNamespace(p=None, q=1)}
NAMESPACE = {
    "f": lambda x, y: y if x is None else x,
    "g": lambda x: None if x else x,
    "d": {"k": None, "j": 1},
    "xs": [None, 0, 1, ""],
    "ns": SimpleNamespace(p=None, q=[0, None]),
}


def wrap(expr: Expr, loosest: int) -> str:
    text, level = expr
    return text if level <= loosest else f"({text})"


def chain(first: Expr, rest: list[tuple[str, Expr]]) -> Expr:
    return " ".join([wrap(first, ATOM)] + [f"{op} {wrap(operand, ATOM)}" for op, operand in rest]), COMPARISON


def none_check(operand: Expr, operator: str, none_first: bool) -> Expr:
    return (f"None {operator} {wrap(operand, ATOM)}" if none_first else f"{wrap(operand, ATOM)} {operator} None"), COMPARISON


def compound(children: st.SearchStrategy[Expr]) -> st.SearchStrategy[Expr]:
    checks = st.builds(none_check, children, st.sampled_from(["is", "is not"]), st.booleans())
    none_or = st.one_of(st.just(("None", ATOM)), children)
    chains = st.builds(chain, none_or, st.lists(st.tuples(st.sampled_from(["is", "is not", "==", "!="]), none_or),
                                                min_size=2, max_size=3))
    # Always iterable, so that comprehensions run their element and filter expressions.
    iterables = st.one_of(st.sampled_from(["xs", "ns.q", "[a, b, c]"]).map(lambda text: (text, ATOM)),
                          st.builds(lambda x, y: (f"[{wrap(x, TERNARY)}, {wrap(y, TERNARY)}]", ATOM), children, children))
    return st.one_of(
        checks, checks, checks, chains, chains,
        st.builds(lambda x, y: (f"f({wrap(x, LAMBDA)}, {wrap(y, LAMBDA)})", ATOM), children, children),
        st.builds(lambda x: (f"g({wrap(x, LAMBDA)})", ATOM), children),
        st.builds(lambda x: (f"h({wrap(x, LAMBDA)})", ATOM), children),
        st.builds(lambda x, i: (f"{x}[1 if {wrap(i, OR)} else 0]", ATOM), st.sampled_from(["xs", "ns.q", "d"]), children),
        st.builds(lambda x: (f"not {wrap(x, NOT)}", NOT), children),
        st.builds(lambda x, y: (f"{wrap(x, AND)} and {wrap(y, NOT)}", AND), children, children),
        st.builds(lambda x, y: (f"{wrap(x, OR)} or {wrap(y, AND)}", OR), children, children),
        st.builds(lambda x, c, y: (f"{wrap(x, OR)} if {wrap(c, OR)} else {wrap(y, TERNARY)}", TERNARY),
                  children, children, children),
        st.builds(lambda e, it, c: (f"[{wrap(e, TERNARY)} for v in {wrap(it, OR)} if {wrap(c, OR)}]", ATOM),
                  children, iterables, children),
        st.builds(lambda e, it, c: (f"list({wrap(e, TERNARY)} for v in {wrap(it, OR)} if {wrap(c, OR)})", ATOM),
                  children, iterables, children),
        st.builds(lambda body, arg: (f"(lambda v: {wrap(body, LAMBDA)})({wrap(arg, LAMBDA)})", ATOM),
                  children, children),
        st.builds(lambda x: (f"({x[0]})", ATOM), children),
    )


LEAVES = st.sampled_from(["a", "b", "c", "v", "None", "0", "1", "''", "xs", "ns.p", "ns.q", "d['k']", "d['j']",
                          "xs[0]", "a.p"]).map(lambda text: (text, ATOM))
# Never a bare leaf at the top: most examples then hold a None check.
EXPRESSIONS = compound(st.recursive(LEAVES, compound, max_leaves=8))
BINDINGS = st.fixed_dictionaries({name: st.sampled_from(sorted(VALUES)) for name in "abcv"})


def outcome(code: str, bindings: dict[str, str]) -> str:
    """What running ``code`` leaves in ``RESULT`` or raises, and what it passed to ``h``, without addresses."""
    calls: list[Any] = []

    def h(x: Any) -> Any:
        calls.append(x)
        return x

    namespace = {"__builtins__": builtins, **NAMESPACE, **{name: VALUES[key] for name, key in bindings.items()},
                 "h": h}
    try:
        with warnings.catch_warnings():
            # The grammar writes ``0 is None`` and ``[][...]``, which the compiler flags.
            warnings.simplefilter("ignore", SyntaxWarning)
            exec(code, namespace)
        shown = repr(namespace["RESULT"])
    except Exception as error:  # the original may raise too: the rewrite must raise the same
        shown = f"{type(error).__name__}: {error}"
    return re.sub(r"0x[0-9a-f]+", "0x?", f"{shown}; h saw {calls!r}")


def assert_same_outcome(original: str, all_bindings: list[dict[str, str]]) -> None:
    result, reports = rewrite(original, module="stateless.checks")
    for bindings in all_bindings:
        assert outcome(result, bindings) == outcome(original, bindings), bindings
    left = none_comparisons(result).comparisons
    # Only a chain that cannot be split soundly may keep a None comparison, and each one is reported.
    assert all(len(node.comparisons) > 1 for node in left)
    assert len(left) == sum("evaluate twice" in report for report in reports)


# Rewriting costs far more than running, so each rewrite is checked under several bindings.
@settings(deadline=None, max_examples=150)
@given(EXPRESSIONS, st.lists(BINDINGS, min_size=1, max_size=8))
def test_rewrite_keeps_values(expression: Expr, all_bindings: list[dict[str, str]]) -> None:
    assert_same_outcome(f"RESULT = {expression[0]}\n", all_bindings)


CHAIN_OPERANDS = st.sampled_from(["a", "b", "None", "0", "h(a)", "h(b)"])
EVERY_A_AND_B = [{"a": a, "b": b, "c": "zero", "v": "zero"} for a in VALUES for b in VALUES]


@settings(deadline=None, max_examples=50)
@given(st.booleans(), CHAIN_OPERANDS,
       st.lists(st.tuples(st.sampled_from(["is", "is not", "==", "!="]), CHAIN_OPERANDS), min_size=1, max_size=4))
def test_chains_keep_values_and_evaluate_operands_once(negated: bool, first: str, rest: list[tuple[str, str]]) -> None:
    comparison = " ".join([first, *(f"{op} {operand}" for op, operand in rest)])
    assert_same_outcome(f"RESULT = {'not ' if negated else ''}{comparison}\n", EVERY_A_AND_B)
