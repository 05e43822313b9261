from support.transform_helpers import assert_rewrites, assert_unchanged

from transforms.absolute_imports import AbsoluteImports


def test_parent_package_import() -> None:
    assert_rewrites(AbsoluteImports, "from ...modeling_utils import PreTrainedModel\n",
                    "from transformers.modeling_utils import PreTrainedModel\n")


def test_sibling_module_import() -> None:
    assert_rewrites(AbsoluteImports, "from .configuration_t5 import T5Config\n",
                    "from transformers.models.t5.configuration_t5 import T5Config\n")


def test_dotted_relative_module_keeps_names_and_aliases() -> None:
    assert_rewrites(AbsoluteImports,
                    "from ...utils.model_parallel_utils import assert_device_map as adm, get_device_map\n",
                    "from transformers.utils.model_parallel_utils import assert_device_map as adm, get_device_map\n")


def test_parenthesized_multiline_import_keeps_layout() -> None:
    assert_rewrites(AbsoluteImports, """\
        from ...file_utils import (
            DUMMY_INPUTS,
            add_start_docstrings,  # kept comment
        )
        """, """\
        from transformers.file_utils import (
            DUMMY_INPUTS,
            add_start_docstrings,  # kept comment
        )
        """)


def test_bare_dot_import() -> None:
    assert_rewrites(AbsoluteImports, "from . import configuration_t5\n",
                    "from transformers.models.t5 import configuration_t5\n")


def test_absolute_imports_are_left_alone() -> None:
    assert_unchanged(AbsoluteImports, "import torch\nfrom torch import nn\nfrom transformers import T5Config\n")


def test_strings_mentioning_relative_imports_are_left_alone() -> None:
    assert_unchanged(AbsoluteImports, 'DOC = "from ...modeling_utils import X"\n')


def test_nested_import_inside_function() -> None:
    assert_rewrites(AbsoluteImports, "def f():\n    from ..bert import modeling_bert\n",
                    "def f():\n    from transformers.models.bert import modeling_bert\n")
