"""libcst transforms, one per module; recipes refer to them by their registry name."""

from transforms.absolute_imports import AbsoluteImports
from transforms.base import Transform
from transforms.drop_decorators import DropDecorators
from transforms.dropout_module import DropoutModule
from transforms.dtype_branch import DtypeBranchLeaf
from transforms.fp16_clamp import Fp16Clamp
from transforms.hoist_modules import HoistModules
from transforms.item_assignment import ItemAssignment
from transforms.leaf_calls import LeafCalls
from transforms.none_checks import NoneChecks
from transforms.optional_imports import OptionalImports
from transforms.override_inherited import OverrideInherited
from transforms.prune_classes import PruneClasses
from transforms.replace_bases import ReplaceBases
from transforms.shared_weight import SharedWeight
from transforms.shift_right import FunctionalShiftRight
from transforms.single_output import SingleOutput
from transforms.size_varargs import SizeVarargs
from transforms.specialize_arguments import SpecializeArguments

REGISTRY: dict[str, type[Transform]] = {
    "absolute_imports": AbsoluteImports,
    "drop_decorators": DropDecorators,
    "optional_imports": OptionalImports,
    "prune_classes": PruneClasses,
    "replace_bases": ReplaceBases,
    "override_inherited": OverrideInherited,
    "single_output": SingleOutput,
    "specialize_arguments": SpecializeArguments,
    "shared_weight": SharedWeight,
    "dropout_module": DropoutModule,
    "hoist_modules": HoistModules,
    "size_varargs": SizeVarargs,
    "shift_right": FunctionalShiftRight,
    "dtype_branch_leaf": DtypeBranchLeaf,
    "leaf_calls": LeafCalls,
    "item_assignment": ItemAssignment,
    "fp16_clamp": Fp16Clamp,
    "none_checks": NoneChecks,
}
