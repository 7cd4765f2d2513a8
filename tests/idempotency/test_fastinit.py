"""The per-message dataclasses keep the ``__init__`` contract of a frozen dataclass:
same parameters, same stored values and defaults, still frozen."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any

import pytest

from idemp import Context, Message, Result
from idemp._fastinit import fast_frozen_init
from idemp.guards import Entered, Transition
from idemp.outcome import Outcome
from idemp.strategies.base import Job

PER_MESSAGE = [Message, Job, Context, Result, Transition, Entered]


def _reference(cls: type) -> type:
    """The same fields as a plain frozen dataclass: its generated ``__init__``."""
    spec = [(f.name, f.type, f) for f in dataclasses.fields(cls)]
    copies = [
        (name, kind, dataclasses.field(default=f.default, default_factory=f.default_factory))
        for name, kind, f in spec
    ]
    return dataclasses.make_dataclass(cls.__name__, copies, frozen=True, slots=True)


def _samples(cls: type) -> list[Any]:
    """A distinct value per field, so a value stored in the wrong slot shows."""
    return [object() for _ in dataclasses.fields(cls)]


@pytest.mark.parametrize("cls", PER_MESSAGE, ids=lambda c: c.__name__)
def test_same_parameters_as_the_generated_init(cls: type) -> None:
    ours = list(inspect.signature(cls).parameters.values())
    theirs = list(inspect.signature(_reference(cls)).parameters.values())
    assert [(p.name, p.kind) for p in ours] == [(p.name, p.kind) for p in theirs]
    for mine, ref in zip(ours, theirs):
        if ref.default is inspect.Parameter.empty:
            assert mine.default is inspect.Parameter.empty
        elif repr(ref.default) == "<factory>":
            assert repr(mine.default) == "<factory>"
        else:
            assert mine.default is ref.default


@pytest.mark.parametrize("cls", PER_MESSAGE, ids=lambda c: c.__name__)
def test_every_field_stored_positionally_and_by_name(cls: type) -> None:
    values = _samples(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    by_position = cls(*values)
    by_name = cls(**dict(zip(names, values)))
    for name, value in zip(names, values):
        assert getattr(by_position, name) is value
        assert getattr(by_name, name) is value
    assert by_position == by_name


@pytest.mark.parametrize("cls", PER_MESSAGE, ids=lambda c: c.__name__)
def test_defaults_as_the_generated_init_gives_them(cls: type) -> None:
    required = [
        f
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    values = _samples(cls)[: len(required)]
    ours = cls(*values)
    ref = _reference(cls)(*values)
    for f in dataclasses.fields(cls):
        assert getattr(ours, f.name) == getattr(ref, f.name), f.name


def test_still_frozen_and_replace_still_works() -> None:
    message = Message("T", b"body", properties={"UID": "k1"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        message.topic = "other"  # type: ignore[misc]
    moved = dataclasses.replace(message, topic="U")
    assert (moved.topic, moved.body, moved.properties) == ("U", b"body", {"UID": "k1"})
    result = Result(Outcome.PROCESSED, message, "k1")
    assert result.consume_result.value == "success"
    assert Message("T", b"").properties == {}


def test_a_factory_default_is_called_per_instance() -> None:
    @fast_frozen_init
    @dataclass(frozen=True, slots=True)
    class Holder:
        name: str
        items: list[int] = field(default_factory=list)

    a, b = Holder("a"), Holder("b")
    assert a.items == [] and a.items is not b.items
    assert Holder("c", [1]).items == [1]


def test_only_frozen_slotted_dataclasses_without_post_init() -> None:
    @dataclass(slots=True)
    class Loose:
        x: int

    @dataclass(frozen=True)
    class NoSlots:
        x: int

    @dataclass(frozen=True, slots=True)
    class Checked:
        x: int

        def __post_init__(self) -> None:
            pass

    @dataclass(frozen=True, slots=True)
    class KeywordOnly:
        x: int = field(kw_only=True)

    for cls in (Loose, NoSlots, Checked, KeywordOnly):
        with pytest.raises(TypeError):
            fast_frozen_init(cls)
