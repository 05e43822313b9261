"""Make relative imports absolute, keeping the imported names."""

from __future__ import annotations

from collections.abc import Iterable

import libcst as cst
from libcst.helpers import get_absolute_module_for_import_or_raise

from transforms.library.base import Transform


class AbsoluteImports(Transform):
    """Rewrite ``from .x import Y`` to the absolute module the source lived in.

    A modeling file copied out of its package cannot use relative imports; a
    star import of the original module (FTPipe's fix) hides which names the file
    really needs.  The module is resolved against the context's
    ``full_module_name`` (the file's dotted name inside its distribution)::

        # in transformers.models.t5.modeling_t5
        from ...modeling_utils import PreTrainedModel      # before
        from transformers.modeling_utils import PreTrainedModel  # after
    """

    DESCRIPTION = "relative imports -> absolute imports of the same names"

    def focus(self) -> Iterable[cst.CSTNode]:
        return [node for node in self.index.nodes(cst.ImportFrom) if node.relative]

    def leave_ImportFrom(self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom) -> cst.ImportFrom:
        if not updated_node.relative:
            return updated_node
        absolute = get_absolute_module_for_import_or_raise(self.context.full_module_name, updated_node)
        return updated_node.with_changes(relative=(), module=cst.parse_expression(absolute))
