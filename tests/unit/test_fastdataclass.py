"""wrapper.fastdataclass.dataclass behaves as dataclasses.dataclass for what the project uses."""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys
from dataclasses import field
from typing import Any

import pytest

from wrapper import fastdataclass as lean


def _pair(frozen: bool) -> list[type]:
    made = []
    for decorate in (dataclasses.dataclass(frozen=frozen), lean.dataclass(frozen=frozen)):
        @decorate
        class Point:
            x: int
            y: int = 2
            tags: list[str] = field(default_factory=list)
            note: str = field(default="", compare=False, repr=False)
            derived: int = field(default=0, init=False)

            def __post_init__(self) -> None:
                object.__setattr__(self, "derived", self.x + self.y)
        made.append(Point)
    return made


@pytest.mark.parametrize("frozen", [True, False])
def test_the_same_behaviour_as_dataclasses(frozen: bool) -> None:
    for cls in _pair(frozen):
        a = cls(1)
        b = cls(1, 2, ["t"], note="n")
        assert (a.x, a.y, a.tags, a.note, a.derived) == (1, 2, [], "", 3)
        assert cls(1, y=5).y == 5 and cls(x=4).derived == 6
        assert a != b and cls(1, tags=["t"], note="other") == b  # note is not compared
        assert a.tags is not cls(1).tags  # a fresh default each time
        assert repr(b) == f"{cls.__qualname__}(x=1, y=2, tags=['t'], derived=3)"
        assert dataclasses.replace(b, x=9).x == 9 and dataclasses.asdict(a)["y"] == 2
        assert [f.name for f in dataclasses.fields(cls)] == ["x", "y", "tags", "note",
                                                             "derived"]
        assert copy.deepcopy(b) == b and copy.copy(b) == b
        with pytest.raises(TypeError, match="missing"):
            cls()
        with pytest.raises(TypeError, match="unexpected keyword argument 'z'"):
            cls(1, z=3)
        with pytest.raises(TypeError, match="multiple values"):
            cls(1, x=2)
        with pytest.raises(TypeError, match="positional"):
            cls(1, 2, [], "", 5)  # derived is not an argument
        if frozen:
            one, same = (dataclasses.replace(cls(1), tags=("t",)) for _ in range(2))
            assert hash(one) == hash(same)
            with pytest.raises(dataclasses.FrozenInstanceError):
                a.x = 3
            with pytest.raises(dataclasses.FrozenInstanceError):
                del a.x
        else:
            with pytest.raises(TypeError):
                hash(a)
            a.x = 3
            assert a.x == 3


def test_a_subclass_adds_fields_after_its_base() -> None:
    @lean.dataclass(frozen=True)
    class Base:
        a: int = 0

    @lean.dataclass(frozen=True)
    class Child(Base):
        b: str = ""

    child = Child(1, "x")
    assert (child.a, child.b) == (1, "x") and child != Base(1) and Base(1) == Base(a=1)


def test_what_it_does_not_support_is_refused() -> None:
    decorate: Any = lean.dataclass
    with pytest.raises(TypeError, match="order"):
        decorate(order=True)
    with pytest.raises(TypeError, match="__slots__"):
        @decorate
        class Slotted:
            __slots__ = ("a",)
            a: int


def test_no_code_is_generated() -> None:
    """What makes it lean: no exec per class (dataclasses' would show as <string> code)."""
    program = ("import dataclasses, builtins\n"
               "calls = []\n"
               "real = builtins.exec\n"
               "def spy(*a, **k):\n"
               "    calls.append(1)\n"
               "    return real(*a, **k)\n"
               "dataclasses.exec = spy\n"
               "from wrapper.fastdataclass import dataclass\n"
               "@dataclass(frozen=True)\n"
               "class A:\n"
               "    x: int = 0\n"
               "print(len(calls), A(3).x)\n")
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["0", "3"]
