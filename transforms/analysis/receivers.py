"""Which attribute chains on a method's receiver an expression reads, and whether it uses the receiver otherwise."""

from __future__ import annotations

import libcst as cst

from transforms.analysis.syntax import dotted_name


class ReceiverChains(cst.CSTVisitor):
    """Attribute chains on the receiver read for their dtype or an isinstance test; ``other_use``: any other use."""

    def __init__(self, receiver: str) -> None:
        self.receiver = receiver
        self.chains: list[cst.BaseExpression] = []
        self.other_use = False
        self._allowed: set[int] = set()

    def _chain(self, node: cst.BaseExpression) -> bool:
        text = dotted_name(node)
        return text is not None and text.split(".")[0] == self.receiver and "." in text

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        if node.attr.value == "dtype" and self._chain(node.value):
            self._take(node.value)
            return False
        return True

    def visit_Call(self, node: cst.Call) -> bool:
        if isinstance(node.func, cst.Name) and node.func.value == "isinstance" and node.args \
                and self._chain(node.args[0].value):
            self._take(node.args[0].value)
            for arg in node.args[1:]:
                arg.visit(self)
            return False
        return True

    def visit_Name(self, node: cst.Name) -> None:
        if node.value == self.receiver:
            self.other_use = True

    def _take(self, chain: cst.BaseExpression) -> None:
        if not any(chain.deep_equals(c) for c in self.chains):
            self.chains.append(chain)
