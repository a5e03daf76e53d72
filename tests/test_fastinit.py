"""stack.fastinit.slot_init: the dataclass's own constructor, cheaper, nothing else."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from stack.fastinit import slot_init
from stack.rnic.verbs import WcOpcode, WcStatus, WorkCompletion


def _plain_twin(cls: type) -> type:
    """The same dataclass with the generated ``__init__`` (no slot_init)."""
    return dataclasses.make_dataclass(
        cls.__name__,
        [(f.name, f.type, f) for f in dataclasses.fields(cls)],
        frozen=True,
        slots=True,
    )


def test_slot_init_keeps_signature_defaults_and_factories() -> None:
    @slot_init
    @dataclasses.dataclass(frozen=True, slots=True)
    class Point:
        x: int
        y: int = 7
        tags: list[int] = dataclasses.field(default_factory=list, compare=False)

    params = inspect.signature(Point.__init__).parameters
    assert list(params) == ["self", "x", "y", "tags"]
    a, b = Point(1), Point(1)
    assert (a.x, a.y, a.tags) == (1, 7, [])
    assert a.tags is not b.tags  # a fresh list per object, as the factory gives
    given: list[int] = [3]
    assert Point(2, y=5, tags=given).tags is given
    assert a == b and hash(a) == hash(b)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.x = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        Point()  # type: ignore[call-arg]


def test_work_completion_is_what_the_dataclass_would_build() -> None:
    twin = _plain_twin(WorkCompletion)
    args = (5, WcStatus.SUCCESS, WcOpcode.RDMA_WRITE, 3)
    ours, theirs = WorkCompletion(*args, byte_len=64), twin(*args, byte_len=64)
    assert dataclasses.astuple(ours) == dataclasses.astuple(theirs)
    assert WorkCompletion(*args).extra == {} and WorkCompletion(*args).extra is not (
        WorkCompletion(*args).extra
    )


@pytest.mark.parametrize("kind", ["unfrozen", "no slots", "post_init", "init=False"])
def test_slot_init_refuses_what_it_cannot_build(kind: str) -> None:
    if kind == "unfrozen":
        cls: type = dataclasses.dataclass(slots=True)(
            type("A", (), {"__annotations__": {"a": int}})
        )
    elif kind == "no slots":
        cls = dataclasses.dataclass(frozen=True)(type("A", (), {"__annotations__": {"a": int}}))
    elif kind == "post_init":

        @dataclasses.dataclass(frozen=True, slots=True)
        class Checked:
            a: int

            def __post_init__(self) -> None:
                pass

        cls = Checked
    else:

        @dataclasses.dataclass(frozen=True, slots=True)
        class Hidden:
            a: int = dataclasses.field(default=0, init=False)

        cls = Hidden
    with pytest.raises(TypeError, match="not a frozen, slotted dataclass"):
        slot_init(cls)
