"""converter.verify: generated code must compile and its calls must fit the callees it defines."""

from __future__ import annotations

import textwrap

import pytest

from converter.verify import static_problem


def problem(code: str) -> str | None:
    found = static_problem(textwrap.dedent(code), "m.py")
    return None if found is None else found.message


def test_a_syntax_error_names_the_line_and_code() -> None:
    message = problem("x = 1\npast = 0.clone() if x else 0\n")
    assert message is not None and message.startswith("m.py:2 does not compile (SyntaxError")
    assert message.endswith("`past = 0.clone() if x else 0`")


@pytest.mark.parametrize("code", ["y = None[0]\n", "y = None(1)\n"])
def test_an_operation_that_always_fails_is_a_fault(code: str) -> None:
    message = problem(code)
    assert message is not None and "always fails" in message


def test_a_method_called_with_a_dropped_positional_argument() -> None:
    """The 4.57 fault: a parameter removed from a definition, a call still passing it."""
    message = problem("""
        class Stack:
            def _update_causal_mask(self, attention_mask, input_tensor):
                return attention_mask

            def forward(self, mask, x, output_attentions):
                return self._update_causal_mask(mask, x, output_attentions)
    """)
    assert message is not None
    assert "m.py:7: the call of Stack._update_causal_mask (defined at line 3)" in message
    assert "takes 2 positional arguments but 3 were given" in message


@pytest.mark.parametrize("call, why", [
    ("f(1)", "missing the required argument 'b'"),
    ("f(1, 2, c=3)", "unexpected keyword argument 'c'"),
    ("f(1, a=2)", "multiple values for argument 'a'"),
    ("C(1, 2)", "takes 1 positional arguments but 2 were given"),
    ("C.build(1, 2)", "takes 1 positional arguments but 2 were given"),
    ("C.mask(1)", "missing the required argument 'y'"),
])
def test_calls_that_do_not_bind(call: str, why: str) -> None:
    message = problem(f"""
        def f(a, b):
            return a

        class C:
            def __init__(self, x):
                self.x = x

            @classmethod
            def build(cls, x):
                return cls(x)

            @staticmethod
            def mask(x, y):
                return x

        z = {call}
    """)
    assert message is not None and why in message, message


@pytest.mark.parametrize("call", ["f(1, 2)", "f(*args)", "f(**kwargs)", "C(1)", "C.build(1)", "C.mask(1, y=2)",
                                  "g(1, 2, 3, k=4)", "unknown(1, 2, 3)"])
def test_calls_that_bind_or_cannot_be_known(call: str) -> None:
    assert problem(f"""
        def f(a, b):
            return a

        def g(*args, **kwargs):
            return args

        class C:
            def __init__(self, x):
                self.x = x

            @classmethod
            def build(cls, x):
                return cls(x)

            @staticmethod
            def mask(x, y):
                return x

        args, kwargs = (), {{}}
        z = {call}
    """) is None


def test_methods_resolve_along_bases_in_the_file() -> None:
    code = """
        class Base:
            def helper(self, a):
                return a

        class Child(Base):
            def forward(self, x):
                return self.helper(x, x)
    """
    message = problem(code)
    assert message is not None and "Child.helper (defined at line 3)" in message


def test_callees_the_file_cannot_know_are_skipped() -> None:
    assert problem("""
        import functools
        from elsewhere import Base

        class Child(Base):
            def forward(self, x):
                return self.helper(x, x, x)        # a base defined elsewhere

        class Layer:
            def __init__(self, fn):
                self.fn = fn                       # an instance attribute shadows the method

            def fn(self):
                return 0

            @functools.lru_cache
            def cached(self):
                return 1

            def forward(self, x):
                return self.fn(x, x) + self.cached(x)   # decorated: the signature may change

        def f(a):
            return a

        def user(f):
            return f(1, 2)                          # a local name, not the module's f
    """) is None


def test_a_name_rebound_at_module_level_is_not_its_def() -> None:
    assert problem("""
        def f(a):
            return a

        f = lambda *args: args
        z = f(1, 2, 3)
    """) is None
