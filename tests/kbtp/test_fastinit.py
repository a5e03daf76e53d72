"""The per-operation shortcuts build what the plain constructors and encoders build.

:mod:`stack.fastinit` makes frozen dataclasses without their ``__init__``; the messages
encode the common requests and COMPLETIONs in one pack; ``with_request_id`` replaces
``dataclasses.replace``.  Each must give the same objects and octets as the slow path.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbtp.constants import TableFlag
from kbtp.formats import COMPLETION_BODY, DATA_DESCRIPTOR, HEADER
from kbtp.layout import (
    TableEntry,
    read_entry,
    read_entry_values,
    write_entry,
    write_entry_values,
)
from kbtp.messages import (
    AllocStore,
    Bind,
    CommonHeader,
    Completion,
    CompletionDescriptor,
    DataDescriptor,
    Free,
    Load,
    Request,
    RequestFlag,
    Store,
    with_request_id,
)
from kbtp.target_actions import ReadFromInitiator, SendMessage, WriteToInitiator
from stack.errors import LocalError
from stack.fastinit import maker, wr_maker
from stack.rnic import SendFlags, SendWR, Sge, WrOpcode

u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
u64 = st.integers(0, (1 << 64) - 1)


@pytest.mark.parametrize(
    ("cls", "values"),
    [
        (Completion, (1, 2, 3, 4, 5, 6, 7)),
        (DataDescriptor, (1, 2, 3)),
        (Load, (1, 2, DataDescriptor(1, 2, 3), 4, RequestFlag.NONE, None)),
        (Store, (1, 2, DataDescriptor(1, 2, 3), b"", 4, RequestFlag.SEAL, None)),
        (AllocStore, (1, 2, DataDescriptor(0, 0, 2), b"ab", 0, RequestFlag.INLINE, None)),
        (TableEntry, (TableFlag.VALID, 3, 4, 5)),
        (SendMessage, (1, Completion(1), None)),
        (ReadFromInitiator, (1, 2, 3, 4, 5, 6)),
        (WriteToInitiator, (1, 2, 3, 4, 5, 6)),
        (Sge, (1, 2, 3)),
    ],
)
def test_maker_builds_what_the_constructor_builds(cls: Any, values: tuple[object, ...]) -> None:
    made: object = maker(cls)(*values)
    plain = cls(*values)
    assert type(made) is cls
    assert made == plain
    assert hash(made) == hash(plain)
    assert [getattr(made, f.name) for f in dataclasses.fields(plain)] == list(values)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, dataclasses.fields(plain)[0].name, 1)  # still frozen


def test_maker_gives_the_constructor_back_where_it_cannot_build() -> None:
    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            if self.a < 0:
                raise ValueError("negative")

    @dataclasses.dataclass(slots=True)
    class Mutable:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Derived:
        a: int
        b: int = dataclasses.field(init=False, default=0)

    for cls in (NoSlots, Checked, Mutable, Derived):
        assert maker(cls) is cls
    with pytest.raises(ValueError):
        maker(Checked)(-1)  # the check still runs


def test_wr_maker_fills_the_defaults_and_the_fixed_fields() -> None:
    send = wr_maker(SendWR, ("inline_data",), opcode=WrOpcode.SEND, send_flags=SendFlags.NONE)
    assert send(b"xy") == SendWR(0, WrOpcode.SEND, inline_data=b"xy", send_flags=SendFlags.NONE)
    rdma = wr_maker(SendWR, ("wr_id", "opcode", "sg_list", "rkey", "remote_addr"))
    sge = (Sge(1, 2, 3),)
    want = SendWR(7, WrOpcode.RDMA_READ, sge, rkey=9, remote_addr=10)
    assert rdma(7, WrOpcode.RDMA_READ, sge, 9, 10) == want
    assert want.send_flags is SendFlags.SIGNALED  # the default, as the constructor's
    with pytest.raises(TypeError, match="no field"):
        wr_maker(SendWR, ("nonsense",))


def test_wr_maker_of_a_class_it_cannot_build_calls_the_constructor() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Listed:
        a: int
        items: list[int] = dataclasses.field(default_factory=list)

    make = wr_maker(Listed, ("a",))
    one, two = make(1), make(1)
    assert one == Listed(1) and one.items is not two.items


requests = st.one_of(
    st.builds(Load, u64, u64, st.builds(DataDescriptor, u32, u64, u32), u16),
    st.builds(
        Store,
        u64,
        u64,
        st.builds(DataDescriptor, u32, u64, u32),
        st.just(b""),
        u16,
        st.sampled_from([RequestFlag.NONE, RequestFlag.SEAL, RequestFlag.RECORD]),
        st.none() | st.builds(CompletionDescriptor, u32, u64),
    ),
    st.builds(
        AllocStore,
        u64,
        u64,
        st.just(DataDescriptor(0, 0, 3)),
        st.just(b"abc"),
        u16,
        st.just(RequestFlag.INLINE),
    ),
    st.builds(Free, u64, u64, u16),
    st.builds(Bind, u64, u64, u32, u32, u64, u16),
)


@settings(max_examples=200, deadline=None)
@given(requests, u64)
def test_with_request_id_is_replace(request: Request, rid: int) -> None:
    new = with_request_id(request, rid)
    assert type(new) is type(request)
    assert new == dataclasses.replace(request, request_id=rid)


def _parts(message: Load | Store | AllocStore) -> bytes:
    """A request's octets part by part, as the encoders did before the one-pack path."""
    header = CommonHeader(
        message.opcode, message.flags, message.request_id, message.handle, message.generation
    )
    tail = message.completion.encode() if message.completion is not None else b""
    data = bytes(message.data) if isinstance(message, Store | AllocStore) else b""
    return HEADER.pack(header) + DATA_DESCRIPTOR.pack(message.descriptor) + tail + data


@settings(max_examples=200, deadline=None)
@given(requests)
def test_one_pack_encoding_is_the_parts(request: Request) -> None:
    if isinstance(request, Load | Store | AllocStore):
        assert request.encode() == _parts(request)


@settings(max_examples=200, deadline=None)
@given(st.builds(Completion, u64, u64, u16, u16, u32, u64, st.integers(0, 255)))
def test_one_pack_completion_is_the_parts(completion: Completion) -> None:
    header = CommonHeader(
        completion.opcode,
        0,
        completion.request_id,
        completion.handle,
        completion.generation,
        completion.status,
    )
    assert completion.encode() == HEADER.pack(header) + COMPLETION_BODY.pack(completion)


def test_one_pack_falls_back_to_the_parts_for_their_error() -> None:
    with pytest.raises(LocalError, match="Data Descriptor field out of range"):
        Store(1, 2, DataDescriptor(1 << 32, 0, 0)).encode()
    with pytest.raises(LocalError, match="common header field out of range"):
        Load(1, 1 << 64, DataDescriptor(0, 0, 0)).encode()
    with pytest.raises(LocalError, match="COMPLETION field out of range"):
        Completion(1, data_length=1 << 32).encode()


def test_entry_values_are_the_entry() -> None:
    buf = memoryview(bytearray(32))
    entry = TableEntry(TableFlag.VALID | TableFlag.SEALED, 7, 100, 0x1000)
    write_entry(buf, 16, entry)
    assert read_entry_values(buf, 16) == (int(entry.flags), 7, 100, 0x1000)
    write_entry_values(buf, 0, int(TableFlag.VALID), 2, 3, 4)
    assert read_entry(buf, 0) == TableEntry(TableFlag.VALID, 2, 3, 4)
    assert read_entry(buf, 0).flags is TableFlag.VALID
