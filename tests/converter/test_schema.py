"""The one typed reader (common.schema): the types it reads, and each wording of a fault."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import pytest

from common.errors import UserError
from common.schema import FILE, Check, OptionError, PositiveInt, Proportion, Wording, parse_options, read, show_json

Pair = Annotated[tuple[str, int], Check("a [name, bytes] pair")]


@dataclass(frozen=True)
class Inner:
    size: PositiveInt


@dataclass(frozen=True)
class Record:
    mode: Literal["a", "b"] = "a"
    rate: float = 1.0
    share: Proportion | tuple[Proportion, ...] = 0.5
    pair: Pair | None = None
    inner: Inner | None = None
    names: tuple[str, ...] = ()


@pytest.mark.parametrize("values, message", [
    ({"rate": float("nan")}, "rate must be a finite number, got nan"),
    ({"rate": float("inf")}, "rate must be a finite number, got inf"),
    ({"mode": "c"}, "mode must be one of a, b, got 'c'"),
    ({"share": 1.5}, "share must be a number in (0, 1], got 1.5"),
    ({"share": [0.5, 0]}, "share[1] must be a number in (0, 1], got 0"),
    ({"pair": ["x", 1, 2]}, "pair must be a [name, bytes] pair, got ['x', 1, 2]"),
    ({"pair": ["x", "1"]}, "pair must be a [name, bytes] pair, got ['x', '1']"),
    ({"inner": {"size": True}}, "inner.size must be a positive integer, got True"),
    ({"inner": {"sise": 1}}, "unknown key 'inner.sise' (known there: size)"),
    ({"inner": {}}, "inner.size is missing"),
    ({"names": ["a", 3]}, "names[1] must be a string, got 3"),
    ({"nme": 1}, "unknown key 'nme' (known: inner, mode, names, pair, rate, share)"),
])
def test_a_fault_is_one_line_naming_the_key(values: dict, message: str) -> None:
    with pytest.raises(UserError) as raised:
        read(Record, values, "f.json")
    assert str(raised.value) == f"f.json: {message}"


def test_values_are_read_immutable_and_an_integer_is_a_number() -> None:
    record = read(Record, {"rate": 2, "share": [0.5, 1], "pair": ["x", 3], "names": ["a"]}, "f")
    assert record == Record(rate=2, share=(0.5, 1), pair=("x", 3), names=("a",))


def test_each_wording_of_one_fault() -> None:
    with pytest.raises(OptionError) as raised:
        parse_options(Record, {"mode": "c"})
    fault = raised.value
    assert str(fault) == "mode: expected one of a, b, not str 'c'"  # a recipe's transform options
    assert fault.render(FILE) == "mode must be one of a, b, got 'c'"
    assert fault.render(Wording(show=show_json)) == 'mode must be one of a, b, got "c"'
    with pytest.raises(OptionError) as raised:
        parse_options(Record, {"moed": "a"})
    assert str(raised.value).startswith("moed: unknown key (did you mean mode?); known: mode, rate")
    assert raised.value.render(Wording(unknown="{table} has an unknown field {name!r}")) == \
        "the top level has an unknown field 'moed'"
