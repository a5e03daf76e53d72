"""Deliberately broken DUTs: named faults injected into this project's own stack.

A conformance case is only worth something if it can fail.  Each :class:`Fault` breaks one
behaviour of our stack the way a faulty implementation would, and names the cases that
must then FAIL (or WARN, or SKIP); the tests run the stack as the DUT in-process with the
fault applied and check that exactly those cases of the fault's scope change while the
rest keep their verdicts.

Where faults are applied (the documented points; nothing else is touched):

* :data:`ENGINE_FACTORY` -- ``stack.transport.cm.IwarpConnection``, the engine class the
  connection manager creates for every connection it listens for or opens.  The runner
  never uses the connection manager (its peer is :mod:`stack.conform.peer`, its model DUT
  :mod:`stack.conform.oracle` builds engines directly), so patching that one name breaks
  the DUT only, even with runner and DUT in one process.
* :data:`CONNECTION_FACTORY` -- ``stack.transport.cm.RdmaConnection``, the driver the
  connection manager builds around each engine and the application's queue pair: faults
  of the RNIC's checks patch that QP (its ``handle_event``, ``fatal``, ``ird`` and the
  ``_snapshot_reads`` step of RFC 5040 §5.5 ordering).  A DUT with faults receives by
  the event path only (its endpoint's ``bulk`` is off), where these points are.
* on each engine the DUT creates (:class:`~stack.wire.connection.IwarpConnection`): its
  public methods ``receive_data``, ``next_event``, ``data_to_send``, ``timer_deadline``,
  ``send_message`` and ``send_terminate``, its ``settings``, ``rfc7306`` and those of its
  MPA engine, and the startup rule tables that engine runs (``frame_rules``,
  ``reply_rules``: the runner's judge keeps the real ones of :mod:`stack.wire.mpa_rules`);
  once established, its stream's ``receive_ulpdu``, ``sequencer``, ``recv_state`` and
  ``send_state``; and three attributes of :class:`~stack.wire.mpa.MpaConnection` the wire
  core has no public switch for: the FPDU framer ``_framer`` and deframer ``_deframer``
  (their ``crc`` flags; the deframer's class, for its marker check) and the responder's
  hold buffer ``_held`` (MPA-25).
* ``stack.rnic.memory.StagTable.register`` (STag allocation, SEC-08); the model DUT's
  table overrides it, so only the DUT is affected.

:func:`injected` applies faults (and optional settings changes, e.g. short startup timers)
for the duration of a ``with`` block.  The faults of MPA startup and framing are in
:mod:`stack.conform.faults_mpa`, the rest below.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from stack.conform.faults_engine import (
    cause_swapped,
    data_after_terminate,
    dv_one,
    known_opcode,
    msn_unchecked,
    no_short_ulpdus,
    not_rfc7306,
    qn_of_opcode,
    read_header_missing,
    read_response_misplaced,
    reserved_checked,
    rv_one,
    single_segment_unchecked,
    stream_input,
    terminate_ignored,
)
from stack.conform.faults_model import Fault, turns
from stack.conform.faults_mpa import MPA_FAULTS
from stack.conform.faults_qp import (
    QpFault,
    align,
    always_swap,
    atomic_edit,
    atomics_dropped,
    invalidate_field_checked,
    invalidate_ignored,
    ird_unenforced,
    last_octet_refused,
    no_add_mask,
    partial_delivery,
    pd_ignored,
    read_responses_unchecked,
    reads_not_snapshotted,
    rights_ignored,
    sequential_register,
    streams_coupled,
    swallow,
    writes_dropped,
    zero_reads_validated,
    zero_writes_validated,
)
from stack.constants import (
    TERM_DDP_T_BASE_BOUNDS,
    TERM_DDP_T_INVALID_STAG,
    TERM_DDP_T_TO_WRAP,
    TERM_DDP_U_NO_BUFFER,
    TERM_DDP_U_TOO_LONG,
    TERM_RDMAP_BASE_BOUNDS,
    TERM_RDMAP_INVALID_STAG,
    TERM_RDMAP_TO_WRAP,
)
from stack.rnic.memory import MemoryRegion, StagTable
from stack.rnic.qp import QueuePair
from stack.wire.connection import IwarpConnection
from stack.wire.events import Role

__all__ = ["CONNECTION_FACTORY", "ENGINE_FACTORY", "FAULTS", "Fault", "QpFault", "injected"]

ENGINE_FACTORY = ("stack.transport.cm", "IwarpConnection")
"""(module, name) of the engine class the connection manager instantiates."""
CONNECTION_FACTORY = ("stack.transport.cm", "RdmaConnection")
"""(module, name) of the driver class the connection manager wraps engine and QP in."""


_DEREG = (MemoryRegion, "dereg", lambda self: None)
_SEQUENTIAL = (StagTable, "register", sequential_register)
_WRAP = {TERM_DDP_T_TO_WRAP: TERM_DDP_T_BASE_BOUNDS, TERM_RDMAP_TO_WRAP: TERM_RDMAP_BASE_BOUNDS}
_EXT_ALL = (
    "EXT-01",
    "EXT-02",
    "EXT-02.2",
    "EXT-02.3",
    "EXT-03",
    "EXT-04",
    "EXT-05",
    "EXT-06",
    "EXT-06.2",
    "EXT-06.3",
    "EXT-06.4",
    "EXT-08",
    "EXT-09",
    "EXT-09.2",
    "EXT-10",
    "EXT-11",
    "EXT-11.2",
    "EXT-11.3",
    "EXT-11.4",
)

FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        *MPA_FAULTS,
        # -- DDP ---------------------------------------------------------------------------
        Fault(
            "ddp-version-unchecked",
            "the DDP version is not checked (segments with DV != 1 are taken as DV 1)",
            turns("DDP-03.2", "DDP-03.3", "DDP-03.4", "DDP-03.5", "DDP-03.6", "DDP-03.8"),
            stream_input(dv_one),
            scope=("DDP-03",),
        ),
        Fault(
            "reserved-bits-checked",
            "reserved DDP or RDMAP control bits end the stream (they are not to be checked)",
            turns("DDP-03", "DDP-03.7", "RDMAP-02", "RDMAP-02.6"),
            stream_input(reserved_checked),
            scope=("DDP-03.2", "RDMAP-02.2"),
        ),
        Fault(
            "qn-unchecked",
            "an untagged segment's QN is not checked (each goes to its opcode's queue)",
            turns(
                "DDP-10",
                "DDP-10.2",
                "RDMAP-01",
                "RDMAP-01.2",
                "RDMAP-01.3",
                "RDMAP-01.4",
                "EXT-02.2",
            ),
            stream_input(qn_of_opcode),
            scope=("DDP-05", "EXT-02.3"),
        ),
        Fault(
            "msn-unchecked",
            "MSN, MO and the Last flag are not checked (RFC 5041 §4.3, §5.2)",
            turns(
                "DDP-05",
                "DDP-05.2",
                "DDP-05.3",
                "DDP-05.4",
                "DDP-05.5",
                "DDP-05.6",
                "DDP-06.2",
                "DDP-06.3",
                "DDP-02",
                "DDP-04",
                "DDP-04.2",
            ),
            msn_unchecked,
            scope=("DDP-06", "DDP-02.2", "RDMAP-04.2"),
        ),
        Fault(
            "partial-delivery",
            "each Send segment completes its receive, before the message's Last segment; Read "
            "Response segments without L are dropped",
            turns("DDP-02.2", "DDP-06", "RDMAP-04.9"),
            apply_qp=partial_delivery,
            scope=("DDP-05", "DDP-06.2", "RDMAP-04.5"),
        ),
        Fault(
            "short-ulpdus-dropped",
            "ULPDUs shorter than a DDP header are dropped instead of ending the stream",
            turns("MPA-01", "DDP-01"),
            stream_input(no_short_ulpdus),
            scope=("DDP-03.2",),
        ),
        Fault(
            "zero-writes-validated",
            "a zero-length RDMA Write's STag is validated (DDP-07: it is not)",
            turns("DDP-07", "DDP-07.2", "DDP-03.7", "RDMAP-02.6", "MPA-12.5", "MPA-15.5"),
            apply_qp=zero_writes_validated,
            scope=("DDP-03.5", "RDMAP-02.5", "RDMAP-02.7"),
        ),
        Fault(
            "terminate-then-data",
            "after a Terminate for an MSN error the DUT sends one more FPDU (RDMAP-10)",
            turns("DDP-05", "DDP-05.2", "DDP-05.3", "DDP-05.4", "DDP-05.5", "DDP-05.6"),
            data_after_terminate,
            scope=("DDP-06",),
        ),
        # -- tagged placement and the RNIC's checks -----------------------------------------
        Fault(
            "stag-unchecked",
            "accesses with an invalid STag (or one a Read Response does not match) are "
            "dropped silently",
            turns(
                "DDP-10.3",
                "RDMAP-16.6",
                "RDMAP-04.5",
                "RDMAP-04.10",
                "EXT-11",
                "DDP-10.8",
                "RDMAP-16.11",
            ),
            apply_qp=swallow(TERM_DDP_T_INVALID_STAG, TERM_RDMAP_INVALID_STAG),
            # SEC-06 keeps its verdict: rping's regions are reg_mr ones, which the stack does
            # not let the peer invalidate (RDMAP-09), so the case's Read never meets a revoked
            # STag; the invalidate-ignored fault is the one SEC-06 catches.
            scope=("DDP-10.4", "RDMAP-16.7", "RDMAP-09", "SEC-06"),
        ),
        Fault(
            "bounds-unchecked",
            "accesses outside the region are dropped silently (nothing placed, no Terminate)",
            turns(
                "DDP-10.4",
                "DDP-10.5",
                "RDMAP-16.7",
                "RDMAP-16.8",
                "SEC-04.2",
                "SEC-04.3",
                "SEC-15",
                "EXT-11.3",
                "DDP-10.9",
            ),
            apply_qp=swallow(TERM_DDP_T_BASE_BOUNDS, TERM_RDMAP_BASE_BOUNDS),
            app="kbtp",
            also=("rping-client",),
            scope=("DDP-10.6", "SEC-04"),
        ),
        Fault(
            "last-octet-refused",
            "a Read reaching the last octet of its region is refused (bounds off by one)",
            turns("SEC-04"),
            apply_qp=last_octet_refused,
            app="kbtp",
            scope=("SEC-04", "RDMAP-06"),
        ),
        Fault(
            "wrap-as-bounds",
            "a TO wrap is reported as a base or bounds violation",
            turns("DDP-10.6", "RDMAP-16.9", "EXT-11.4", status="WARN"),
            cause_swapped(_WRAP),
            app="bench",
            scope=("DDP-10.5", "EXT-11"),
        ),
        Fault(
            "pd-ignored",
            "an STag of another protection domain is used as if it were the stream's",
            turns("DDP-12", "SEC-01", "SEC-01.2"),
            apply_qp=pd_ignored,
            app="kbtp",
            scope=("SEC-06.2", "SEC-02"),
        ),
        Fault(
            "stale-stags-usable",
            "regions outlive their connection and protection domains are not checked",
            turns("DDP-12", "SEC-01", "SEC-01.2", "SEC-06.2"),
            apply_qp=pd_ignored,
            app="kbtp",
            patches=(_DEREG,),
            scope=("SEC-06",),
        ),
        Fault(
            "rights-ignored",
            "remote access rights are not checked",
            turns("DDP-10.7", "RDMAP-16.10", "EXT-11.2"),
            apply_qp=rights_ignored,
            app="kbtp",
            scope=("DDP-10.3", "RDMAP-16.6"),
        ),
        Fault(
            "read-response-misplaced",
            "Read Responses go 8 octets past the Sink TO the Read named",
            turns(
                "RDMAP-06",
                "RDMAP-06.2",
                "RDMAP-06.3",
                "RDMAP-06.4",
                "RDMAP-13",
                "EXT-08",
                "RDMAP-13.2",
                "RDMAP-05",
                "SEC-04",
            ),
            read_response_misplaced,
            app="bench",
            also=("kbtp", "rping-client"),
            scope=("RDMAP-07", "RDMAP-14.2"),
        ),
        Fault(
            "read-responses-unchecked",
            "Read Responses that match no outstanding Read are dropped silently",
            turns("RDMAP-04.5", "RDMAP-04.6", "RDMAP-04.7", "RDMAP-04.8", "RDMAP-04.10"),
            apply_qp=read_responses_unchecked,
            scope=("RDMAP-04",),
        ),
        Fault(
            "single-segment-unchecked",
            "Read Requests, Atomic Requests and Immediate Data are taken with any L and MO, "
            "and dropped when their header has the wrong length",
            turns(
                "RDMAP-04",
                "RDMAP-04.2",
                "RDMAP-04.3",
                "RDMAP-04.4",
                "EXT-02",
                "EXT-02.3",
                "EXT-09",
                "EXT-09.2",
            ),
            stream_input(single_segment_unchecked),
            scope=("RDMAP-04.9", "EXT-02.2"),
        ),
        Fault(
            "zero-reads-validated",
            "a zero-length Read Request's source STag is validated (RDMAP-07: it is not)",
            turns(
                "RDMAP-07",
                "RDMAP-07.2",
                "RDMAP-03.2",
                "RDMAP-14",
                "RDMAP-14.2",
                "RDMAP-07.3",
                "RDMAP-14.3",
            ),
            apply_qp=zero_reads_validated,
            scope=("RDMAP-07", "RDMAP-14", "RDMAP-03"),
        ),
        Fault(
            "ird-unenforced",
            "Read Requests beyond the negotiated IRD are served",
            turns("RDMAP-14", "RDMAP-14.3"),
            apply_qp=ird_unenforced,
            scope=("RDMAP-14", "RDMAP-06"),
        ),
        Fault(
            "reads-not-snapshotted",
            "a queued Read Response reads memory when it is sent, after later Writes (RFC 5040 "
            "§5.5)",
            turns("RDMAP-13.2"),
            apply_qp=reads_not_snapshotted,
            app="bench",
            scope=("RDMAP-13", "RDMAP-05"),
        ),
        Fault(
            "writes-dropped",
            "inbound RDMA Writes are taken and never placed",
            turns(
                "RDMAP-13",
                "RDMAP-13.2",
                "RDMAP-05",
                "EXT-06",
                "EXT-06.2",
                "EXT-06.3",
                "EXT-06.4",
                "EXT-08",
                "DDP-10.3",
                "DDP-10.4",
                "DDP-10.5",
                "DDP-10.6",
            ),
            apply_qp=writes_dropped,
            app="bench",
            scope=("DDP-10.7", "RDMAP-06"),
        ),
        # -- RDMAP ---------------------------------------------------------------------------
        Fault(
            "rdmap-version-unchecked",
            "the RDMAP version is not checked (RV != 1 taken as 1)",
            turns("RDMAP-02.2", "RDMAP-02.3", "RDMAP-02.4", "RDMAP-02.5", "RDMAP-02.11"),
            stream_input(rv_one),
            scope=("RDMAP-02",),
        ),
        Fault(
            "opcode-unchecked",
            "segments with an unassigned opcode, or one the T bit disagrees with, are dropped "
            "silently",
            turns(
                "RDMAP-16",
                "RDMAP-16.2",
                "RDMAP-16.3",
                "RDMAP-16.4",
                "RDMAP-16.5",
                "RDMAP-02.7",
                "RDMAP-02.8",
                "RDMAP-02.9",
                "RDMAP-02.10",
            ),
            stream_input(known_opcode),
            scope=("RDMAP-02.6", "RDMAP-16.6"),
        ),
        Fault(
            "invalidate-field-checked",
            "the Invalidate STag field of a plain Send is honoured, and a Read Request with it "
            "set ends the stream",
            turns("RDMAP-03", "RDMAP-03.2"),
            apply_qp=invalidate_field_checked,
            scope=("RDMAP-09",),
        ),
        Fault(
            "invalidate-ignored",
            "Send with Invalidate is taken as a plain Send: nothing checked or invalidated",
            turns("RDMAP-09", "SEC-06", "SEC-02"),
            apply_qp=invalidate_ignored,
            app="kbtp",
            scope=("RDMAP-03",),
        ),
        Fault(
            "too-long-as-no-buffer",
            "a Send longer than its receive is reported as 'no buffer available' (1/2/0x02)",
            turns("RDMAP-08", status="WARN"),
            cause_swapped({TERM_DDP_U_TOO_LONG: TERM_DDP_U_NO_BUFFER}),
            scope=("RDMAP-08", "MPA-02"),
        ),
        Fault(
            "no-buffer-as-too-long",
            "a Send that finds no receive is reported as 'too long' (1/2/0x05)",
            turns("RDMAP-08.2"),
            cause_swapped({TERM_DDP_U_NO_BUFFER: TERM_DDP_U_TOO_LONG}),
            scope=("RDMAP-08",),
        ),
        Fault(
            "terminate-ignored",
            "a received Terminate is ignored: the stream goes on",
            {
                **turns("RDMAP-10"),
                **turns(
                    "RDMAP-10.2",
                    "RDMAP-15",
                    "RDMAP-15.2",
                    "RDMAP-11",
                    "RDMAP-11.2",
                    "RDMAP-15.3",
                    status="WARN",
                ),
            },
            terminate_ignored,
            scope=("RDMAP-10", "RDMAP-15"),
        ),
        Fault(
            "read-header-missing",
            "Terminates about a Read Request leave out its copied header (R=0)",
            turns(
                "RDMAP-16.6",
                "RDMAP-16.7",
                "RDMAP-16.8",
                "RDMAP-16.9",
                "RDMAP-16.11",
                "RDMAP-16.12",
                status="WARN",
            ),
            read_header_missing,
            scope=("RDMAP-16.10", "RDMAP-06"),
        ),
        # -- RFC 7306 ------------------------------------------------------------------------
        Fault(
            "not-rfc7306",
            "the DUT does not implement RFC 7306 (opcodes 0x8-0xB unknown)",
            turns(*(c for c in _EXT_ALL if c not in ("EXT-04", "EXT-11.2")), status="SKIP"),
            not_rfc7306,
            app="bench",
            scope=("EXT",),
        ),
        Fault(
            "atomics-dropped",
            "Atomic Requests are taken and never run or answered",
            turns(*(c for c in _EXT_ALL if not c.startswith(("EXT-02", "EXT-09", "EXT-11.2")))),
            apply_qp=atomics_dropped,
            app="bench",
            scope=("EXT",),
        ),
        Fault(
            "atomic-misaligned",
            "an atomic to a TO not 8-octet aligned runs on the aligned word below it",
            {**turns("EXT-05"), **turns("EXT-11.4", status="WARN")},
            apply_qp=atomic_edit(align),
            app="bench",
            scope=("EXT-06", "EXT-11"),
        ),
        Fault(
            "atomic-mask-ignored",
            "FetchAdd ignores its Add Mask (a plain 64-bit add)",
            turns("EXT-06.4"),
            apply_qp=atomic_edit(no_add_mask),
            app="bench",
            scope=("EXT-06",),
        ),
        Fault(
            "cmp-swap-always",
            "Compare and Swap swaps whatever the comparison",
            turns("EXT-06.3"),
            apply_qp=atomic_edit(always_swap),
            app="bench",
            scope=("EXT-06",),
        ),
        # -- RFC 5042 ------------------------------------------------------------------------
        Fault(
            "stags-sequential",
            "STags are handed out one after the other (index + 1, key 0)",
            turns("SEC-08", status="WARN"),
            app="kbtp",
            patches=(_SEQUENTIAL,),
            scope=("SEC-01",),
        ),
        Fault(
            "streams-coupled",
            "when one connection ends, every other connection of the DUT is ended too",
            turns("SEC-09", "SEC-09.2", "SEC-02"),
            apply_qp=streams_coupled,
            app="kbtp",
            scope=("SEC-01", "SEC-06.2"),
        ),
    )
}
"""Every fault, by name."""


@contextmanager
def injected(*names: str, **settings: Any) -> Iterator[None]:
    """Apply the faults ``names`` (and :class:`~stack.wire.events.MpaSettings` changes
    ``settings``, e.g. ``request_timeout=1.0``) to every engine and queue pair the
    connection manager sets up inside the block; KeyError for an unknown fault."""
    faults = [FAULTS[n] for n in names]
    module = importlib.import_module(ENGINE_FACTORY[0])
    original = getattr(module, ENGINE_FACTORY[1])
    original_conn = getattr(module, CONNECTION_FACTORY[1])
    shared: dict[str, Any] = {}

    def factory(role: Role, engine_settings: Any = None, **kwargs: Any) -> IwarpConnection:
        if settings and engine_settings is not None:
            engine_settings = replace(engine_settings, **settings)
        engine = original(role, engine_settings, **kwargs)
        for fault in faults:
            if fault.apply is not None:
                fault.apply(engine)
        return engine

    def connection(stream: Any, engine: IwarpConnection, qp: QueuePair, **kwargs: Any) -> Any:
        for fault in faults:
            if fault.apply_qp is not None:
                fault.apply_qp(qp, engine, shared)
        conn = original_conn(stream, engine, qp, **kwargs)
        if faults:  # the fault points are on the event path: a faulty DUT takes it always
            conn.endpoint.bulk = False
        return conn

    saved = [(obj, name, getattr(obj, name)) for f in faults for obj, name, _ in f.patches]
    setattr(module, ENGINE_FACTORY[1], factory)
    setattr(module, CONNECTION_FACTORY[1], connection)
    for f in faults:
        for obj, name, value in f.patches:
            setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(module, ENGINE_FACTORY[1], original)
        setattr(module, CONNECTION_FACTORY[1], original_conn)
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)
