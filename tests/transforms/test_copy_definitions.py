from typing import Any

import pytest
from support.transform_helpers import assert_rewrites, assert_unchanged, run

from transforms.copy_definitions import CopyDefinitions
from transforms.library.base import TransformError

# In the shape of transformers 4.5.1's modeling_utils.py.
SUPPORT = '''\
import torch
from torch import nn
from torch.nn import functional as F

from .activations import get_activation

LIMIT = 3


class Conv1D(nn.Module):
    """Linear with transposed weights."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.empty(nx, nf))

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        return F.relu(x).view(*size_out)


class Summary(nn.Module):
    def forward(self, x):
        return get_activation("gelu")(x)


def limited(x):
    return min(x, LIMIT)
'''
SCRATCH = {"support_sources": {"transformers/modeling_utils.py": SUPPORT}}
OPTIONS: dict[str, Any] = {"source": "transformers/modeling_utils.py", "names": ["Conv1D"], "scratch": SCRATCH}
MODULE = "transformers.models.gpt2.modeling_gpt2"


def test_an_imported_class_is_copied_in_place_of_its_import() -> None:
    assert_rewrites(CopyDefinitions, """\
        import torch
        import torch.nn as nn

        from ...modeling_utils import (
            Conv1D,
            PreTrainedModel,
        )

        logger = 1


        class Attention(nn.Module):
            def __init__(self):
                self.c_attn = Conv1D(3, 4)
        """, '''\
        import torch
        import torch.nn as nn

        from ...modeling_utils import (
            PreTrainedModel,
        )
        from torch.nn import functional as F

        logger = 1


        # Copied from transformers/modeling_utils.py Conv1D
        class Conv1D(nn.Module):
            """Linear with transposed weights."""

            def __init__(self, nf, nx):
                super().__init__()
                self.nf = nf
                self.weight = nn.Parameter(torch.empty(nx, nf))

            def forward(self, x):
                size_out = x.size()[:-1] + (self.nf,)
                return F.relu(x).view(*size_out)


        class Attention(nn.Module):
            def __init__(self):
                self.c_attn = Conv1D(3, 4)
        ''', module_name=MODULE, **OPTIONS)


def test_the_last_name_of_an_import_takes_the_import_with_it() -> None:
    result = run(CopyDefinitions, """\
        from torch import nn
        from torch.nn import functional as F
        import torch
        from transformers.modeling_utils import Conv1D

        class A(nn.Module):
            pass
        """, module_name=MODULE, **OPTIONS)
    assert "import Conv1D" not in result and "class Conv1D(nn.Module):" in result
    assert result.index("class Conv1D") < result.index("class A")


def test_a_function_and_the_imports_a_copy_needs_from_a_relative_support_import() -> None:
    result = run(CopyDefinitions, "from transformers.modeling_utils import Summary\n",
                 module_name=MODULE, **dict(OPTIONS, names=["Summary"]))
    assert "from transformers.activations import get_activation" in result
    assert "from torch import nn" in result


def test_a_module_defining_the_name_is_left_alone() -> None:
    assert_unchanged(CopyDefinitions, """\
        class Conv1D:
            pass
        """, module_name=MODULE, **OPTIONS)


@pytest.mark.parametrize("code,names,message", [
    ("import torch\n", ["Conv1D"], "the module neither imports Conv1D from transformers/modeling_utils.py"),
    ("from transformers.modeling_utils import Missing\n", ["Missing"], "defines no class or function Missing"),
    ("from transformers.modeling_utils import limited\n", ["limited"], "limited uses LIMIT, which "
                                                                       "transformers/modeling_utils.py defines itself"),
    ("from somewhere import nn\nfrom transformers.modeling_utils import Conv1D\n", ["Conv1D"],
     "Conv1D uses nn, which this module binds to something other than transformers/modeling_utils.py's torch.nn"),
    ("from transformers.modeling_utils import Conv1D as C\n", ["Conv1D"], "neither imports Conv1D"),
])
def test_what_cannot_be_copied_is_an_error(code: str, names: list[str], message: str) -> None:
    with pytest.raises(TransformError, match=message):
        run(CopyDefinitions, code, module_name=MODULE, **dict(OPTIONS, names=names))


def test_a_support_file_that_was_not_fetched_is_an_error() -> None:
    with pytest.raises(TransformError, match="was not fetched"):
        run(CopyDefinitions, "x = 1\n", source="other.py", names=["Conv1D"], scratch=SCRATCH)
