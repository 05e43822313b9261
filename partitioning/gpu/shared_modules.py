"""One name per module object: the engine's trace names a module by one path, so stateless leaves are copied.

``torch.export`` records for each operation the path of the module that ran
it, and the split rebuilds each stage's module tree from those paths.  A
module object registered under several parents gets one name, so its
operations in the other places land under the wrong parent and the split
fails ("Child module 'predictions' is not a descendant of parent module
'model.cls'").  transformers 4.20 does this to every model: its ``ACT2FN``
maps names to module instances, so one ``GELUActivation`` sits in every
layer asking for "gelu", and one LM head also calls that instance
through the module-level name ``gelu`` without registering it.  A leaf
without parameters or buffers computes the same as its copy, so every
registration of one gets its own copy, and no module object a model's code
reaches some other way is registered at all.  Shared parameters are the
tied weights, which the runtime handles.
"""

from __future__ import annotations

import copy

from torch import nn

from stateless.torch_internals import own_children


def copy_stateless_leaves(model: nn.Module) -> int:
    """Replace every registered leaf module without parameters or buffers by its own copy; how many."""
    copies = 0
    for parent in list(model.modules()):
        for name, child in list(own_children(parent).items()):
            if (child is not None and next(child.children(), None) is None
                    and next(child.parameters(), None) is None and next(child.buffers(), None) is None):
                own_children(parent)[name] = copy.deepcopy(child)
                copies += 1
    return copies
