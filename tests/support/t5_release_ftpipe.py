"""The release worker's ``ftpipe`` check: a release's generated T5 under FTPipe's tracer semantics.

FTPipe's tracer (modelled by ``ftpipe_standin``) wraps every value, bakes branches and drops
every node the output does not depend on, so code that traces elsewhere can still record a
program that computes something else (an in-place update whose result nobody uses). Each case
traces one class and path, stateful or stateless, with and without padding, on a tiny
configuration, and runs the recorded program on the traced inputs and on fresh ones of the same
shape: both must be ``torch.equal`` to eager.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from support import ftpipe_standin
from support.t5_cases import CLASSES, PATHS, call_kwargs, inputs

FORMS = ("stateful", "stateless")
MASKS = {"masks": True, "no-masks": False}


def ftpipe_cases(build: Callable[[str, str], Any],  # a generated T5 model (make_stateless, not on nn.Module)
                 configs: tuple[str, ...]) -> Iterator[tuple[str, Callable[[], None]]]:
    """(case name, thunk) per class, path, configuration, form and masking; ``build(class, config)`` seeds."""
    for class_name in CLASSES:
        for path in PATHS[class_name]:
            for config_name in configs:
                for form in FORMS:
                    for mask_name, masks in MASKS.items():
                        def run(class_name: str = class_name, path: str = path, config_name: str = config_name,
                                form: str = form, masks: bool = masks) -> None:
                            model = build(class_name, config_name).eval()
                            if form == "stateless":
                                model.make_stateless()
                            _check(model, class_name, path, masks)
                        yield f"{class_name}/{path}/{config_name}/{form}/{mask_name}", run


def _check(model: torch.nn.Module, class_name: str, path: str, masks: bool) -> None:
    traced = call_kwargs(class_name, inputs(masks, seed=1), path)
    fresh = call_kwargs(class_name, inputs(masks, seed=2), path)
    graph = ftpipe_standin.trace(model, traced)
    for name, values in (("traced inputs", traced), ("fresh inputs", fresh)):
        expected = _eager(model, values)
        assert torch.equal(graph.run(**values), expected), f"the recorded program != eager on the {name}"


def _eager(model: torch.nn.Module, kwargs: dict[str, Any]) -> torch.Tensor:
    with torch.no_grad():
        return model(**kwargs)
