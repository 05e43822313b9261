"""Analyses several transforms share; none of them is a transform.

- ``syntax``: a node's code, dotted and root names, docstring and import lines, list and suite edits.
- ``literals``: which expressions are constants or literals, and their values.
- ``names``: names read and bound, assignment targets, a module's import table.
- ``scopes``: one walk over a module: parents, scopes, qualified names, local uses, nodes by kind.
- ``purity``: expressions that can be dropped without losing an effect.
- ``folding``: expression-level constant folding.
- ``propagation``: flow-sensitive constant propagation over a function body.
- ``liveness``: live names and removal of dead pure assignments.
- ``facts``: recipe facts replaced by their values behind runtime guards.
"""
