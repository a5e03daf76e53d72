"""How a chain reads its Refs and runs its local items (stack.rnic.chains): guards,
execution-time patches, LocalWrite and LocalAtomic, all through the QP's local SGE checks
(SEC-01..SEC-15) and the RNIC's atomic engine (EXT-05, EXT-07)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from stack.constants import ALL_ONES_64, ATOMIC_ALIGNMENT
from stack.rnic.chain_items import (
    RECV,
    RECV_LEN,
    RUN,
    RUN_SCRATCH,
    ChainItem,
    Check,
    Cmp,
    Guard,
    LocalAtomic,
    LocalWrite,
    Patch,
    PatchField,
    Ref,
)
from stack.rnic.qp_base import _LOCAL_WRITE, _LocalWrError
from stack.rnic.verbs import SendWR, Sge, WcStatus
from stack.wire.events import AtomicRequest

if TYPE_CHECKING:
    from stack.rnic.qp_send import QpSend

__all__ = ["Reader", "holds", "patched", "run_local"]

_BITS = {
    PatchField.REMOTE_ADDR: 64,
    PatchField.RKEY: 32,
    PatchField.SGE_ADDR: 64,
    PatchField.SGE_LENGTH: 32,
    PatchField.COMPARE_ADD: 64,
    PatchField.SWAP: 64,
    PatchField.INVALIDATE_RKEY: 32,
}


class Reader:
    """Reads Refs for one run, through the QP's local SGE checks."""

    def __init__(self, qp: QpSend, message: bytes | None) -> None:
        self.qp = qp
        self.message = message
        self.scratch = bytearray(RUN_SCRATCH)

    def run_view(self, addr: int, width: int) -> memoryview:
        """Octets of the run's scratch (LOC_LEN_ERR beyond it)."""
        if addr + width > RUN_SCRATCH:
            raise _LocalWrError(WcStatus.LOC_LEN_ERR, f"octets {addr}+{width} beyond the scratch")
        return memoryview(self.scratch)[addr : addr + width]

    def octets(self, ref: Ref) -> bytes:
        addr = _address(ref, self)
        if ref.lkey == RECV_LEN:
            assert self.message is not None  # checked at post
            return len(self.message).to_bytes(ref.width, ref.byteorder)
        if ref.lkey == RECV:
            assert self.message is not None
            if addr + ref.width > len(self.message):
                raise _LocalWrError(
                    WcStatus.LOC_LEN_ERR, f"octets {addr}+{ref.width} beyond the received message"
                )
            return self.message[addr : addr + ref.width]
        if ref.lkey == RUN:
            return bytes(self.run_view(addr, ref.width))
        return bytes(self.qp._local(Sge(addr, ref.width, ref.lkey), 0)[1])

    def value(self, ref: Ref) -> int:
        return int.from_bytes(self.octets(ref), ref.byteorder)


def holds(guard: Guard, read: Reader) -> bool:
    left = read.value(guard.left) & guard.mask
    right = (read.value(guard.right) if isinstance(guard.right, Ref) else guard.right) & guard.mask
    if guard.cmp is Cmp.EQ:
        return left == right
    if guard.cmp is Cmp.NE:
        return left != right
    if guard.cmp is Cmp.LE:
        return left <= right
    if guard.cmp is Cmp.LT:
        return left < right
    if guard.cmp is Cmp.GE:
        return left >= right
    return left == 0 or left == right


def patched(wr: SendWR, patches: list[Patch], read: Reader) -> SendWR:
    changes: dict[str, object] = {}
    sges = list(wr.sg_list)
    payload = bytearray(wr.inline_data) if wr.inline_data is not None else None
    for patch in patches:
        if patch.field is PatchField.PAYLOAD:
            assert payload is not None  # checked at post
            payload[patch.at : patch.at + patch.src.width] = read.octets(patch.src)
            continue
        value = (read.value(patch.src) + patch.add) & ((1 << _BITS[patch.field]) - 1)
        if patch.field is PatchField.SGE_ADDR:
            sges[patch.at] = dataclasses.replace(sges[patch.at], addr=value)
        elif patch.field is PatchField.SGE_LENGTH:
            sges[patch.at] = dataclasses.replace(sges[patch.at], length=value)
        else:
            changes[patch.field.value] = value
    if payload is not None:
        changes["inline_data"] = bytes(payload)
    return dataclasses.replace(wr, sg_list=tuple(sges), **changes)  # type: ignore[arg-type]


def _address(ref: Ref, read: Reader) -> int:
    if ref.index is None:
        return ref.addr
    return (ref.addr + ref.scale * read.value(ref.index)) & ALL_ONES_64


def run_local(item: ChainItem, read: Reader) -> bool:
    """Run a local item; False: a Check failed (the chain stops there)."""
    if isinstance(item, Check):
        return all(holds(g, read) for g in item.guards)
    if isinstance(item, LocalWrite):
        _local_write(item, read)
    elif isinstance(item, LocalAtomic):
        _local_atomic(item, read)
    return True


def _local_write(item: LocalWrite, read: Reader) -> None:
    """Run a LocalWrite through the checks of a local SGE with LOCAL_WRITE."""
    src = item.src
    if isinstance(src, bytes):
        data = src
    elif item.add:
        data = ((read.value(src) + item.add) % (1 << 8 * src.width)).to_bytes(
            src.width, src.byteorder
        )
    else:
        data = read.octets(src)
    dst = item.dst
    if dst.lkey == RUN:
        read.run_view(_address(dst, read), dst.width)[:] = data
        return
    _mr, view = read.qp._local(Sge(_address(dst, read), dst.width, dst.lkey), _LOCAL_WRITE)
    view[:] = data


def _local_atomic(item: LocalAtomic, read: Reader) -> None:
    """Run a LocalAtomic: both addresses checked (LOCAL_WRITE, bounds, alignment) before
    the atomic engine changes anything (EXT-05, EXT-07)."""
    qp = read.qp
    addr = _address(item.dst, read)
    out_addr = _address(item.result, read)
    mr, _view = qp._local(Sge(addr, 8, item.dst.lkey), _LOCAL_WRITE)
    if item.result.lkey == RUN:
        out = read.run_view(out_addr, 8)
    else:
        out = qp._local(Sge(out_addr, 8, item.result.lkey), _LOCAL_WRITE)[1]
    if (mr.addr + addr - mr.base) % ATOMIC_ALIGNMENT:
        raise _LocalWrError(WcStatus.LOC_PROT_ERR, f"atomic address 0x{addr:x} not 8-aligned")
    if item.swap is None:
        req = AtomicRequest.fetch_add(0, mr.stag, addr, item.add, item.mask)
    else:
        req = AtomicRequest.cmp_swap(0, mr.stag, addr, item.add, item.swap)
    out[:] = mr.atomic(req).to_bytes(8, item.result.byteorder)
