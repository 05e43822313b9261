from typing import Any

import pytest
from support.transform_helpers import assert_rewrites, assert_unchanged, run

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
OPTIONS: dict[str, Any] = {"source": "pkg/utils.py", "from_class": "Mixin", "into": "Model", "methods": ["extend"],
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


def test_a_support_module_global_is_imported_from_the_support_module() -> None:
    options = dict(OPTIONS, methods=["uses_module_global"])
    assert "from pkg.utils import HELPER\n" in run(OverrideInherited, "class Model:\n    pass\n", **options)


def test_a_support_module_global_this_module_binds_otherwise_is_refused() -> None:
    options = dict(OPTIONS, methods=["uses_module_global"])
    with pytest.raises(ValueError, match="uses HELPER, which pkg/utils.py defines and this module binds to"):
        run(OverrideInherited, "HELPER = 2\n\n\nclass Model:\n    pass\n", **options)


def test_a_name_the_support_file_neither_defines_nor_imports_is_refused() -> None:
    support = SUPPORT + "\n\nclass Other:\n    def f(self):\n        return UNDEFINED\n"
    options = dict(OPTIONS, from_class="Other", methods=["f"], scratch={"support_sources": {"pkg/utils.py": support}})
    with pytest.raises(ValueError, match="uses UNDEFINED, which pkg/utils.py neither defines nor imports"):
        run(OverrideInherited, "class Model:\n    pass\n", **options)


STATIC = '''\
import torch


class Mixin:
    @property
    def device(self):
        return torch.device("cpu")

    @staticmethod
    def causal(shape, device: device = None):
        return torch.ones(shape, device=device)

    def extend(self, mask, shape, device: device = None) -> device:
        return Mixin.causal(shape, device) * Mixin.helper(mask)
'''


def test_sibling_calls_through_the_source_class_call_the_copies_and_stray_annotations_go() -> None:
    options = dict(OPTIONS, methods=["causal", "extend"], scratch={"support_sources": {"pkg/utils.py": STATIC}})
    assert_rewrites(OverrideInherited, """\
        class Model(Base):
            x = 1
        """, """\
        import torch
        from pkg.utils import Mixin

        class Model(Base):
            x = 1

            # Copied from pkg/utils.py Mixin.causal
            @staticmethod
            def causal(shape, device = None):
                return torch.ones(shape, device=device)

            # Copied from pkg/utils.py Mixin.extend
            def extend(self, mask, shape, device = None):
                return Model.causal(shape, device) * Mixin.helper(mask)
        """, **options)


def test_missing_method_or_support_file_is_a_recipe_error() -> None:
    with pytest.raises(ValueError, match="has no Mixin.nope"):
        run(OverrideInherited, "class Model:\n    pass\n", **dict(OPTIONS, methods=["nope"]))
    with pytest.raises(ValueError, match="was not fetched"):
        run(OverrideInherited, "class Model:\n    pass\n", **dict(OPTIONS, scratch={}))
