"""The classification heads' loss, chosen from ``config.problem_type`` and the labels' dtype when the graph runs.

From transformers 4.6 on, the sequence-classification heads pick their loss in Python::

    if self.config.problem_type is None:          # the first call with labels decides, once
        if self.num_labels == 1:
            self.config.problem_type = "regression"
        elif self.num_labels > 1 and (labels.dtype == torch.long or labels.dtype == torch.int):
            self.config.problem_type = "single_label_classification"
        else:
            self.config.problem_type = "multi_label_classification"
    if self.config.problem_type == "regression": ...  MSELoss
    elif ... == "single_label_classification": ...    CrossEntropyLoss
    elif ... == "multi_label_classification": ...     BCEWithLogitsLoss

``torch.fx.symbolic_trace`` cannot branch on ``labels.dtype`` (a Proxy), and a graph traced after the
first call has the config's choice baked in.  Generated code (transform ``classification_loss``) calls
:func:`problem_type_of` to write the config as stock does, then :func:`classification_loss`, which
generated modules register with ``torch.fx.wrap``: fx records it as one call that makes the choice from
the labels' dtype each time the graph runs, while eager mode and torch.export (where the dtype is static)
run it as it is.  The losses are the functional forms the modules call, with their default arguments:
the same kernels, the same bits, the same gradients.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

REGRESSION = "regression"
SINGLE_LABEL = "single_label_classification"
MULTI_LABEL = "multi_label_classification"
PROBLEM_TYPES = (REGRESSION, SINGLE_LABEL, MULTI_LABEL)


def problem_type_of(problem_type: str | None, num_labels: int, labels: Any) -> str | None:
    """``problem_type`` when set, else stock's choice from ``num_labels`` and ``labels.dtype``.

    Generated code assigns the result to ``config.problem_type``, as stock's first call with labels does.
    Under ``torch.fx.symbolic_trace`` the labels are a Proxy without a dtype: the config is left as it is
    (None) and the graph's :func:`classification_loss` chooses each time it runs.  torch.export's fake
    tensors have their dtype, so an exported program decides once, as stock's first call does.
    """
    if problem_type is not None or not isinstance(labels, torch.Tensor):
        return problem_type
    if num_labels == 1:
        return REGRESSION
    if num_labels > 1 and (labels.dtype == torch.long or labels.dtype == torch.int):
        return SINGLE_LABEL
    return MULTI_LABEL


def classification_loss(logits: torch.Tensor, labels: torch.Tensor, num_labels: int,
                        problem_type: str | None) -> torch.Tensor:
    """Stock's loss of ``logits`` against ``labels`` for ``problem_type`` (None: chosen from the labels' dtype).

    A ``problem_type`` stock does not know is refused (``ValueError``) where stock would return no loss.
    """
    chosen = problem_type_of(problem_type, num_labels, labels)
    if chosen == REGRESSION:
        if num_labels == 1:
            return F.mse_loss(logits.squeeze(), labels.squeeze())
        return F.mse_loss(logits, labels)
    if chosen == SINGLE_LABEL:
        return F.cross_entropy(logits.view(-1, num_labels), labels.view(-1))
    if chosen == MULTI_LABEL:
        return F.binary_cross_entropy_with_logits(logits, labels)
    raise ValueError(f"config.problem_type must be one of {', '.join(PROBLEM_TYPES)} or None, not {chosen!r}")
