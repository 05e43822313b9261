from support.transform_helpers import assert_rewrites, assert_unchanged

from transforms.torch_assert import TorchAssert


def test_assert_in_forward_becomes_torch_assert() -> None:
    assert_rewrites(TorchAssert, """\
        import torch

        class Model:
            def forward(self, input_ids, attention_mask=None):
                batch_size = input_ids.shape[0]
                if attention_mask is not None:
                    assert batch_size > 0, "batch_size has to be defined and > 0"
                    attention_mask = attention_mask.view(batch_size, -1)
                assert hasattr(
                    self, "q_attn"
                ), "needs q_attn"
                assert input_ids.dim() == 2; x = 1  # keeps the line
                return attention_mask
        """, """\
        import torch

        class Model:
            def forward(self, input_ids, attention_mask=None):
                batch_size = input_ids.shape[0]
                if attention_mask is not None:
                    torch._assert(batch_size > 0, "batch_size has to be defined and > 0")
                    attention_mask = attention_mask.view(batch_size, -1)
                torch._assert(hasattr(
                    self, "q_attn"
                ), "needs q_attn")
                torch._assert(input_ids.dim() == 2, 'input_ids.dim() == 2'); x = 1  # keeps the line
                return attention_mask
        """)


def test_torch_is_imported_when_missing() -> None:
    assert_rewrites(TorchAssert, """\
        def forward(x):
            assert x.size() == (2, 3), "shape"
            return x
        """, """\
        import torch

        def forward(x):
            torch._assert(x.size() == (2, 3), "shape")
            return x
        """)


def test_other_functions_and_module_level_asserts_are_left_alone() -> None:
    assert_unchanged(TorchAssert, """\
        assert True

        class Attention:
            def __init__(self, n_state, n_head):
                assert n_state % n_head == 0

            def forward(self, x):
                return x
        """)


def test_functions_option_names_the_methods() -> None:
    assert_rewrites(TorchAssert, """\
        import torch

        def _attn(w, n):
            assert w.size(-1) == n, "n"
        """, """\
        import torch

        def _attn(w, n):
            torch._assert(w.size(-1) == n, "n")
        """, functions=["_attn"])
