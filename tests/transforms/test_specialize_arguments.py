from __future__ import annotations

from textwrap import dedent
from typing import Any

import pytest
from support.transform_helpers import assert_rewrites, assert_unchanged, run

from transforms.specialize_arguments import SpecializeArguments

OPTIONS: dict[str, Any] = {"constants": {"head_mask": "None", "use_cache": "False", "return_dict": "False",
                         "output_attentions": "False"}}


def rewrites(before: str, after: str, **options) -> None:
    assert_rewrites(SpecializeArguments, before, after, **(options or OPTIONS))


def test_drops_parameter_and_folds_is_none_branch() -> None:
    rewrites("""\
        def forward(self, x, head_mask=None):
            if head_mask is not None:
                x = x * head_mask
            return x
        """, """\
        def forward(self, x):
            return x
        """)


def test_folds_default_from_config_and_keeps_the_constant_local() -> None:
    rewrites("""\
        def forward(self, x, return_dict=None):
            return_dict = return_dict if return_dict is not None else self.config.use_return_dict
            if not return_dict:
                return (x,)
            return Output(x)
        """, """\
        def forward(self, x):
            return (x,)
        """)


def test_else_branch_kept_when_test_is_false() -> None:
    rewrites("""\
        def f(x, use_cache=False):
            if use_cache:
                y = 1
            else:
                y = 2
            return x + y
        """, """\
        def f(x):
            y = 2
            return x + y
        """)


def test_elif_chain_is_folded_branch_by_branch() -> None:
    rewrites("""\
        def f(x, flag, use_cache=False):
            if flag:
                a = 1
            elif use_cache:
                a = 2
            else:
                a = 3
            return a
        """, """\
        def f(x, flag):
            if flag:
                a = 1
            else:
                a = 3
            return a
        """)


def test_statements_after_a_folded_return_are_dropped() -> None:
    rewrites("""\
        def f(x, return_dict=None):
            if not return_dict:
                return x
            print("unreachable")
            return None
        """, """\
        def f(x):
            return x
        """)


def test_reassignment_on_one_path_keeps_an_entry_binding() -> None:
    # `head_mask` may still hold its entry value after the if: it must stay bound.
    rewrites("""\
        def f(x, cond, head_mask=None):
            if cond:
                head_mask = x
            return head_mask
        """, """\
        def f(x, cond):
            head_mask = None
            if cond:
                head_mask = x
            return head_mask
        """)


def test_reassignment_ends_propagation_and_derived_constants_propagate() -> None:
    rewrites("""\
        def f(x, head_mask=None):
            a = head_mask is None
            head_mask = x
            b = head_mask is None
            return a, b
        """, """\
        def f(x):
            head_mask = x
            b = head_mask is None
            return True, b
        """)


def test_loop_forgets_what_it_rebinds() -> None:
    rewrites("""\
        def f(xs, use_cache=False):
            for x in xs:
                if use_cache is False:
                    use_cache = x
            return use_cache
        """, """\
        def f(xs):
            use_cache = False
            for x in xs:
                if use_cache is False:
                    use_cache = x
            return use_cache
        """)


def test_loop_keeps_constants_whose_rebinding_was_folded_away() -> None:
    rewrites("""\
        def f(xs, use_cache=False, head_mask=None):
            cache = head_mask
            for x in xs:
                if use_cache:
                    cache = x
                g(cache)
        """, """\
        def f(xs):
            for x in xs:
                g(None)
        """)


def test_keyword_arguments_are_dropped_at_local_call_sites() -> None:
    rewrites("""\
        def f(self, x):
            return self.layer(x, use_cache=True, head_mask=m, scale=2)
        """, """\
        def f(self, x):
            return self.layer(x, scale=2)
        """)


def test_trailing_comma_layout_survives_dropping_the_last_keyword() -> None:
    rewrites("""\
        def f(self, x):
            return self.layer(
                x,
                scale=2,
                use_cache=True,
            )
        """, """\
        def f(self, x):
            return self.layer(
                x,
                scale=2,
            )
        """)


def test_calls_into_imported_code_keep_their_keywords() -> None:
    assert_unchanged(SpecializeArguments, """\
        from transformers.modeling_outputs import Output
        import warnings

        def f(x):
            warnings.warn("x", use_cache=1)
            return Output(x, return_dict=2)
        """, **OPTIONS)


def test_assignments_that_only_fed_removed_code_are_dropped() -> None:
    rewrites("""\
        def f(self, x, head_mask=None):
            layer_mask = self.get_head_mask(head_mask)
            extra = layer_mask[0]
            y = self.layer(x, head_mask=extra)
            return y
        """, """\
        def f(self, x):
            y = self.layer(x)
            return y
        """, constants=OPTIONS["constants"], pure_methods=["get_head_mask"])


def test_impure_calls_are_kept_even_when_their_result_is_unused() -> None:
    rewrites("""\
        def f(self, x, head_mask=None):
            layer_mask = self.get_head_mask(head_mask)
            return self.layer(x, head_mask=layer_mask)
        """, """\
        def f(self, x):
            layer_mask = self.get_head_mask(None)
            return self.layer(x)
        """)


def test_dead_variables_of_the_original_are_left_alone() -> None:
    rewrites("""\
        def f(x, use_cache=False):
            unused = x + 1
            if use_cache:
                x = x * 2
            return x
        """, """\
        def f(x):
            unused = x + 1
            return x
        """)


def test_boolean_operators_keep_value_semantics_outside_conditions() -> None:
    rewrites("""\
        def f(x, use_cache=False, head_mask=None):
            a = use_cache and x
            b = head_mask or x
            c = x and use_cache
            return a, b, c
        """, """\
        def f(x):
            b = x
            c = x and False
            return False, b, c
        """)


def test_conditions_fold_through_pure_operands() -> None:
    rewrites("""\
        def f(self, x, use_cache=False):
            if self.is_decoder and use_cache:
                x = x + 1
            if call() and use_cache:
                x = x + 2
            return x
        """, """\
        def f(self, x):
            if call() and False:
                x = x + 2
            return x
        """)


def test_chained_identity_checks_are_not_folded_wrongly() -> None:
    rewrites("""\
        def f(x, head_mask=None):
            return x is head_mask is None
        """, """\
        def f(x):
            return x is None is None
        """)


def test_comprehension_and_lambda_variables_shadow_the_constant() -> None:
    rewrites("""\
        def f(xs, use_cache=False):
            a = [use_cache for use_cache in xs]
            g = lambda use_cache: use_cache
            return a, g, use_cache
        """, """\
        def f(xs):
            a = [use_cache for use_cache in xs]
            g = lambda use_cache: use_cache
            return a, g, False
        """)


def test_nested_function_reading_the_parameter_keeps_an_entry_binding() -> None:
    rewrites("""\
        def f(x, use_cache=False):
            def inner():
                return use_cache
            return inner()
        """, """\
        def f(x):
            use_cache = False
            def inner():
                return use_cache
            return inner()
        """)


def test_required_parameters_go_from_methods_and_module_level_functions() -> None:
    # Callers pass them by keyword (the keyword goes) or positionally in a local call (the argument goes).
    rewrites("""\
        def project(x, head_mask):
            if head_mask is None:
                return x
            return x * head_mask

        class Layer:
            def forward(self, hidden_states, layer_head_mask, use_cache=True, *, return_dict):
                if use_cache or return_dict:
                    return hidden_states, layer_head_mask
                return hidden_states

        def caller(layer, x):
            return project(x, None) + layer(x, layer_head_mask=None, return_dict=False)
        """, """\
        def project(x):
            return x

        class Layer:
            def forward(self, hidden_states):
                return hidden_states

        def caller(layer, x):
            return project(x) + layer(x)
        """, constants={"head_mask": "None", "layer_head_mask": "None", "use_cache": "False",
                        "return_dict": "False"})


def test_required_parameters_of_nested_functions_stay() -> None:
    # A nested function's calls are not resolved: removing a parameter could shift their arguments.
    assert_unchanged(SpecializeArguments, """\
        def outer(x):
            def inner(x, head_mask):
                return x if head_mask is None else x * head_mask
            return inner(x, None)
        """, **OPTIONS)


def test_functions_without_the_parameters_are_untouched() -> None:
    assert_unchanged(SpecializeArguments, """\
        def f(x, mask=None):
            if mask is None:
                mask = 1
            return x * mask
        """, **OPTIONS)


def test_global_declarations_leave_the_function_alone() -> None:
    source = """\
        def f(x, use_cache=False):
            global counter
            if use_cache:
                counter = x
            return x
        """
    assert run(SpecializeArguments, source, **OPTIONS) == dedent(source)


def test_docstring_stays_first_when_an_entry_binding_is_added() -> None:
    rewrites('''\
        def f(x, cond, head_mask=None):
            """Doc."""
            if cond:
                head_mask = x
            return head_mask
        ''', '''\
        def f(x, cond):
            """Doc."""
            head_mask = None
            if cond:
                head_mask = x
            return head_mask
        ''')


def test_recipe_values_must_be_literals() -> None:
    with pytest.raises(ValueError, match="not a literal constant"):
        run(SpecializeArguments, "x = 1\n", constants={"use_cache": "some_call()"})


FACTS = {"constants": {}, "facts": [
    {"expression": "mask.dim()", "value": "2", "reason": "mask must be 2-D"},
    {"expression": "x.shape[0] + 1", "value": "3", "reason": "three"},
    {"expression": "x.is_cuda", "value": "False", "reason": "cpu only"},
    {"expression": "a.shape[1] < b.shape[1]", "value": "False", "reason": "no prefix"},
]}


def test_fact_is_substituted_behind_a_traceable_guard() -> None:
    rewrites("""\
        def f(mask):
            if mask.dim() == 3:
                out = mask[:, None]
            elif mask.dim() == 2:
                out = mask[:, None, None]
            return out
        """, """\
        def f(mask):
            torch._assert(mask.dim() == 2, 'mask must be 2-D')
            out = mask[:, None, None]
            return out
        """, **FACTS)


def test_fact_guard_on_an_operator_expression_is_parenthesized_not_chained() -> None:
    rewrites("""\
        def f(x):
            return x.shape[0] + 1 == 3
        """, """\
        def f(x):
            torch._assert((x.shape[0] + 1) == 3, 'three')
            return True
        """, **FACTS)


def test_false_non_comparison_fact_is_guarded_by_sym_not() -> None:
    rewrites("""\
        def f(x):
            if x.is_cuda:
                x = x.cpu()
            return x
        """, """\
        def f(x):
            torch._assert(torch.sym_not(x.is_cuda), 'cpu only')
            return x
        """, **FACTS)


def test_fact_guard_is_not_repeated_once_it_dominates() -> None:
    rewrites("""\
        def f(mask):
            if mask.dim() == 3:
                x = 1
            if mask.dim() == 2:
                x = 2
            return x
        """, """\
        def f(mask):
            torch._assert(mask.dim() == 2, 'mask must be 2-D')
            x = 2
            return x
        """, **FACTS)


def test_false_comparison_fact_is_guarded_by_its_inverse() -> None:
    rewrites("""\
        def f(a, b):
            if a.shape[1] < b.shape[1]:
                a = pad(a)
            return a
        """, """\
        def f(a, b):
            torch._assert(a.shape[1] >= b.shape[1], 'no prefix')
            return a
        """, **FACTS)


def _call(source: str, name: str, *args):
    namespace: dict = {}
    exec(dedent(source), namespace)
    return namespace[name](*args)


SEMANTICS = """\
def f(x, cond, head_mask=None, use_cache=False, return_dict=None):
    return_dict = return_dict if return_dict is not None else False
    total = 0
    for i in range(x):
        if use_cache and i % 2:
            total += 100
        elif cond or head_mask is not None:
            total += i
        else:
            total -= 1
        if head_mask is None and i == 3:
            head_mask = i
    if not return_dict:
        return total, head_mask
    return {"total": total}
"""


@pytest.mark.parametrize("x", [0, 1, 4, 7])
@pytest.mark.parametrize("cond", [True, False])
def test_specialized_function_computes_what_the_original_did(x: int, cond: bool) -> None:
    after = run(SpecializeArguments, SEMANTICS, **OPTIONS)
    assert "head_mask=None" not in after and "use_cache" not in after
    assert _call(after, "f", x, cond) == _call(SEMANTICS, "f", x, cond)


def test_positional_arguments_for_removed_parameters_are_dropped_at_local_calls() -> None:
    rewrites("""\
        class Attention:
            def _attn(self, q, k, mask=None, head_mask=None, output_attentions=False):
                w = q * k
                if head_mask is not None:
                    w = w * head_mask
                return (w,) + ((w,) if output_attentions else ())

            def forward(self, q, k, mask=None, head_mask=None):
                return self._attn(q, k, mask, head_mask, True)


        def helper(x, use_cache=False):
            return x

        def f(self, x):
            return helper(x, True) + self._attn(x, x, None, None)
        """, """\
        class Attention:
            def _attn(self, q, k, mask=None):
                w = q * k
                return (w,) + ()

            def forward(self, q, k, mask=None):
                return self._attn(q, k, mask)


        def helper(x):
            return x

        def f(self, x):
            return helper(x) + self._attn(x, x, None, None)
        """)


def test_a_positional_argument_with_effects_cannot_be_dropped() -> None:
    from transforms.library.base import TransformError
    with pytest.raises(TransformError, match="cannot drop the argument `g.pop\\(\\)`"):
        run(SpecializeArguments, """\
            def helper(x, use_cache=False):
                return x

            def f(g):
                return helper(1, g.pop())
            """, **OPTIONS)


def test_a_shadowed_function_name_is_not_a_local_callee() -> None:
    assert_unchanged(SpecializeArguments, """\
        def helper(x, y=None):
            return x

        def f(helper, x):
            return helper(x, True)
        """, **OPTIONS)


def test_a_fact_on_module_state_with_its_own_check() -> None:
    rewrites("""\
        class Model:
            def forward(self, x):
                for layer in self.layers:
                    if self.model_parallel:
                        x = x.to(layer.device)
                    x = layer(x)
                return x
        """, """\
        class Model:
            def forward(self, x):
                for layer in self.layers:
                    torch._assert(not self.model_parallel, 'no parallelize()')
                    x = layer(x)
                return x
        """, constants={}, facts=[{"expression": "self.model_parallel", "value": "False",
                                   "reason": "no parallelize()", "check": "not self.model_parallel"}])


def test_an_unguarded_fact_may_state_an_expression() -> None:
    rewrites("""\
        def attend(module, q, p=0.0):
            return q

        class Attention:
            def forward(self, q):
                interface = REGISTRY.get_interface(self.config.kind, attend)
                return interface(self, q, p=0.0 if not self.training else self.dropout)
        """, """\
        def attend(module, q, p=0.0):
            return q

        class Attention:
            def forward(self, q):
                interface = attend
                return interface(self, q, p=self.dropout)
        """, constants={}, facts=[
            {"expression": "REGISTRY.get_interface(self.config.kind, attend)", "value": "attend", "guard": False,
             "reason": "the default implementation"},
            {"expression": "0.0 if not self.training else self.dropout", "value": "self.dropout", "guard": False,
             "reason": "p is read only when training"}])


def test_a_guarded_fact_states_a_literal() -> None:
    from common.schema import OptionError
    with pytest.raises(OptionError, match="not a literal constant"):
        run(SpecializeArguments, "x = 1\n", constants={},
            facts=[{"expression": "a", "value": "b", "reason": "guarded: compared with b at run time"}])
    with pytest.raises(OptionError, match="not an expression"):
        run(SpecializeArguments, "x = 1\n", constants={},
            facts=[{"expression": "a", "value": "b +", "guard": False, "reason": "r"}])


def test_a_fact_check_must_be_an_expression() -> None:
    from common.schema import OptionError
    with pytest.raises(OptionError, match="facts.\\[0\\].check|facts\\[0\\].check"):
        run(SpecializeArguments, "x = 1\n", constants={},
            facts=[{"expression": "a", "value": "False", "check": "not ("}])


LAYERS = """\
    from torch import nn


    class Attention(nn.Module):
        def forward(self, h, mask=None, encoder_hidden_states=None):
            if encoder_hidden_states is not None:
                h = h + encoder_hidden_states
            return h


    class Layer(nn.Module):
        def __init__(self, config):
            self.attention = Attention(config)
            self.crossattention = Attention(config) if config.add_cross_attention else None

        def forward(self, h, mask=None, encoder_hidden_states=None):
            h = self.attention(h, mask)
            if encoder_hidden_states is not None:
                h = self.crossattention(h, mask, encoder_hidden_states)
            return h


    class Encoder(nn.Module):
        def __init__(self, config):
            self.layer = nn.ModuleList([Layer(config) for _ in range(config.n)])

        def forward(self, h, mask=None, encoder_hidden_states=None):
            for i, layer_module in enumerate(self.layer):
                h = layer_module(h, mask, encoder_hidden_states)
            return h


    class MaskedLM(nn.Module):
        def forward(self, x, encoder_hidden_states=None):
            return self.encoder(x, None, encoder_hidden_states=encoder_hidden_states)
    """
CROSS: dict[str, Any] = {"constants": {"encoder_hidden_states": "None"}}


def test_positional_arguments_are_dropped_at_submodule_and_layer_loop_calls() -> None:
    rewrites(LAYERS, """\
        from torch import nn


        class Attention(nn.Module):
            def forward(self, h, mask=None):
                return h


        class Layer(nn.Module):
            def __init__(self, config):
                self.attention = Attention(config)
                self.crossattention = Attention(config) if config.add_cross_attention else None

            def forward(self, h, mask=None):
                h = self.attention(h, mask)
                return h


        class Encoder(nn.Module):
            def __init__(self, config):
                self.layer = nn.ModuleList([Layer(config) for _ in range(config.n)])

            def forward(self, h, mask=None):
                for i, layer_module in enumerate(self.layer):
                    h = layer_module(h, mask)
                return h


        class MaskedLM(nn.Module):
            def forward(self, x):
                return self.encoder(x, None)
        """, **CROSS)


def test_a_step_limited_to_some_classes_passes_the_constant_to_the_others() -> None:
    after = dedent(LAYERS).replace(dedent("""\
    class MaskedLM(nn.Module):
        def forward(self, x, encoder_hidden_states=None):
            return self.encoder(x, None, encoder_hidden_states=encoder_hidden_states)
    """), dedent("""\
    class MaskedLM(nn.Module):
        def forward(self, x):
            return self.encoder(x, None, encoder_hidden_states=None)
    """))
    assert after != dedent(LAYERS)
    rewrites(LAYERS, after, classes=("MaskedLM",), **CROSS)


def test_a_submodule_whose_class_is_not_certain_keeps_its_arguments() -> None:
    code = LAYERS.replace("self.attention = Attention(config)",
                          "self.attention = Attention(config) if config.a else Other(config)")
    result = run(SpecializeArguments, code, **CROSS)
    assert "h = self.attention(h, mask)" in result  # two arguments were passed: nothing to drop
    assert "h = layer_module(h, mask)" in result


def test_a_branch_left_with_only_pass_goes() -> None:
    rewrites("""\
        class A:
            def f(self, h, use_cache=None):
                if self.is_decoder:
                    if use_cache:
                        h = h + 1
                elif not self.is_decoder:
                    pass
                while h:
                    pass
                return h
        """, """\
        class A:
            def f(self, h):
                while h:
                    pass
                return h
        """, constants={"use_cache": "False"})
