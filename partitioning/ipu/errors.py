"""The one error type of the IPU target, and the lazy import of poptorch."""

from __future__ import annotations

import importlib
from types import ModuleType

from common.errors import UserError

POPTORCH_MISSING = ("poptorch is required to apply an IPU placement or build poptorch.Options; it ships only "
                    "with Graphcore's Poplar SDK (not on PyPI): install the SDK and its poptorch wheel, or use "
                    "the generated code and options file on a machine that has them")


class IPUError(UserError):
    """A placement PopTorch would reject, or an unusable IPU config: one line naming the fix, exit code 2."""


def require_poptorch() -> ModuleType:
    # Imported on use so that planning, validation and code generation work without the SDK.
    try:
        return importlib.import_module("poptorch")
    except ImportError:
        raise IPUError(POPTORCH_MISSING) from None
