"""The checks of ``post_chain`` (stack.rnic.chains): what a chain may do, before it is queued.

A verbs extension; what is refused here (a field its opcode lacks, an SGE or WR that is
not there, a payload outside the inline data, a receive Ref without WaitRecv, widths that
do not fit) is refused with LocalError and nothing is queued.  Every access that passes is
checked again at execution time like any local SGE (SEC-01..SEC-15).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stack.errors import LocalError
from stack.rnic.chain_items import (
    RECV,
    RECV_LEN,
    RUN,
    RUN_SCRATCH,
    Branch,
    Chain,
    Check,
    Guard,
    LocalAtomic,
    Patch,
    PatchField,
    Ref,
    WaitRecv,
)
from stack.rnic.verbs import SendWR, WrOpcode

if TYPE_CHECKING:
    from stack.rnic.qp_send import QpSend

__all__ = ["check_chain", "check_deferred"]

_MAX_REF = 4096  # octets one Ref may copy (a PAYLOAD patch)
_REMOTE_OPS = frozenset(
    {
        WrOpcode.RDMA_WRITE,
        WrOpcode.RDMA_WRITE_WITH_IMM,
        WrOpcode.RDMA_READ,
        WrOpcode.RDMA_READ_WITH_INV,
        WrOpcode.ATOMIC_FETCH_AND_ADD,
        WrOpcode.ATOMIC_CMP_AND_SWP,
    }
)
_ATOMICS = frozenset({WrOpcode.ATOMIC_FETCH_AND_ADD, WrOpcode.ATOMIC_CMP_AND_SWP})
_APPLIES = {
    PatchField.REMOTE_ADDR: _REMOTE_OPS,
    PatchField.RKEY: _REMOTE_OPS,
    PatchField.COMPARE_ADD: _ATOMICS,
    PatchField.SWAP: _ATOMICS,
    PatchField.INVALIDATE_RKEY: frozenset({WrOpcode.SEND_WITH_INV, WrOpcode.LOCAL_INV}),
}


def check_chain(qp: QpSend, chain: Chain) -> None:
    """Refuse (LocalError) what a chain may not do on ``qp``: the checks of ``post_chain``."""
    if isinstance(chain.wait, WaitRecv) and qp.srq is not None:
        raise LocalError("chains cannot WAIT on receives of a QP with an SRQ")
    if chain.key is not None:
        if chain.key.width > 8 or chain.key.lkey == RUN:
            raise LocalError(f"chain {chain.wr_id}: a key is at most 8 octets of memory")
        _check_ref(chain.key, chain)
    for branch in chain.branches:
        if sum(isinstance(i, SendWR) for i in branch.wrs) > qp.cap.max_send_wr:
            raise LocalError(f"chain {chain.wr_id}: a branch exceeds max_send_wr")
        refs: list[Ref] = [p.src for p in branch.patches]
        for item in branch.wrs:
            if isinstance(item, SendWR):
                qp._check_wr(item)
                continue
            if isinstance(item, Check):
                refs += _guard_refs(item.guards)
                continue
            if isinstance(item, LocalAtomic):
                refs += _atomic_refs(item, f"chain {chain.wr_id}")
                continue
            src = item.src
            if item.dst.lkey in (RECV, RECV_LEN):
                raise LocalError(f"chain {chain.wr_id}: a LocalWrite goes to an MR")
            if (len(src) if isinstance(src, bytes) else src.width) != item.dst.width:
                raise LocalError(f"chain {chain.wr_id}: LocalWrite widths differ")
            if item.add and (isinstance(src, bytes) or src.width > 8):
                raise LocalError(f"chain {chain.wr_id}: add needs a Ref of 8 octets at most")
            refs.append(item.dst)
            if isinstance(src, Ref):
                refs.append(src)
        refs += _guard_refs(branch.guards)
        for ref in refs:
            _check_ref(ref, chain)
        for patch in branch.patches:
            _check_patch(patch, branch, chain)


def check_deferred(item: LocalAtomic) -> None:
    """Refuse (LocalError) a LocalAtomic ``qp.post_deferred`` cannot run: there is no
    receive to read, and its Refs must fit as in a chain."""
    where = "a deferred LocalAtomic"
    for ref in _atomic_refs(item, where):
        _check_ref_in(ref, where, "it has no receive to read")


def _atomic_refs(item: LocalAtomic, where: str) -> list[Ref]:
    """A LocalAtomic's own checks; its Refs, to be checked as any."""
    if {item.dst.lkey, item.result.lkey} & {RECV, RECV_LEN} or item.dst.lkey == RUN:
        raise LocalError(f"{where}: a LocalAtomic works on MRs")
    if item.dst.width != 8 or item.result.width != 8:
        raise LocalError(f"{where}: LocalAtomic octets are 8 wide")
    return [item.dst, item.result]


def _guard_refs(guards: tuple[Guard, ...]) -> list[Ref]:
    out: list[Ref] = []
    for guard in guards:
        out.append(guard.left)
        if isinstance(guard.right, Ref):
            out.append(guard.right)
    return out


def _check_ref(ref: Ref, chain: Chain) -> None:
    no_recv = None if isinstance(chain.wait, WaitRecv) else "a receive Ref needs WaitRecv"
    _check_ref_in(ref, f"chain {chain.wr_id}", no_recv)


def _check_ref_in(ref: Ref, where: str, no_recv: str | None) -> None:
    """``ref`` checked for use in ``where``; ``no_recv``: why a receive Ref is refused
    there (None: it is not)."""
    if ref.uses_recv() and no_recv is not None:
        raise LocalError(f"{where}: {no_recv}")
    if not 1 <= ref.width <= _MAX_REF or ref.addr < 0:
        raise LocalError(f"{where}: Ref width must be 1..{_MAX_REF}")
    if ref.lkey == RUN and ref.index is None and ref.addr + ref.width > RUN_SCRATCH:
        raise LocalError(f"{where}: a run Ref beyond its {RUN_SCRATCH} octets")
    if ref.index is not None:
        if ref.index.width > 8:
            raise LocalError(f"{where}: an index Ref is at most 8 octets")
        _check_ref_in(ref.index, where, no_recv)


def _check_patch(patch: Patch, branch: Branch, chain: Chain) -> None:
    where = f"chain {chain.wr_id}: patch of WR {patch.wr}"
    if not 0 <= patch.wr < len(branch.wrs):
        raise LocalError(f"{where}: no such WR in its branch")
    wr = branch.wrs[patch.wr]
    if not isinstance(wr, SendWR):
        raise LocalError(f"{where}: a LocalWrite has no fields to patch")
    field = patch.field
    if field is PatchField.PAYLOAD:
        size = len(wr.inline_data) if wr.inline_data is not None else -1
        if patch.at < 0 or patch.at + patch.src.width > size:
            raise LocalError(f"{where}: PAYLOAD must fall inside the WR's inline data")
        return
    if patch.src.width > 8:
        raise LocalError(f"{where}: a value Ref is at most 8 octets")
    if field in (PatchField.SGE_ADDR, PatchField.SGE_LENGTH):
        if not 0 <= patch.at < len(wr.sg_list):
            raise LocalError(f"{where}: no SGE {patch.at}")
    elif wr.opcode not in _APPLIES[field]:
        raise LocalError(f"{where}: {field.value} does not apply to {wr.opcode.value}")
