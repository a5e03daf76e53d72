"""Memory windows and fast registration: binding STags to buffers by work requests (SEC-05).

RFC 5040 §8.1.1(4)-(5) and RFC 5042 §6 ask for a way to bind an STag to a buffer, a TO range
and access rights, and to unbind it; verbs provide two on top of ``reg_mr``:

* **Memory windows** (``pd.alloc_mw(type)``): an STag over a range of an MR registered with
  :attr:`~stack.rnic.memory.Access.MW_BIND`, granting a subset of the MR's remote rights.
  A type 1 window is bound with the verb ``qp.bind_mw`` (``ibv_bind_mw``, the RNIC picks
  the new key) and serves every stream of its PD; a type 2 window is bound by a ``BIND_MW``
  work request carrying the consumer's new key and serves only the stream (QP) that bound
  it (DDP-12, SEC-02).  Every bind gives the STag a new key, so the STag of the previous
  bind is refused (SEC-06).  Type 2 windows are invalidated by ``LOCAL_INV`` or by the
  peer's Send with Invalidate (RDMAP-09), then bound again; type 1 windows are not
  invalidatable and are unbound by a zero-length bind.
* **Fast registration** (``pd.alloc_mr(max_len)``): an MR reserved in the invalid state; a
  ``REG_MR`` work request (:func:`execute_reg_mr`) gives it a buffer, rights and a new key,
  ``LOCAL_INV``, a Send with Invalidate or a Read with Invalidate makes it invalid again.

A window is checked like any STag (:func:`~stack.rnic.memory.check_remote_access`): its own
bounds and rights, its stream for type 2, its PD, and it works only while its MR is valid.
A failed bind or registration completes with ``MW_BIND_ERR`` ("memory management operation
error").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import IntEnum
from typing import Protocol

from stack.errors import LocalError
from stack.rnic.memory import (
    REMOTE_ACCESS,
    Access,
    MemoryOpError,
    MemoryRegion,
    ProtectionDomain,
    StagTarget,
    check_new_key,
)
from stack.rnic.verbs import BindMw, MwBindInfo, RegMr, SendFlags, SendWR, WcStatus, WrOpcode
from stack.wire.events import AtomicRequest

__all__ = ["MemoryWindow", "MwType", "execute_bind", "execute_reg_mr", "inc_rkey", "reg_mr_wr"]


def inc_rkey(rkey: int) -> int:
    """verbs' ``ibv_inc_rkey``: the same STag index with the next 8-bit key."""
    return (rkey & 0xFFFFFF00) | ((rkey + 1) & 0xFF)


def reg_mr_wr(
    mr: MemoryRegion,
    buffer: object,
    access: Access,
    *,
    wr_id: int = 0,
    send_flags: SendFlags = SendFlags.NONE,
) -> SendWR:
    """The ``REG_MR`` work request that fast-registers ``buffer`` in ``mr`` (from
    ``pd.alloc_mr``) with ``access`` and the next key (:func:`inc_rkey`); as with the kernel's
    ``ib_map_mr_sg`` and ``ib_update_fast_reg_key``, ``mr.rkey`` and ``mr.iova`` show the new
    STag and TO from now on (:meth:`~MemoryRegion.plan`), to be advertised at once."""
    key = inc_rkey(mr.rkey)
    mr.plan(buffer, access, key)
    return SendWR(
        wr_id, WrOpcode.REG_MR, send_flags=send_flags, reg_mr=RegMr(mr, buffer, access, key)
    )


class MwType(IntEnum):
    """``enum ibv_mw_type``."""

    TYPE_1 = 1
    TYPE_2 = 2


class MemoryWindow(StagTarget):
    """A memory window (``ibv_mw``): allocated unbound (invalid) by ``pd.alloc_mw``.

    While bound: ``mr``, ``addr`` (where the window starts in the MR's TO space), ``length``,
    ``access`` (remote rights) and ``base`` (the window's first TO: ``addr``, or 0 when
    bound :attr:`~Access.ZERO_BASED`); ``stream`` is the binding QP for type 2.
    """

    def __init__(self, pd: ProtectionDomain, type: int = 1) -> None:  # noqa: A002
        if type not in (1, 2):
            raise LocalError(f"alloc_mw: type must be 1 or 2, not {type!r}")
        self.type = MwType(type)
        self.kind = f"type {type} memory window"
        self.pd = pd
        self.stream = None
        self.mr: MemoryRegion | None = None
        self.addr = self.base = self.length = 0
        self.access = Access(0)
        self.access_bits = 0
        self.remote_invalidate = self.local_invalidate = self.type is MwType.TYPE_2
        self._bound = False
        self.stag = pd.table.register(self)

    @property
    def valid(self) -> bool:
        """Bound, not invalidated, and its MR still valid (SEC-06)."""
        return self._bound and self.mr is not None and self.mr.valid

    @valid.setter
    def valid(self, value: bool) -> None:
        self._bound = value

    def bind(
        self,
        qp: BindingQp,
        bind_info: MwBindInfo,
        *,
        wr_id: int = 0,
        send_flags: SendFlags = SendFlags.SIGNALED,
    ) -> int:
        """Bind this type 1 window through ``qp`` (``ibv_bind_mw``); returns the new rkey."""
        return qp.bind_mw(self, bind_info, wr_id=wr_id, send_flags=send_flags)

    def dealloc(self) -> None:
        """Free the window (``ibv_dealloc_mw``): its STag names nothing any more."""
        self._bound = False
        self.mr = None
        self.pd.table.unregister(self)

    def view(self, to: int, length: int) -> memoryview:
        assert self.mr is not None
        return self.mr.view(self.addr + to - self.base, length)

    def atomic(self, req: AtomicRequest) -> int:
        assert self.mr is not None
        return self.mr.atomic(replace(req, to=self.addr + req.to - self.base))

    def __repr__(self) -> str:
        state = f"len={self.length}" if self.valid else "invalid"
        return f"<MemoryWindow type {int(self.type)} stag=0x{self.stag:08x} {state}>"


class BindingQp(Protocol):
    """What :meth:`MemoryWindow.bind` needs of a QP (the verb ``bind_mw``)."""

    def bind_mw(
        self, mw: MemoryWindow, bind_info: MwBindInfo, *, wr_id: int, send_flags: SendFlags
    ) -> int: ...


@dataclass(frozen=True, slots=True)
class _VerbBind(BindMw):
    """A bind posted by the type 1 verb (``bind_mw``), not by a ``BIND_MW`` work request."""


def post_type1_bind(
    post: Callable[[SendWR], None],
    mw: MemoryWindow,
    bind_info: MwBindInfo,
    wr_id: int,
    send_flags: SendFlags,
) -> int:
    """The verb ``ibv_bind_mw``: post a bind of type 1 window ``mw`` with the next key through
    ``post`` (the QP's ``post_send``, so it runs in send-queue order); returns the new rkey."""
    if not isinstance(mw, MemoryWindow):
        raise LocalError(f"bind_mw: {type(mw).__name__} is not a memory window")
    if mw.type is not MwType.TYPE_1:
        raise LocalError("bind_mw binds type 1 windows; a type 2 one needs a BIND_MW work request")
    rkey = inc_rkey(mw.rkey)
    bind = _VerbBind(mw, rkey, bind_info)
    post(SendWR(wr_id, WrOpcode.BIND_MW, send_flags=send_flags, bind_mw=bind))
    mw.posted_rkey = rkey  # ibv_bind_mw updates mw->rkey as it posts
    return rkey


def _refuse(message: str) -> MemoryOpError:
    return MemoryOpError(WcStatus.MW_BIND_ERR, message)


def execute_bind(bind: BindMw | None, pd: ProtectionDomain, qp: object) -> None:
    """Execute a bind on ``qp`` of ``pd`` (SEC-05): the checks, then the window's new STag.

    Refused with ``MW_BIND_ERR``: no window or one of another PD; a type 1 window in a
    ``BIND_MW`` work request (the verb binds those); a type 2 window still bound; an STag
    that is not the window's index with a new key; an MR that is invalid, of another PD or
    registered without ``MW_BIND``; rights that are not remote ones or not the MR's; a
    range outside the MR.  A zero length unbinds the window.
    """
    if bind is None or not isinstance(bind.mw, MemoryWindow):
        raise _refuse("BIND_MW without a memory window")
    mw, info = bind.mw, bind.bind_info
    if mw.pd is not pd:
        raise _refuse(f"BIND_MW of window 0x{mw.stag:08x} of another PD")
    if mw.type is MwType.TYPE_1 and not isinstance(bind, _VerbBind):
        raise _refuse("a type 1 window is bound with bind_mw, not a BIND_MW work request")
    if mw.type is MwType.TYPE_2 and mw.valid:
        raise _refuse(f"type 2 window 0x{mw.stag:08x} is bound: invalidate it first")
    check_new_key(mw, bind.rkey, "BIND_MW")
    if info.length == 0:
        mw.pd.table.rekey(mw, bind.rkey)
        mw._bound, mw.mr, mw.stream = False, None, None
        return
    mr = info.mr
    if not isinstance(mr, MemoryRegion) or mr.pd is not pd or not mr.valid:
        raise _refuse("BIND_MW over a memory region that is not valid in this PD")
    if not mr.access & Access.MW_BIND:
        raise _refuse(f"memory region 0x{mr.stag:08x} was registered without MW_BIND")
    access = Access(info.mw_access_flags)
    if access & ~(REMOTE_ACCESS | Access.ZERO_BASED):
        raise _refuse(f"a window grants remote rights only, not {access!r}")
    beyond = access & REMOTE_ACCESS & ~mr.access
    if beyond:
        raise _refuse(f"the window's {beyond!r} is not granted by its memory region")
    if info.length < 0 or info.addr < mr.base or info.addr + info.length > mr.base + mr.length:
        raise _refuse(
            f"window [0x{info.addr:x}, +{info.length}) outside memory region "
            f"[0x{mr.base:x}, 0x{mr.base + mr.length:x})"
        )
    pd.table.rekey(mw, bind.rkey)
    mw.mr, mw.addr, mw.length = mr, info.addr, info.length
    mw.base = 0 if access & Access.ZERO_BASED else info.addr
    mw.access, mw.access_bits = access, int(access & REMOTE_ACCESS)
    mw.stream = qp if mw.type is MwType.TYPE_2 else None
    mw._bound = True


def execute_reg_mr(reg: RegMr | None, pd: ProtectionDomain) -> None:
    """Execute a ``REG_MR`` work request of a QP of ``pd`` (SEC-05; ``MW_BIND_ERR`` if refused,
    see :meth:`MemoryRegion.fast_register`)."""
    if reg is None or not isinstance(reg.mr, MemoryRegion):
        raise _refuse("REG_MR without a memory region")
    if reg.mr.pd is not pd:
        raise _refuse(f"REG_MR of STag 0x{reg.mr.stag:08x} of another PD")
    reg.mr.fast_register(reg.buffer, reg.access, reg.key)
