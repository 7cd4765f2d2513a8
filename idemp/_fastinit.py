"""A cheaper ``__init__`` for the frozen, slotted dataclasses built once per message.

A frozen dataclass's generated ``__init__`` sets each field through
``object.__setattr__`` (a global and an attribute lookup, then a generic call). Setting
through each slot's own descriptor does the same store for about half the cost:
``Message`` (18 fields) is built for every delivered message, and ``Job``, ``Context``,
``Result`` (and under a guard ``Transition`` and ``Entered``) for every handled one.
The class stays frozen: only ``__init__`` goes around ``__setattr__``, as the generated
one does.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


class _Factory:
    """The default of a field with a ``default_factory`` (shown as dataclasses do)."""

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()


def fast_frozen_init(cls: type[T]) -> type[T]:
    """Replace the ``__init__`` of a ``@dataclass(frozen=True, slots=True)`` class with
    one of the same parameters (names, order, defaults) that stores through the slots."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__} is not a frozen, slotted dataclass")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} has a __post_init__, which this __init__ would skip")
    space: dict[str, Any] = {"_FACTORY": _FACTORY}
    args: list[str] = []
    body: list[str] = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        name = f.name
        if f.kw_only or not f.init:
            raise TypeError(f"{cls.__name__}.{name}: keyword-only and init=False fields")
        space[f"_set_{name}"] = cls.__dict__[name].__set__
        if f.default is not dataclasses.MISSING:
            space[f"_default_{name}"] = f.default
            args.append(f"{name}=_default_{name}")
        elif f.default_factory is not dataclasses.MISSING:
            space[f"_factory_{name}"] = f.default_factory
            args.append(f"{name}=_FACTORY")
            body.append(f"    if {name} is _FACTORY:\n        {name} = _factory_{name}()")
        else:
            args.append(name)
        body.append(f"    _set_{name}(self, {name})")
    source = f"def __init__(self, {', '.join(args)}):\n" + "\n".join(body) + "\n"
    exec(source, space)  # noqa: S102 - built from the class's own field names only
    init = space["__init__"]
    generated = cls.__dict__["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__annotations__ = dict(generated.__annotations__)
    init.__doc__ = generated.__doc__
    setattr(cls, "__init__", init)  # noqa: B010 - mypy does not allow assigning a method
    return cls
