"""libcst transforms, one per module; recipes refer to them by ``NAME``."""

from transforms.absolute_imports import AbsoluteImports

REGISTRY = {
    "absolute_imports": AbsoluteImports,
}
