"""libcst transforms, one per module; recipes refer to them by their registry name."""

from transforms.absolute_imports import AbsoluteImports
from transforms.buffer_slices import BufferSlices
from transforms.chunked_forward import ChunkedForward
from transforms.classification_loss import ClassificationLoss
from transforms.copy_definitions import CopyDefinitions
from transforms.drop_decorators import DropDecorators
from transforms.drop_forwarded_kwargs import DropForwardedKwargs
from transforms.dropout_module import DropoutModule
from transforms.dtype_branch_leaf import DtypeBranchLeaf
from transforms.finfo_values import FinfoValues
from transforms.fp16_clamp import Fp16Clamp
from transforms.hoist_modules import HoistModules
from transforms.item_assignment import ItemAssignment
from transforms.layer_drop import LayerDropLoop
from transforms.leaf_calls import LeafCalls
from transforms.library.base import Transform
from transforms.module_dtype import ModuleDtype
from transforms.none_checks import NoneChecks
from transforms.optional_imports import OptionalImports
from transforms.out_of_place import OutOfPlace
from transforms.override_inherited import OverrideInherited
from transforms.prune_classes import PruneClasses
from transforms.remove_classes import RemoveClasses
from transforms.renamed_keywords import RenamedKeywords
from transforms.replace_bases import ReplaceBases
from transforms.shared_weight import SharedWeight
from transforms.shift_right import FunctionalShiftRight
from transforms.single_output import SingleOutput
from transforms.size_varargs import SizeVarargs
from transforms.specialize_arguments import SpecializeArguments
from transforms.sym_numbers import SymNumbers
from transforms.torch_assert import TorchAssert

REGISTRY: dict[str, type[Transform]] = {
    "absolute_imports": AbsoluteImports,
    "renamed_keywords": RenamedKeywords,
    "drop_decorators": DropDecorators,
    "drop_forwarded_kwargs": DropForwardedKwargs,
    "optional_imports": OptionalImports,
    "prune_classes": PruneClasses,
    "replace_bases": ReplaceBases,
    "remove_classes": RemoveClasses,
    "override_inherited": OverrideInherited,
    "copy_definitions": CopyDefinitions,
    "single_output": SingleOutput,
    "specialize_arguments": SpecializeArguments,
    "shared_weight": SharedWeight,
    "dropout_module": DropoutModule,
    "classification_loss": ClassificationLoss,
    "hoist_modules": HoistModules,
    "size_varargs": SizeVarargs,
    "shift_right": FunctionalShiftRight,
    "dtype_branch_leaf": DtypeBranchLeaf,
    "leaf_calls": LeafCalls,
    "item_assignment": ItemAssignment,
    "out_of_place": OutOfPlace,
    "fp16_clamp": Fp16Clamp,
    "finfo_values": FinfoValues,
    "module_dtype": ModuleDtype,
    "layer_drop": LayerDropLoop,
    "torch_assert": TorchAssert,
    "buffer_slices": BufferSlices,
    "chunked_forward": ChunkedForward,
    "sym_numbers": SymNumbers,
    "none_checks": NoneChecks,
}
