"""partition-model's argument parsing: one-line usage errors and typed numbers (no NaN, no infinity, no negatives)."""

from __future__ import annotations

import argparse
import math
from typing import NoReturn

from common.errors import UserError


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # argparse's own report is the whole usage text (18 lines) before the message.
        raise UserError(f"{message} ({self.prog} --help lists the options)")


def positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def count(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def positive_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
