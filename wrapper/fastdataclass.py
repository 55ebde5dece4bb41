"""``dataclass`` for the hooks' start path: the standard decorator's behaviour, without
its code generation.

``dataclasses.dataclass`` writes each class's ``__init__``, ``__repr__``, ``__eq__`` and
frozen ``__setattr__`` as source text and ``exec``s it: about 0.6 ms per class on this
Python, so the ~70 records the prolog imports cost it about 35 ms of a ~110 ms run, more
than any work it does. This decorator lets ``dataclasses`` collect the fields (so
``dataclasses.fields``, ``asdict`` and ``replace`` work unchanged) and gives every class
the same few generic methods, written once here. Type checkers see the standard
decorator, so every constructor is still checked field by field.

Supported: ``frozen``, ``eq`` (default), ``field(default=..., default_factory=...,
init=..., repr=..., compare=...)`` and ``__post_init__``. Not supported (refused at
decoration): ``order``, ``slots``, ``kw_only`` and ``InitVar`` fields; use
``dataclasses.dataclass`` for those. ``tests/unit/test_fastdataclass.py`` holds the two to the
same behaviour.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dataclasses import dataclass as dataclass
else:
    def dataclass(cls=None, /, *, frozen=False, eq=True, **unsupported):
        if unsupported:
            raise TypeError(f"wrapper.fastdataclass.dataclass does not support "
                            f"{', '.join(sorted(unsupported))}: use dataclasses.dataclass")

        def wrap(target):
            return _process(target, frozen=frozen, eq=eq)

        return wrap if cls is None else wrap(cls)


# Per class: (name, init, default, default_factory) of each field, in order.
_SPECS: dict[type, tuple[tuple[str, bool, Any, Any], ...]] = {}


def _process(cls: Any, *, frozen: bool, eq: bool) -> Any:
    if "__slots__" in cls.__dict__:
        raise TypeError(f"{cls.__name__}: wrapper.fastdataclass.dataclass does not support "
                        "__slots__")
    documented = bool(cls.__dict__.get("__doc__"))
    if not documented:
        cls.__doc__ = cls.__name__  # dataclasses would ask inspect: twice the class's cost
    cls = dataclasses.dataclass(init=False, repr=False, eq=False)(cls)
    fields = dataclasses.fields(cls)
    if not documented:
        cls.__doc__ = f"{cls.__name__}({', '.join(f.name for f in fields if f.init)})"
    if any(isinstance(f.type, dataclasses.InitVar) or str(f.type).startswith("InitVar")
           for f in fields):
        raise TypeError(f"{cls.__name__}: wrapper.fastdataclass.dataclass does not support InitVar")
    _SPECS[cls] = tuple((f.name, f.init, f.default, f.default_factory) for f in fields)
    own = cls.__dict__
    if "__init__" not in own:
        cls.__init__ = _init
    if "__repr__" not in own:
        cls.__repr__ = _repr
    if eq and "__eq__" not in own:
        cls.__eq__ = _eq
        if frozen and "__hash__" not in own:
            cls.__hash__ = _hash
        elif "__hash__" not in own:
            cls.__hash__ = None  # as dataclasses: mutable and equal by value -> unhashable
    if frozen:
        for name in ("__setattr__", "__delattr__"):
            if name in own:
                raise TypeError(f"cannot overwrite {name} in frozen class {cls.__name__}")
        cls.__setattr__ = _frozen_setattr
        cls.__delattr__ = _frozen_delattr
    return cls


def _spec(cls: type) -> tuple[tuple[str, bool, Any, Any], ...]:
    spec = _SPECS.get(cls)
    if spec is None:  # a plain subclass of a decorated class: its fields are its base's
        spec = _SPECS[cls] = tuple((f.name, f.init, f.default, f.default_factory)
                                   for f in dataclasses.fields(cls))
    return spec


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    cls = self.__class__
    values = self.__dict__
    given = len(args)
    position = 0
    missing = dataclasses.MISSING
    for name, init, default, factory in _spec(cls):
        if init and position < given:
            if name in kwargs:
                raise TypeError(f"{cls.__name__}.__init__() got multiple values for "
                                f"argument {name!r}")
            values[name] = args[position]
            position += 1
        elif init and name in kwargs:
            values[name] = kwargs.pop(name)
        elif factory is not missing:
            values[name] = factory()
        elif default is not missing:
            values[name] = default
        elif init:
            raise TypeError(f"{cls.__name__}.__init__() missing 1 required argument: "
                            f"{name!r}")
    if position < given:
        raise TypeError(f"{cls.__name__}.__init__() takes {position + 1} positional "
                        f"arguments but {given + 1} were given")
    if kwargs:
        raise TypeError(f"{cls.__name__}.__init__() got an unexpected keyword argument "
                        f"{next(iter(kwargs))!r}")
    post_init = getattr(self, "__post_init__", None)
    if post_init is not None:
        post_init()


def _compared(self: Any) -> tuple[Any, ...]:
    return tuple(getattr(self, f.name) for f in dataclasses.fields(self) if f.compare)


def _eq(self: Any, other: object) -> Any:  # bool, or NotImplemented
    if other.__class__ is not self.__class__:
        return NotImplemented
    return bool(_compared(self) == _compared(other))


def _hash(self: Any) -> int:
    return hash(_compared(self))


def _repr(self: Any) -> str:
    shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}"
                      for f in dataclasses.fields(self) if f.repr)
    return f"{self.__class__.__qualname__}({shown})"


def _frozen_setattr(self: Any, name: str, value: Any) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self: Any, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
