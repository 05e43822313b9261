import pytest
from support.transform_helpers import assert_rewrites, assert_unchanged, run

from transforms.library.base import TransformError
from transforms.renamed_keywords import RenamedKeywords

_IMPORT = "        from ...utils.deprecation import deprecate_kwarg\n"  # indented as the dedented code below


def test_a_declared_rename_is_undone_in_the_function_and_every_call() -> None:
    assert_rewrites(RenamedKeywords, _IMPORT + """\
        class Layer:
            @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
            def forward(self, hidden_states, cache=None):
                if cache is not None:
                    hidden_states = cache.update(hidden_states)
                return self.mlp(hidden_states, cache=cache)

        def build(config, cache):
            mask_kwargs = {"config": config, "cache": cache}
            return create_causal_mask(config=config, cache=cache), create_sliding_window_causal_mask(**mask_kwargs)
        """, """\
        class Layer:
            def forward(self, hidden_states, past_key_values=None):
                if past_key_values is not None:
                    hidden_states = past_key_values.update(hidden_states)
                return self.mlp(hidden_states, past_key_values=past_key_values)

        def build(config, past_key_values):
            mask_kwargs = {"config": config, "past_key_values": past_key_values}
            return create_causal_mask(config=config, past_key_values=past_key_values), create_sliding_window_causal_mask(**mask_kwargs)
        """)


def test_fields_of_library_outputs_keep_their_new_name() -> None:
    """``outputs.cache`` reads a field of a library class, which was renamed too."""
    result = run(RenamedKeywords, _IMPORT + """\
        @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
        def forward(self, x, cache=None):
            outputs = self.model(x, cache=cache)
            return outputs.cache
        """)
    assert "return outputs.cache" in result and "self.model(x, past_key_values=past_key_values)" in result


def test_a_decorator_that_only_removes_a_keyword_is_left() -> None:
    assert_unchanged(RenamedKeywords, _IMPORT + """\
        @deprecate_kwarg("head_mask", "5.40.0")
        def forward(self, x, cache=None):
            return x
        """)


def test_a_same_named_local_decorator_is_not_the_library_one() -> None:
    assert_unchanged(RenamedKeywords, """\
        def deprecate_kwarg(*args, **kwargs):
            return lambda f: f

        @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
        def forward(self, x, cache=None):
            return cache
        """)


def test_a_function_taking_both_names_stops_the_step() -> None:
    with pytest.raises(TransformError, match="takes both 'past_key_values' and its new name 'cache'"):
        run(RenamedKeywords, _IMPORT + """\
        @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
        def forward(self, x, cache=None, past_key_values=None):
            return cache
        """)
