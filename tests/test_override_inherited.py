import pytest

from transform_helpers import assert_rewrites, assert_unchanged, run
from transforms.override_inherited import OverrideInherited

SUPPORT = '''\
from typing import Tuple

import torch
from torch import Tensor, device

HELPER = 1


class Mixin:
    def extend(self, mask: Tensor, shape: Tuple[int], device: device) -> Tensor:
        """Doc."""
        return mask[:, None].to(device)

    def uses_module_global(self):
        return HELPER
'''
OPTIONS = {"source": "pkg/utils.py", "from_class": "Mixin", "into": "Model", "methods": ["extend"],
           "scratch": {"support_sources": {"pkg/utils.py": SUPPORT}}}


def test_method_is_copied_with_the_imports_it_needs() -> None:
    assert_rewrites(OverrideInherited, """\
        import torch


        class Model(Base):
            x = 1
        """, '''\
        import torch
        from torch import Tensor, device
        from typing import Tuple


        class Model(Base):
            x = 1

            # Copied from pkg/utils.py Mixin.extend
            def extend(self, mask: Tensor, shape: Tuple[int], device: device) -> Tensor:
                """Doc."""
                return mask[:, None].to(device)
        ''', **OPTIONS)


def test_a_class_keeps_its_own_definition() -> None:
    assert_unchanged(OverrideInherited, """\
        class Model(Base):
            def extend(self, mask, shape, device):
                return mask
        """, **OPTIONS)


def test_method_depending_on_a_support_module_global_is_refused() -> None:
    options = dict(OPTIONS, methods=["uses_module_global"])
    with pytest.raises(ValueError, match="uses HELPER, which pkg/utils.py defines itself"):
        run(OverrideInherited, "class Model:\n    pass\n", **options)


def test_missing_method_or_support_file_is_a_recipe_error() -> None:
    with pytest.raises(ValueError, match="has no Mixin.nope"):
        run(OverrideInherited, "class Model:\n    pass\n", **dict(OPTIONS, methods=["nope"]))
    with pytest.raises(ValueError, match="was not fetched"):
        run(OverrideInherited, "class Model:\n    pass\n", **dict(OPTIONS, scratch={}))
