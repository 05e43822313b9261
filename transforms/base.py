"""The base every transform derives from."""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import replace

import libcst as cst
from libcst.codemod import VisitorBasedCodemodCommand


class Transform(VisitorBasedCodemodCommand):
    """A codemod command that resolves metadata without copying the tree first.

    libcst deep-copies the module before resolving metadata so that a tree
    shared with other code keeps unique node identities; that copy costs as
    much as parsing the file, once per transform.  The converter owns every
    tree it passes here (fresh from the parser or from the previous transform,
    which builds new nodes), so the copy buys nothing.
    """

    @contextmanager
    def _handle_metadata_reference(self, module: cst.Module) -> Generator[cst.Module, None, None]:
        previous = self.context.wrapper
        wrapper = cst.MetadataWrapper(module, unsafe_skip_copy=True)
        with self.resolve(wrapper):
            self.context = replace(self.context, wrapper=wrapper)
            try:
                yield wrapper.module
            finally:
                self.context = replace(self.context, wrapper=previous)
