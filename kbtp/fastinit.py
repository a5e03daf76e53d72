"""Positional constructors of frozen slotted dataclasses for the per-operation path.

A frozen dataclass's generated ``__init__`` stores each field through
``object.__setattr__`` (the class's own ``__setattr__`` refuses); for the messages, table
entries, actions and work requests made for every KBTP operation that detour is most of
what making one costs.  :func:`maker` returns a function that takes every field
positionally, in declaration order, and builds the same object -- same type, same field
values, equal to ``cls(*values)`` -- by storing each slot through its member descriptor.

A class it cannot build that way (not a slotted dataclass, a field with ``init=False``, a
``__post_init__``) gets ``cls`` itself back, so a maker is never less than the constructor.
:func:`wr_maker` does the same with some fields fixed (a work request's opcode and flags).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, fields, is_dataclass
from typing import Any, TypeVar

__all__ = ["maker", "wr_maker"]

T = TypeVar("T")


def _slot_names(cls: type) -> list[str] | None:
    """The init fields of ``cls`` in order if :func:`maker` can build it, else None."""
    if not is_dataclass(cls) or hasattr(cls, "__post_init__"):
        return None
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        return None
    declared = fields(cls)
    if any(not f.init for f in declared):
        return None
    names = [f.name for f in declared]
    if set(names) != set(cls.__dict__["__slots__"]):
        return None
    return names


def maker(cls: type[T]) -> Callable[..., T]:
    """A function of every field of ``cls``, positionally, returning ``cls(*values)``."""
    names = _slot_names(cls)
    if names is None:
        return cls
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    for i, name in enumerate(names):
        namespace[f"_set{i}"] = getattr(cls, name).__set__
    params = ", ".join(f"v{i}" for i in range(len(names)))
    body = "".join(f"    _set{i}(obj, v{i})\n" for i in range(len(names)))
    source = f"def make({params}):\n    obj = _new(_cls)\n{body}    return obj\n"
    exec(compile(source, f"<kbtp.fastinit maker of {cls.__qualname__}>", "exec"), namespace)
    made: Callable[..., T] = namespace["make"]
    made.__qualname__ = made.__name__ = f"make_{cls.__name__}"
    return made


def wr_maker(cls: type[T], varying: tuple[str, ...], **fixed: Any) -> Callable[..., T]:
    """A function of the fields named in ``varying``, positionally, returning
    ``cls(**dict(zip(varying, values)), **fixed)``: the other fields take their defaults
    (and ``fixed`` values), as the constructor gives them."""
    names = _slot_names(cls)
    declared = {f.name: f for f in fields(cls)} if is_dataclass(cls) else {}
    unknown = [n for n in (*varying, *fixed) if n not in declared]
    if unknown:
        raise TypeError(f"{cls.__name__} has no field {unknown[0]!r}")
    if names is None or any(f.default_factory is not MISSING for f in declared.values()):

        def construct(*values: Any) -> T:
            return cls(**dict(zip(varying, values, strict=True)), **fixed)

        return construct
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    lines = []
    for i, name in enumerate(names):
        namespace[f"_set{i}"] = getattr(cls, name).__set__
        if name in varying:
            value = f"v{varying.index(name)}"
        else:
            field = declared[name]
            if name not in fixed and field.default is MISSING:
                raise TypeError(f"{cls.__name__}.{name} has no default: name it in varying")
            namespace[f"_fixed{i}"] = fixed[name] if name in fixed else field.default
            value = f"_fixed{i}"
        lines.append(f"    _set{i}(obj, {value})\n")
    params = ", ".join(f"v{i}" for i in range(len(varying)))
    source = f"def make({params}):\n    obj = _new(_cls)\n{''.join(lines)}    return obj\n"
    exec(compile(source, f"<kbtp.fastinit wr_maker of {cls.__qualname__}>", "exec"), namespace)
    made: Callable[..., T] = namespace["make"]
    return made
