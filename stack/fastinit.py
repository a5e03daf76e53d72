"""Cheaper construction of the frozen, slotted dataclasses a data path makes per message.

A frozen dataclass's generated ``__init__`` stores each field by name through
``object.__setattr__`` (its own ``__setattr__`` refuses), which costs about twice what
storing through the slot's member descriptor costs.  The messages, receive events, work
requests and completions made for every operation (the stack's and KBTP's) are built
here the cheaper way, as the same objects: same type, equal, same hash, still frozen.

* :func:`slot_init`, a class decorator: an ``__init__`` with the dataclass's signature
  (defaults and ``default_factory`` as the dataclass gives them) that stores through the
  descriptors.  Every caller gains.
* :func:`maker`: a function of every field, positionally, that makes the object without
  calling ``__init__`` at all (a hot call site's own constructor).
* :func:`wr_maker`: the same for some fields, the others fixed or their defaults.

Only a frozen, slotted dataclass whose fields are all ``init`` fields and which has no
``__post_init__`` qualifies: :func:`slot_init` refuses any other class, :func:`maker` and
:func:`wr_maker` fall back to the class's own constructor.  The functions are generated
source, as :mod:`dataclasses` generates its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, Field, fields, is_dataclass
from typing import Any, TypeVar

__all__ = ["maker", "slot_init", "wr_maker"]

T = TypeVar("T")


def _slot_fields(cls: type) -> tuple[Field[Any], ...] | None:
    """The fields of ``cls`` if its objects can be built slot by slot, else None."""
    if not is_dataclass(cls) or hasattr(cls, "__post_init__"):
        return None
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        return None
    declared = fields(cls)
    if any(not f.init for f in declared):
        return None
    if {f.name for f in declared} != set(cls.__dict__["__slots__"]):
        return None
    return declared


def _generate(name: str, source: str, namespace: dict[str, Any], where: type) -> Any:
    exec(compile(source, f"<stack.fastinit {name} of {where.__qualname__}>", "exec"), namespace)  # noqa: S102
    return namespace[name]


def slot_init(cls: type[T]) -> type[T]:
    """Give ``cls`` an ``__init__`` of the same signature that stores its slots through
    their descriptors (a ``default_factory`` is called when its field is not given).
    Raises TypeError for a class that does not qualify (see the module)."""
    declared = _slot_fields(cls)
    if declared is None:
        raise TypeError(f"{cls.__qualname__} is not a frozen, slotted dataclass of init fields")
    namespace: dict[str, Any] = {"_FACTORY": _FACTORY}
    params, body = [], []
    for i, f in enumerate(declared):
        namespace[f"_set{i}"] = getattr(cls, f.name).__set__
        if f.default_factory is not MISSING:
            namespace[f"_factory{i}"] = f.default_factory
            params.append(f"{f.name}=_FACTORY")
            body.append(f"    _set{i}(self, _factory{i}() if {f.name} is _FACTORY else {f.name})\n")
            continue
        if f.default is MISSING:
            params.append(f.name)
        else:
            namespace[f"_default{i}"] = f.default
            params.append(f"{f.name}=_default{i}")
        body.append(f"    _set{i}(self, {f.name})\n")
    source = f"def __init__(self, {', '.join(params)}):\n{''.join(body) or '    pass'}\n"
    init = _generate("__init__", source, namespace, cls)
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    setattr(cls, "__init__", init)  # noqa: B010
    return cls


class _Factory:
    """The default of a ``default_factory`` field in a :func:`slot_init` ``__init__``."""

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()


def maker(cls: type[T]) -> Callable[..., T]:
    """A function of every field of ``cls``, positionally, returning ``cls(*values)``."""
    declared = _slot_fields(cls)
    if declared is None:
        return cls
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    for i, f in enumerate(declared):
        namespace[f"_set{i}"] = getattr(cls, f.name).__set__
    params = ", ".join(f"v{i}" for i in range(len(declared)))
    body = "".join(f"    _set{i}(obj, v{i})\n" for i in range(len(declared)))
    source = f"def make({params}):\n    obj = _new(_cls)\n{body}    return obj\n"
    made: Callable[..., T] = _generate("make", source, namespace, cls)
    made.__qualname__ = made.__name__ = f"make_{cls.__name__}"
    return made


def wr_maker(cls: type[T], varying: tuple[str, ...], **fixed: Any) -> Callable[..., T]:
    """A function of the fields named in ``varying``, positionally, returning
    ``cls(**dict(zip(varying, values)), **fixed)``: the other fields take their defaults
    (and ``fixed`` values), as the constructor gives them."""
    qualified = _slot_fields(cls)
    declared = {f.name: f for f in fields(cls)} if is_dataclass(cls) else {}
    unknown = [n for n in (*varying, *fixed) if n not in declared]
    if unknown:
        raise TypeError(f"{cls.__name__} has no field {unknown[0]!r}")
    if qualified is None or any(f.default_factory is not MISSING for f in declared.values()):

        def construct(*values: Any) -> T:
            return cls(**dict(zip(varying, values, strict=True)), **fixed)

        return construct
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    lines = []
    for i, f in enumerate(qualified):
        namespace[f"_set{i}"] = getattr(cls, f.name).__set__
        if f.name in varying:
            value = f"v{varying.index(f.name)}"
        else:
            if f.name not in fixed and f.default is MISSING:
                raise TypeError(f"{cls.__name__}.{f.name} has no default: name it in varying")
            namespace[f"_fixed{i}"] = fixed[f.name] if f.name in fixed else f.default
            value = f"_fixed{i}"
        lines.append(f"    _set{i}(obj, {value})\n")
    params = ", ".join(f"v{i}" for i in range(len(varying)))
    source = f"def make({params}):\n    obj = _new(_cls)\n{''.join(lines)}    return obj\n"
    made: Callable[..., T] = _generate("make", source, namespace, cls)
    made.__qualname__ = made.__name__ = f"make_{cls.__name__}"
    return made
