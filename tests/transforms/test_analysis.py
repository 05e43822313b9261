"""Unit tests of the analyses under transforms/analysis, each through its public interface."""

from __future__ import annotations

from textwrap import dedent

import libcst as cst
import pytest

from common.schema import OptionError
from transforms.analysis.facts import Fact, rewrite_facts
from transforms.analysis.folding import ExpressionFolder, Known, simplify_condition
from transforms.analysis.literals import NO_VALUE, is_constant, is_literal, literal_value, truth
from transforms.analysis.liveness import Liveness
from transforms.analysis.names import bound_names, module_imports, name_targets, names_read
from transforms.analysis.propagation import FunctionFolder, Unsupported
from transforms.analysis.purity import is_pure
from transforms.analysis.syntax import code_of, dotted_name, is_docstring, is_import_line, root_name
from transforms.library.specialize_options import FactOptions

E = cst.parse_expression


def body(code: str) -> list[cst.BaseStatement]:
    return list(cst.parse_module(dedent(code)).body)


def code(statements: list[cst.BaseStatement]) -> str:
    lines = [s for s in statements if isinstance(s, (cst.SimpleStatementLine, cst.BaseCompoundStatement))]
    assert len(lines) == len(statements)  # a statement is one of these two kinds
    return cst.Module(body=lines).code


# --- syntax ----------------------------------------------------------------------------------------------

def test_dotted_and_root_names() -> None:
    assert dotted_name(E("torch.nn.functional")) == "torch.nn.functional"
    assert dotted_name(E("a().b")) is None
    assert root_name(E("a.b.c")) == "a"
    assert root_name(E("a.b(x)[0].c")) is None
    assert root_name(E("a.b(x)[0].c"), through_calls=True) == "a"


def test_statement_kinds() -> None:
    doc, imports, mixed, call = body('"""doc"""\nimport a; from b import c\nimport a; x = 1\nf()\n')
    assert is_docstring(doc) and not is_docstring(call)
    assert is_docstring(body('"a" "b"\n')[0])
    assert is_import_line(imports) and not is_import_line(mixed) and not is_import_line(doc)
    assert code_of(E("a  +  b")) == "a  +  b"


# --- literals --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "value"), [("None", None), ("False", False), ("-3", -3), ("'x'", "x"),
                                            ("1.5", 1.5), ("x", NO_VALUE), ("f()", NO_VALUE), ("(1, 2)", NO_VALUE)])
def test_literal_values(text: str, value: object) -> None:
    assert literal_value(E(text)) == value if value is not NO_VALUE else literal_value(E(text)) is NO_VALUE
    assert is_constant(E(text)) == (value is not NO_VALUE)


def test_literals_include_containers_of_literals() -> None:
    assert is_literal(E("(1, 'a', [None])")) and is_literal(E("'a' 'b'"))
    assert not is_literal(E("(1, x)"))
    assert truth(E("0")) is False and truth(E("'x'")) is True and truth(E("x")) is None


# --- names -----------------------------------------------------------------------------------------------

def test_names_read_skips_attributes_keywords_and_plain_targets() -> None:
    assert names_read(E("f(a.b, key=c)")) == {"f", "a", "c"}
    assert names_read(body("x[i] = y\n")[0]) == {"x", "i", "y"}
    assert names_read(body("x = None\n")[0]) == set()


def test_bound_names_stop_at_nested_scopes() -> None:
    statement = body("""\
        for i, (j, *k) in x:
            with a as b:
                import os.path
                def f(q): z = 1
                w = [v for v in y]
        """)[0]
    assert bound_names(statement) == {"i", "j", "k", "b", "os", "f", "w"}


def test_name_targets_only_for_plain_names() -> None:
    assert name_targets([E("(a, [b, c])")]) == {"a", "b", "c"}
    assert name_targets([E("a.b")]) is None


def test_module_imports_table() -> None:
    module = cst.parse_module("import torch.nn\nimport numpy as np\nfrom torch import nn as n, Tensor\n"
                              "from .x import y\ndef f():\n    import os\n")
    assert module_imports(module) == {"torch": ("torch", None), "n": ("torch", "nn"), "Tensor": ("torch", "Tensor")}


# --- purity ----------------------------------------------------------------------------------------------

def test_purity() -> None:
    assert is_pure(E("(a + b)[0].c if len(x) else -y"))
    assert not is_pure(E("f(x)")) and not is_pure(E("(y := 1)"))
    assert is_pure(E("self.get_head_mask(m)"), frozenset({"get_head_mask"}))


# --- expression folding ----------------------------------------------------------------------------------

def fold(text: str, **env: str) -> str:
    known = {name: Known(E(value), False) for name, value in env.items()}
    folded = E(text).visit(ExpressionFolder(known))
    assert isinstance(folded, cst.BaseExpression)  # folding replaces an expression by an expression
    return code_of(folded)


@pytest.mark.parametrize(("text", "folded"), [
    ("x if m is not None else y", "y"),
    ("not m and z", "z"),
    ("(m or z).a", "(z).a"),
    ("m == None", "True"),
    ("lambda m: m", "lambda m: m"),
    ("[m for m in xs]", "[m for m in xs]"),
    ("f(m=m)", "f(m=None)"),
    ("a.m", "a.m"),
])
def test_expression_folding(text: str, folded: str) -> None:
    assert fold(text, m="None") == folded


def test_entry_values_read_unsubstituted_are_observed() -> None:
    folder = ExpressionFolder({"m": Known(None, True)})
    E("m + 1").visit(folder)
    assert folder.observed == {"m"}


def test_conditions_fold_by_truth_only_when_dropping_is_pure() -> None:
    assert code_of(simplify_condition(E("x.y and False"))) == "False"
    assert code_of(simplify_condition(E("f() and False"))) == "f() and False"
    assert code_of(simplify_condition(E("not (True or f())"))) == "False"


# --- flow-sensitive propagation --------------------------------------------------------------------------

def propagate(source: str, **constants: str) -> tuple[str, set[str]]:
    folder = FunctionFolder(frozenset())
    env = {name: Known(E(value), True) for name, value in constants.items()}
    statements, _, _ = folder.block(body(source), env)
    return code(statements), folder.observed


def test_dead_branches_and_code_after_return_disappear() -> None:
    assert propagate("""\
        if c is None:
            return 1
        else:
            y = 2
        z = 3
        """, c="None") == ("return 1\n", set())


def test_reassignment_ends_the_constant_and_merges_are_conservative() -> None:
    folded, observed = propagate("""\
        if flag:
            c = f()
        if c is None:
            g()
        """, c="None")
    assert folded == "if flag:\n    c = f()\nif c is None:\n    g()\n"
    assert observed == {"c"}  # the entry value reaches the test when flag is false


def test_loops_forget_what_they_rebind() -> None:
    folded, _ = propagate("""\
        for i in xs:
            if c is None:
                c = i
        """, c="None")
    assert "if c is None" in folded


def test_global_declarations_are_unsupported() -> None:
    with pytest.raises(Unsupported):
        propagate("global c\n", c="None")


# --- liveness --------------------------------------------------------------------------------------------

def test_live_names_are_a_fixpoint_through_assignments() -> None:
    statements = body("a = 1\nb = a\nc = b\nreturn c\nunused = b\n")
    assert Liveness(frozenset()).live(statements) == {"a", "b", "c"}


def test_remove_dead_only_drops_pure_assignments_to_candidates() -> None:
    statements = body("a = 1\nb = a + 1\nc = f(a)\nd = 2\nreturn 0\n")
    swept = Liveness(frozenset()).remove_dead(statements, {"a", "b", "c"})
    assert code(swept) == "a = 1\nc = f(a)\nd = 2\nreturn 0\n"


def test_remove_dead_empties_branches_with_pure_tests() -> None:
    statements = body("if x:\n    a = 1\nelse:\n    a = 2\nreturn 0\n")
    assert code(Liveness(frozenset()).remove_dead(statements, {"a"})) == "return 0\n"


# --- facts -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("expression", "value", "guard"), [
    ("m.dim()", "2", "torch._assert(m.dim() == 2, 'why')"),
    ("a < b", "False", "torch._assert(a >= b, 'why')"),
    ("a.any()", "False", "torch._assert(torch.sym_not(a.any()), 'why')"),
    ("a.any()", "True", "torch._assert(a.any(), 'why')"),
])
def test_fact_guards(expression: str, value: str, guard: str) -> None:
    assert code_of(Fact(E(expression), E(value), "why").guard()).strip() == guard


def test_a_fact_may_give_its_own_check() -> None:
    fact = Fact(E("self.model_parallel"), E("False"), "why", E("not self.model_parallel"))
    assert code_of(fact.guard()).strip() == "torch._assert(not self.model_parallel, 'why')"


def test_a_tensor_check_is_asserted_on_the_device_and_never_rewritten_again() -> None:
    fact = Fact(E("len(torch.unique(c)) > 1"), E("False"), "why", E("torch.all(c == c[0])"), on_device=True)
    assert code_of(fact.guard()).strip() == "torch._assert_async(torch.all(c == c[0]), 'why')"
    function = cst.parse_module("def f(c):\n    if len(torch.unique(c)) > 1:\n        raise ValueError\n").body[0]
    assert isinstance(function, cst.FunctionDef) and isinstance(function.body, cst.IndentedBlock)
    once, _ = rewrite_facts([fact], function.body)
    twice, used = rewrite_facts([fact], once)
    assert code_of(twice) == code_of(once) and not used
    assert "torch._assert_async(torch.all(c == c[0]), 'why')" in code_of(once) and "False" in code_of(once)


def test_an_option_asks_for_a_device_check_only_with_a_check_of_its_own() -> None:
    with pytest.raises(OptionError, match="on_device"):
        FactOptions("x.any()", "False", on_device=True)
    assert FactOptions("x.any()", "False", check="~x.any()", on_device=True).fact().on_device


def test_facts_are_replaced_and_guarded_once_on_unrebound_names() -> None:
    function = cst.parse_module(dedent("""\
        def f(m):
            if m.dim() == 3:
                x = 1
            y = m.dim()
        """)).body[0]
    assert isinstance(function, cst.FunctionDef) and isinstance(function.body, cst.IndentedBlock)
    rewritten, used = rewrite_facts([Fact(E("m.dim()"), E("2"), "2-D")], function.body)
    assert used
    assert code_of(function.with_changes(body=rewritten)) == dedent("""\
        def f(m):
            torch._assert(m.dim() == 2, '2-D')
            if 2 == 3:
                x = 1
            y = 2
        """)
    unrelated, used = rewrite_facts([Fact(E("k.dim()"), E("2"), "2-D")], function.body)
    assert unrelated is function.body and not used


def test_a_fact_value_must_be_a_constant() -> None:
    with pytest.raises(ValueError, match="not a literal constant"):
        Fact(E("m.dim()"), E("n"), "why")


def test_an_assignment_to_a_fact_expression_is_left_alone() -> None:
    function = cst.parse_module(dedent("""\
        def parallelize(self):
            self.model_parallel = True
            self.model_parallel += 0
        """)).body[0]
    assert isinstance(function, cst.FunctionDef) and isinstance(function.body, cst.IndentedBlock)
    fact = Fact(E("self.model_parallel"), E("False"), "why", E("not self.model_parallel"))
    rewritten, used = rewrite_facts([fact], function.body)
    assert not used and rewritten.deep_equals(function.body)


@pytest.mark.parametrize(("left", "right", "same"), [
    ("f(a, b)", "f(\n    a,\n    b,\n)", True),
    ("(a + b) * c", "(a+b)*c", True),
    ("f(x=1)[1:2]", "f(x = 1)[1 : 2]", True),
    ("f(a, b)", "f(a, c)", False),
    ("a + b * c", "(a + b) * c", False),
    ('"x y"', '"xy"', False),
    ("f(a)", "f(a=a)", False),
    ("x[1:2]", "x[1:3]", False),
])
def test_same_code_ignores_formatting_only(left: str, right: str, same: bool) -> None:
    from transforms.analysis.syntax import same_code
    assert same_code(cst.parse_expression(left), cst.parse_expression(right)) is same


def test_the_outermost_fact_wins_and_an_inner_one_is_not_used() -> None:
    inner = Fact(cst.parse_expression("self.config.kind"), cst.parse_expression('"eager"'), "r", guarded=False)
    outer = Fact(cst.parse_expression("REGISTRY.get(self.config.kind, f)"), cst.parse_expression("f"), "r",
                 guarded=False)
    function = cst.parse_module("def g(self):\n    a = REGISTRY.get(\n        self.config.kind, f\n    )\n"
                                "    return a\n").body[0]
    body = cst.ensure_type(cst.ensure_type(function, cst.FunctionDef).body, cst.IndentedBlock)
    rewritten, used = rewrite_facts([inner, outer], body)
    assert used == [outer]
    assert code_of(rewritten.body[0]).strip() == "a = f"
