"""medadapt.config.Section, the base of every recipe section: the non-finite check is linear in the distinct
values (an object shared many times, or a cycle, is walked once), integers beyond 64 bits are refused, and an
unknown key gets a did-you-mean from the section's own fields."""

from __future__ import annotations

import time
from typing import Any

import pytest
from pydantic import Field, ValidationError

from medadapt.config import Section, validate_each


class Holder(Section):
    values: list[Any] = Field(default_factory=list)
    count: int = 1
    ratio: float = 0.5


def _shared(levels: int) -> list:
    """9 ** (levels + 1) leaves when expanded, levels + 1 distinct lists."""
    node: list = [1.0] * 9
    for _ in range(levels):
        node = [node] * 9
    return node


@pytest.mark.parametrize("build, where", [
    (lambda: [_shared(7), [float("nan")]], "values[1][0]"),  # 43M leaves expanded, 9 distinct lists
    (lambda: [_shared(7), {"deep": [_shared(3), float("inf")]}], "values[1].deep[1]"),
], ids=["shared lists", "shared inside a dict"])
def test_a_shared_structure_is_walked_once(build, where):
    data = build()
    start = time.perf_counter()
    with pytest.raises(ValidationError) as info:
        Holder(values=data)
    assert time.perf_counter() - start < 1.0
    # errors(), not str(): pydantic's str() reprs the whole input, 43M leaves (the loader formats errors())
    assert [e["msg"] for e in info.value.errors()] == [f"Value error, {where} must be a finite number"]
    start = time.perf_counter()
    assert len(Holder(values=[_shared(7), [1.0]]).values) == 2
    assert time.perf_counter() - start < 1.0


def test_a_cycle_does_not_hang_or_overflow():
    loop: list = [1.0]
    loop.append(loop)
    assert Holder(values=[loop]).values[0] is not None
    loop.append(float("nan"))
    with pytest.raises(ValidationError, match=r"values\[0\]\[2\] must be a finite number"):
        Holder(values=[loop])


def test_a_very_deep_list_is_checked_without_recursion():
    deep: list = [float("nan")]
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(ValidationError, match="must be a finite number"):
        Holder(values=deep)


@pytest.mark.parametrize("value, ok", [(2**63 - 1, True), (2**63, False), (-(2**63), False), (10**30, False)])
def test_integers_beyond_64_bits_are_refused(value, ok):
    if ok:
        assert Holder(count=value).count == value
    else:
        with pytest.raises(ValidationError, match=rf"count is out of range \({len(str(abs(value)))} digits\)"):
            Holder(count=value)
    assert Holder(ratio=10**30).ratio == 1e30  # a float field takes a large integer as the float it is


@pytest.mark.parametrize("key, hint", [("valeus", "did you mean values?"), ("cnt", "did you mean count?"),
                                       ("zzz", "valid keys: values, count, ratio")])
def test_an_unknown_key_gets_a_did_you_mean(key, hint):
    with pytest.raises(ValidationError) as info:
        Holder(**{key: 1})
    (err,) = info.value.errors()
    assert (err["type"], err["loc"], err["msg"]) == ("unknown_key", (key,), f"unknown key ({hint})")


def test_other_errors_pass_through_unchanged_beside_an_unknown_key():
    with pytest.raises(ValidationError) as info:
        Holder(count="many", cnt=1)
    errors = {e["loc"]: (e["type"], e["msg"]) for e in info.value.errors()}
    assert errors == {("count",): ("int_parsing", ("Input should be a valid integer, unable to parse string as "
                                                   "an integer")),
                      ("cnt",): ("unknown_key", "unknown key (did you mean count?)")}


def test_validate_each_locates_every_items_errors_at_its_index():
    from medadapt.errors import ConfigError

    def section_of(item: dict) -> type[Section]:
        if item.get("kind") != "holder":
            raise ConfigError(f"unknown kind {item.get('kind')!r}")
        return HolderKind

    class HolderKind(Holder):
        kind: str = "holder"

    with pytest.raises(ValidationError) as info:
        validate_each([{"kind": "holder"}, {"kind": "holder", "cnt": 1}, [1], {"kind": "x"}], section_of, "thing")
    got = [(e["loc"], e["msg"]) for e in info.value.errors()]
    assert got == [((1, "cnt"), "unknown key (did you mean count?)"),
                   ((2,), "a thing is a mapping with a kind: key, not list"),
                   ((3, "kind"), "unknown kind 'x'")]
    assert validate_each("not a list", section_of, "thing") == "not a list"  # the field's own type check says so
