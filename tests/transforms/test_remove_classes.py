import pytest
from support.transform_helpers import assert_rewrites, assert_unchanged, run

from transforms.library.base import TransformError
from transforms.remove_classes import RemoveClasses

MODULE = "transformers.models.gpt2.modeling_gpt2"


def test_classes_go_with_the_imports_only_they_used() -> None:
    assert_rewrites(RemoveClasses, """\
        from torch.nn import CrossEntropyLoss, MSELoss
        from transformers.modeling_utils import PreTrainedModel, SequenceSummary


        class GPT2LMHeadModel(PreTrainedModel):
            def forward(self, x):
                return CrossEntropyLoss()(x)


        @add_start_docstrings("heads")
        class GPT2DoubleHeadsModel(PreTrainedModel):
            def __init__(self, config):
                self.summary = SequenceSummary(config)

            def forward(self, x):
                return MSELoss()(x) + CrossEntropyLoss()(x)


        class GPT2ForSequenceClassification(PreTrainedModel):
            pass
        """, """\
        from torch.nn import CrossEntropyLoss
        from transformers.modeling_utils import PreTrainedModel


        class GPT2LMHeadModel(PreTrainedModel):
            def forward(self, x):
                return CrossEntropyLoss()(x)
        """, module_name=MODULE, classes=["GPT2DoubleHeadsModel", "GPT2ForSequenceClassification"])


def test_nothing_to_remove_is_a_no_op() -> None:
    assert_unchanged(RemoveClasses, "class Kept:\n    pass\n", classes=["Gone"])


@pytest.mark.parametrize("code,message", [
    ("class Gone:\n    pass\n\n\nclass Kept(Gone):\n    pass\n", "Kept uses Gone, which the recipe removes"),
    ("class Gone:\n    pass\n\n\nMODELS = [Gone]\n", "the module uses Gone"),
])
def test_code_that_still_names_a_removed_class_is_an_error(code: str, message: str) -> None:
    with pytest.raises(TransformError, match=message):
        run(RemoveClasses, code, classes=["Gone"])
