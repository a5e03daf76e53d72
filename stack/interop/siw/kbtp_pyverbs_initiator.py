"""A KBTP initiator on rdma-core's pyverbs and librdmacm, run inside the siw guest.

Written from ``docs/kbtp.md`` alone (it imports nothing of this project): the second
implementation the document promises.  It reads a plan as JSON on stdin, connects to a
KBTP target over the guest's siw device, runs the plan's steps and writes one JSON document
on stdout: the HELLO_ACK and, per step, status, generation, data length, block offset and
the octets it verified.

Plan: ``{"host", "port", "identity", "capabilities", "timeout", "steps": [...]}``.  Steps
(``op``): ``load``, ``store``, ``alloc_store``, ``free``, ``bind``, ``raw`` (any octets as
one Send), ``direct_load`` (§6.6), ``batch`` (its ``steps`` sent together, at most Request
Credits outstanding, §9.2) and ``expect_disconnect`` (a request whose RDMA Read siw cannot
answer).  Data is :func:`pattern` of a step's ``seed``; ``slot`` picks the part of the data
region a request uses; ``mr: "fresh"`` uses a memory region of its own (for INVALIDATE).

Two siw behaviours shape the completion wait (docs/kbtp.md §6.8 item 13):

* when siw's transmit path fails a Read Response it sends a Terminate and closes TCP
  without flushing the QP: no completion ever arrives, only rdma_cm's DISCONNECTED event
  says so.  Every wait polls the CQ and the CM event channel together, with a deadline.
* siw's user-space completions never carry IBV_WC_WITH_INV, so a remote invalidation
  (§6.8 item 1) is not visible in the receive completion; the result reports ``wc_flags``.
"""

from __future__ import annotations

import json
import os
import select
import struct
import sys
import time
from typing import Any

# docs/kbtp.md §5.1 opcodes, §5.2 flags, §4.3 capabilities, §7 statuses, §3.2 table flags.
VERSION = 1
HELLO, HELLO_ACK, COMPLETION = 0x01, 0x02, 0x03
OPCODES = {"load": 0x10, "store": 0x11, "alloc_store": 0x12, "free": 0x13, "bind": 0x14}
FLAGS = {"INLINE": 0x01, "SEAL": 0x02, "RECORD": 0x04, "INVALIDATE": 0x08, "ALLOW_UNSEALED": 0x10}
CAP_DIRECT_LOAD, CAP_DIRECT_ALLOC, CAP_MASKED_FETCH_ADD = 0x1, 0x2, 0x8
VALID, SEALED = 0x0001, 0x0002
ALL_ONES_64 = (1 << 64) - 1
"""Block Offset of a COMPLETION that names no block (§5.8)."""
STATUS_NAMES = (
    "SUCCESS BAD_VERSION BAD_OPCODE MALFORMED BAD_FLAGS NOT_OFFERED NO_SESSION "
    "UNKNOWN_INITIATOR SESSION_EXISTS HANDLE_OUT_OF_RANGE WRONG_GENERATION NOT_VALID "
    "ALREADY_VALID SEALED NOT_SEALED TOO_LONG_FOR_BLOCK TOO_LONG_FOR_DESCRIPTOR "
    "INLINE_TOO_LONG NO_SPACE TICKET_ABANDONED BAD_BIND CREDIT_EXCEEDED "
    "REMOTE_ACCESS_ERROR TARGET_FAILURE IRD_ORD_TOO_LOW"
).split()

HEADER = struct.Struct(">BBHQQHH")  # §5.1: 24 octets
DESCRIPTOR = struct.Struct(">IQI")  # §5.2 Data Descriptor
BIND_BODY = struct.Struct(">IIQ")  # §5.7
COMPLETION_BODY = struct.Struct(">IB3xQ")  # §5.8
HELLO_BODY = struct.Struct(">IHH")  # §5.3
HELLO_ACK_BODY = struct.Struct(">IIIIQIIHBxIIIQQQIIQQQQII")  # §5.4: 120 octets
HELLO_ACK_FIELDS = (
    "capabilities block_size pool_size quota handle_base handle_count ticket_timeout "
    "credits ring_order max_inline table_stag pool_stag table_offset table_base_handle "
    "pool_offset ring_stag partition_stag ring_offset head_offset partition_offset "
    "partition_length head_stag table_entries"
).split()
ENTRY = struct.Struct(">HHIQ")  # §3.2 table entry
RECV_SIZE = 256
"""Receive buffers: ≥ 144 octets for HELLO_ACK (§4.1), ≥ 40 for COMPLETIONs (§9.2)."""
MAX_BLOCK = 1 << 20
"""Largest Block Size this initiator accepts (it sizes its buffers by it, §4.2)."""
PATTERN_PERIOD = 251


def pattern(seed: int, length: int) -> bytes:
    """The data of ``seed``: a byte sequence of prime period, so a shifted copy differs."""
    base = bytes((seed * 37 + i * 11 + (i * i >> 3)) & 0xFF for i in range(PATTERN_PERIOD))
    return (base * (length // PATTERN_PERIOD + 1))[:length]


def status_name(code: int) -> str:
    return STATUS_NAMES[code] if 0 <= code < len(STATUS_NAMES) else f"STATUS_{code}"


def flag_bits(flags: list[str] | int) -> int:
    if isinstance(flags, int):
        return flags
    bits = 0
    for name in flags:
        bits |= FLAGS[name]
    return bits


class Disconnected(Exception):
    """rdma_cm said DISCONNECTED (siw may close without flushing the QP)."""


class WaitTimeout(Exception):
    """Nothing arrived before the deadline."""


class QpError(Exception):
    """A work completion with an error status (a flushed or failed work request)."""


class Session:
    """One rdma_cm connection to the target with its QP, CQ and memory regions."""

    def __init__(self, plan: dict[str, Any]) -> None:
        import pyverbs.cm_enums as ce
        import pyverbs.enums as e
        from pyverbs.cmid import CMID, AddrInfo, CMEventChannel, ConnParam
        from pyverbs.cq import CQ
        from pyverbs.mr import MR
        from pyverbs.qp import QPCap, QPInitAttr

        self.e, self.ce, self.MR = e, ce, MR
        self.timeout = float(plan.get("timeout", 10.0))
        before = _fds_of("rdma_cm")
        self.channel = CMEventChannel()
        self.cm_fd = _new_fd(before, "rdma_cm")
        self.cmid = CMID(creator=self.channel, port_space=ce.RDMA_PS_TCP)
        ai = AddrInfo(dst=plan["host"], dst_service=str(plan["port"]), port_space=ce.RDMA_PS_TCP)
        self.cmid.resolve_addr(ai)
        self._expect_event(ce.RDMA_CM_EVENT_ADDR_RESOLVED)
        self.cmid.resolve_route()
        self._expect_event(ce.RDMA_CM_EVENT_ROUTE_RESOLVED)
        depth = int(plan.get("queue_depth", 64))
        self.cq = CQ(self.cmid.context, 4 * depth, None, None, 0)
        cap = QPCap(max_send_wr=depth, max_recv_wr=depth, max_send_sge=1, max_recv_sge=1)
        init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap)
        self.cmid.create_qp(init)
        self.access = (
            e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
        )
        self.recv_fifo: list[Any] = []
        self.send_fifo: list[Any] = []
        self.send_pool: dict[int, list[Any]] = {}
        self.reads_done = 0
        self.inbox: list[tuple[bytes, int]] = []
        self.wc_errors: list[str] = []
        for _ in range(int(plan.get("receives", 24))):  # §4.1 item 3: before HELLO
            self._post_recv(MR(self.cmid.pd, RECV_SIZE, e.IBV_ACCESS_LOCAL_WRITE))
        ird = int(plan.get("ird", 16))
        ord_ = int(plan.get("ord", 16))
        self.cmid.connect(ConnParam(resources=ird, depth=ord_))
        self._expect_event(ce.RDMA_CM_EVENT_ESTABLISHED)
        self.disconnected = False

    # ------------------------------------------------------------------ rdma_cm

    def _cm_event(self, timeout: float) -> int | None:
        """The next CM event type, or None if none arrives within ``timeout``."""
        from pyverbs.cmid import CMEvent

        ready, _, _ = select.select([self.cm_fd], [], [], timeout)
        if not ready:
            return None
        event = CMEvent(self.channel)
        kind = int(event.event_type)
        event.ack_cm_event()
        return kind

    def _expect_event(self, kind: int) -> None:
        got = self._cm_event(self.timeout)
        if got != kind:
            raise RuntimeError(f"rdma_cm: expected event {kind}, got {got} (None: timeout)")

    # ------------------------------------------------------------------ queues

    def _post_recv(self, mr: Any) -> None:
        self.cmid.post_recv(mr)
        self.recv_fifo.append(mr)

    def send(self, message: bytes) -> None:
        """Post ``message`` as one Send from a registered buffer of exactly its length."""
        pool = self.send_pool.setdefault(len(message), [])
        mr = pool.pop() if pool else self.MR(self.cmid.pd, len(message), self.access)
        mr.write(message, len(message))
        self.cmid.post_send(mr)
        self.send_fifo.append(mr)

    def read(self, mr: Any, length: int, addr: int, rkey: int) -> None:
        """RDMA Read ``length`` octets at (rkey, addr) into ``mr``; wait for it."""
        done = self.reads_done
        self.cmid.post_read(mr, length, addr, rkey, flags=self.e.IBV_SEND_SIGNALED)
        self.wait(lambda: self.reads_done > done)

    def poll(self) -> int:
        """Drain the CQ; return the number of completions handled."""
        e = self.e
        count = 0
        while True:
            n, wcs = self.cq.poll(16)
            if n <= 0:
                return count
            for wc in wcs[:n]:
                count += 1
                if wc.status != e.IBV_WC_SUCCESS:
                    self.wc_errors.append(f"opcode {wc.opcode} status {wc.status}")
                    raise QpError(f"work completion status {wc.status} (opcode {wc.opcode})")
                if wc.opcode == e.IBV_WC_RECV:
                    mr = self.recv_fifo.pop(0)
                    self.inbox.append((mr.read(wc.byte_len, 0), int(wc.wc_flags)))
                    self._post_recv(mr)
                elif wc.opcode == e.IBV_WC_SEND:
                    mr = self.send_fifo.pop(0)
                    self.send_pool.setdefault(mr.length, []).append(mr)
                elif wc.opcode == e.IBV_WC_RDMA_READ:
                    self.reads_done += 1

    def wait(self, done: Any, timeout: float | None = None) -> None:
        """Poll the CQ and the CM channel until ``done()``; Disconnected or WaitTimeout."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            self.poll()
            if done():
                return
            if self.disconnected:
                raise Disconnected("rdma_cm DISCONNECTED")
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout("no completion before the deadline")
            kind = self._cm_event(min(0.002, left))
            if kind is not None and kind in (
                self.ce.RDMA_CM_EVENT_DISCONNECTED,
                self.ce.RDMA_CM_EVENT_TIMEWAIT_EXIT,
            ):
                self.disconnected = True
                self.poll()
                raise Disconnected("rdma_cm DISCONNECTED")

    def receive(self, timeout: float | None = None) -> tuple[bytes, int]:
        self.wait(lambda: bool(self.inbox), timeout)
        return self.inbox.pop(0)

    def close(self) -> None:
        if self.disconnected:
            return
        try:
            self.cmid.disconnect()
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                if self._cm_event(0.1) == self.ce.RDMA_CM_EVENT_DISCONNECTED:
                    break
        except Exception:  # the peer may have gone first
            pass


def _fds_of(device: str) -> set[int]:
    """The open descriptors of ``/dev/infiniband/<device>``."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == f"/dev/infiniband/{device}":
                found.add(int(name))
        except OSError:  # the descriptor of the listing itself
            continue
    return found


def _new_fd(before: set[int], device: str) -> int:
    """The descriptor the CM event channel opened (pyverbs does not expose it)."""
    new = _fds_of(device) - before
    if len(new) != 1:
        raise RuntimeError(f"want one new /dev/infiniband/{device} descriptor, got {new}")
    return new.pop()


def header(opcode: int, flags: int, request_id: int, handle: int, gen: int, st: int = 0) -> bytes:
    return HEADER.pack(VERSION, opcode, flags, request_id, handle, gen, st)


def parse_hello_ack(data: bytes) -> dict[str, Any]:
    """The fields of a HELLO_ACK (§5.4), with its header's Request ID and Status."""
    if len(data) != HEADER.size + HELLO_ACK_BODY.size:
        raise RuntimeError(f"HELLO_ACK of {len(data)} octets (want 144)")
    ver, op, _flags, rid, _h, _g, st = HEADER.unpack_from(data)
    if ver != VERSION or op != HELLO_ACK:
        raise RuntimeError(f"not a HELLO_ACK: {data[:24].hex()}")
    body = HELLO_ACK_BODY.unpack_from(data, HEADER.size)
    ack = dict(zip(HELLO_ACK_FIELDS, body, strict=True))
    ack.update(status=st, status_name=status_name(st), request_id=rid)
    return ack


def parse_completion(data: bytes, wc_flags: int = 0) -> dict[str, Any]:
    """The fields of a COMPLETION (§5.8) and the receive completion's flags."""
    if len(data) != HEADER.size + COMPLETION_BODY.size:
        raise RuntimeError(f"COMPLETION of {len(data)} octets: {data[:48].hex()}")
    ver, op, _f, rid, handle, gen, st = HEADER.unpack_from(data)
    length, req_op, block = COMPLETION_BODY.unpack_from(data, HEADER.size)
    if ver != VERSION or op != COMPLETION:
        raise RuntimeError(f"not a COMPLETION: {data[:24].hex()}")
    return {
        "request_id": rid,
        "handle": handle,
        "generation": gen,
        "status": st,
        "status_name": status_name(st),
        "data_length": length,
        "request_opcode": req_op,
        "block_offset": block,
        "wc_flags": wc_flags,
    }


class Initiator:
    """KBTP over one :class:`Session`: HELLO, requests within the credits, COMPLETIONs."""

    def __init__(self, session: Session, plan: dict[str, Any]) -> None:
        self.s = session
        self.plan = plan
        self.next_id = 1
        self.ack: dict[str, Any] = {}
        self.region: Any = None
        self.fresh: list[Any] = []
        self.outstanding: dict[int, dict[str, Any]] = {}

    # ------------------------------------------------------------------ §4.2

    def hello(self) -> dict[str, Any]:
        ident = self.plan["identity"].encode()
        caps = int(self.plan.get("capabilities", 0))
        rid = self._rid()
        self.s.send(header(HELLO, 0, rid, 0, 0) + HELLO_BODY.pack(caps, len(ident), 0) + ident)
        data, _ = self.s.receive()
        ack = parse_hello_ack(data)
        st = ack["status"]
        if ack["request_id"] != rid:
            raise RuntimeError(f"not the HELLO_ACK of our HELLO: {data[:24].hex()}")
        if st == 0:
            self._check_ack(ack, caps)
        self.ack = ack
        return ack

    def _check_ack(self, ack: dict[str, Any], asked: int) -> None:
        """What §4.2 says an initiator checks before it trusts the parameters."""
        if ack["capabilities"] & ~asked or ack["capabilities"] & 0x4:
            raise RuntimeError(f"granted capabilities {ack['capabilities']:#x} not asked")
        if not 1 <= ack["block_size"] <= MAX_BLOCK or ack["credits"] < 1:
            raise RuntimeError(f"unusable HELLO_ACK {ack}")
        if ack["quota"] > ack["pool_size"]:
            raise RuntimeError("quota beyond the pool")
        if ack["capabilities"] & CAP_DIRECT_LOAD:
            base, entries = ack["table_base_handle"], ack["table_entries"]
            first, count = ack["handle_base"], ack["handle_count"]
            if not (base <= first and first + count <= base + entries):
                raise RuntimeError("the table does not hold our handle range")

    def _rid(self) -> int:
        rid = self.next_id
        self.next_id += 1
        return rid

    # ------------------------------------------------------------------ memory

    def data_region(self) -> Any:
        """One region of ``credits`` blocks for descriptors (read and written by the target)."""
        if self.region is None:
            size = self.ack["block_size"] * max(self.ack["credits"], 1) * 2
            self.region = self.s.MR(self.s.cmid.pd, size, self.s.access)
        return self.region

    def buffer_for(self, step: dict[str, Any]) -> tuple[Any, int]:
        """(memory region, byte offset in it) of a step's data."""
        if step.get("mr") == "fresh":
            mr = self.s.MR(self.s.cmid.pd, self.ack["block_size"], self.s.access)
            self.fresh.append(mr)
            return mr, 0
        if step.get("mr") == "last_fresh":
            return self.fresh[-1], 0
        return self.data_region(), int(step.get("slot", 0)) * self.ack["block_size"]

    # ------------------------------------------------------------------ requests

    def build(self, step: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
        """The request of ``step`` (§5.5-§5.7) and what to check on its COMPLETION."""
        op = step["op"]
        if op == "raw":  # its own Request ID, octets 4-11, is the one answered
            data = bytes.fromhex(step["hex"])
            return data, {"step": step, "request_id": int.from_bytes(data[4:12], "big")}
        rid = self._rid()
        flags = flag_bits(step.get("flags", []))
        handle, gen = int(step["handle"]), int(step.get("gen", 0))
        ctx: dict[str, Any] = {"step": step, "request_id": rid}
        opcode = OPCODES[op]
        status_field = int(step.get("status_field", 0))
        head = header(opcode, flags, rid, handle, gen, status_field)
        record = b"\0" * 16 if step.get("record") else b""  # §5.2 Completion Descriptor
        if op == "free":
            return head + record, ctx
        if op == "bind":
            body = BIND_BODY.pack(int(step["ticket"]), int(step["length"]), int(step["block"]))
            return head + body + record, ctx
        mr, offset = self.buffer_for(step)
        ctx["mr"], ctx["offset"] = mr, offset
        if op == "load":
            length = int(step.get("desc_len", self.ack["block_size"]))
            room = min(length, mr.length - offset)
            mr.write(b"\0" * room, room, offset)
            return head + DESCRIPTOR.pack(mr.rkey, mr.buf + offset, length) + record, ctx
        length = int(step["length"])
        data = pattern(int(step.get("seed", 0)), length)
        if flags & FLAGS["INLINE"]:
            stag = int(step.get("inline_stag", 0))
            return head + DESCRIPTOR.pack(stag, 0, length) + record + data, ctx
        mr.write(data, length, offset)
        return head + DESCRIPTOR.pack(mr.rkey, mr.buf + offset, length) + record, ctx

    def finish(self, ctx: dict[str, Any], comp: dict[str, Any]) -> dict[str, Any]:
        """A step's result: the COMPLETION checked against its request (§4.2, §6.8 item 7)."""
        step = ctx["step"]
        result = {"name": step.get("name", step["op"]), "op": step["op"], **comp}
        if "mr" in ctx:
            result["desc_stag"] = int(ctx["mr"].rkey)
        if step["op"] != "raw":
            echoed = (
                comp["handle"] == int(step["handle"])
                and comp["request_opcode"] == OPCODES[step["op"]]
            )
            result["echo_ok"] = echoed
        if step["op"] == "load" and comp["status"] == 0:
            expect = pattern(int(step.get("seed", 0)), comp["data_length"])
            got = ctx["mr"].read(comp["data_length"], ctx["offset"]) if comp["data_length"] else b""
            result["bytes_verified"] = comp["data_length"] if got == expect else 0
            result["data_ok"] = got == expect and comp["data_length"] == int(
                step.get("length", comp["data_length"])
            )
        return result

    def run_batch(self, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Send ``steps`` keeping up to Request Credits outstanding (§9.2); results in order."""
        credits = min(int(self.ack["credits"]), len(self.s.recv_fifo))  # §4.2
        pending = list(steps)
        results: dict[int, dict[str, Any]] = {}
        order: list[int] = []
        peak = 0
        while pending or self.outstanding:
            while pending and len(self.outstanding) < credits:
                message, ctx = self.build(pending.pop(0))
                self.s.send(message)
                self.outstanding[ctx["request_id"]] = ctx
                order.append(ctx["request_id"])
                peak = max(peak, len(self.outstanding))
            data, wc_flags = self.s.receive()
            comp = parse_completion(data, wc_flags)
            if comp["request_id"] not in self.outstanding:
                raise RuntimeError(f"COMPLETION for no outstanding request: {comp}")
            done = self.outstanding.pop(comp["request_id"])
            results[comp["request_id"]] = self.finish(done, comp)
        out = [results[r] for r in order]
        for r in out:
            r["peak_outstanding"] = peak
        return out

    # ------------------------------------------------------------------ §6.6

    def direct_load(self, step: dict[str, Any]) -> dict[str, Any]:
        """Entry, block, entry again, each after the previous Read completed (§6.6)."""
        ack = self.ack
        if not ack["capabilities"] & CAP_DIRECT_LOAD:
            return {"name": step.get("name", "direct_load"), "op": "direct_load", "refused": True}
        handle = int(step["handle"])
        base, entries = ack["table_base_handle"], ack["table_entries"]
        if not base <= handle < base + entries:  # §6.6: never read outside the table
            return {"name": step.get("name", "direct_load"), "op": "direct_load", "refused": True}
        addr = ack["table_offset"] + 16 * (handle - base)
        first = self.s.MR(self.s.cmid.pd, ENTRY.size, self.s.access)
        again = self.s.MR(self.s.cmid.pd, ENTRY.size, self.s.access)
        self.s.read(first, ENTRY.size, addr, ack["table_stag"])
        flags, gen, length, block = ENTRY.unpack(first.read(ENTRY.size, 0))
        result: dict[str, Any] = {
            "name": step.get("name", "direct_load"),
            "op": "direct_load",
            "entry_flags": flags,
            "generation": gen,
            "data_length": length,
            "block_offset": block,
        }
        if flags & (VALID | SEALED) != VALID | SEALED or length > ack["block_size"]:
            result.update(valid=False, bytes_verified=0)
            return result
        data = b""
        if length:
            mr = self.s.MR(self.s.cmid.pd, length, self.s.access)
            self.s.read(mr, length, block, ack["pool_stag"])
            data = mr.read(length, 0)
        self.s.read(again, ENTRY.size, addr, ack["table_stag"])
        same = again.read(ENTRY.size, 0) == first.read(ENTRY.size, 0)
        ok = same and data == pattern(int(step.get("seed", 0)), length)
        result.update(valid=same, entries_identical=same, bytes_verified=length if ok else 0)
        result["data_ok"] = ok and length == int(step.get("length", length))
        return result

    # ------------------------------------------------------------------ steps

    def run_step(self, step: dict[str, Any]) -> list[dict[str, Any]]:
        op = step["op"]
        if op == "batch":
            return self.run_batch(step["steps"])
        if op == "direct_load":
            return [self.direct_load(step)]
        if op == "expect_disconnect":
            return [self.expect_disconnect(step)]
        return self.run_batch([step])

    def expect_disconnect(self, step: dict[str, Any]) -> dict[str, Any]:
        """Send a request and wait: a COMPLETION, a flushed QP, or only DISCONNECTED."""
        inner = dict(step, op=step["request"])
        message, ctx = self.build(inner)
        self.s.send(message)
        t0 = time.monotonic()
        result: dict[str, Any] = {"name": step.get("name", "expect_disconnect"), "op": op_of(step)}
        if "mr" in ctx:
            result["desc_stag"] = int(ctx["mr"].rkey)
        try:
            data, wc_flags = self.s.receive(float(step.get("timeout", self.s.timeout)))
            result.update(outcome="completion", **parse_completion(data, wc_flags))
        except Disconnected:
            result.update(outcome="disconnected")
        except QpError as exc:
            result.update(outcome="flushed", error=str(exc))
        except WaitTimeout:
            result.update(outcome="timeout")
        result["seconds"] = round(time.monotonic() - t0, 3)
        # after DISCONNECTED siw leaves the QP unflushed: posted receives stay posted.
        try:
            result["completions_after"] = self.s.poll()
        except QpError as exc:
            result["completions_after"] = -1
            result["error_after"] = str(exc)
        result["receives_posted"] = len(self.s.recv_fifo)
        return result


def op_of(step: dict[str, Any]) -> str:
    return f"expect_disconnect/{step['request']}"


def run(plan: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"results": [], "error": None}
    t0 = time.monotonic()
    session = None
    try:
        session = Session(plan)
        out["connected"] = True
        init = Initiator(session, plan)
        out["hello_ack"] = init.hello()
        if out["hello_ack"]["status"] == 0:
            for step in plan.get("steps", []):
                out["results"].extend(init.run_step(step))
                if session.disconnected:
                    break
    except (Disconnected, WaitTimeout, QpError, RuntimeError, OSError) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # pyverbs errors: report, never hang
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if session is not None:
            out["wc_errors"] = session.wc_errors
            out["disconnected"] = session.disconnected
            session.close()
    out["seconds"] = round(time.monotonic() - t0, 3)
    return out


def main() -> None:
    try:
        plan = json.loads(sys.stdin.read())
        for key in ("host", "port", "identity"):
            if key not in plan:
                raise ValueError(f"the plan has no {key!r}")
    except ValueError as exc:
        sys.stdout.write(json.dumps({"results": [], "error": f"bad plan: {exc}"}) + "\n")
        sys.exit(2)
    result = run(plan)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)  # leave teardown of an unflushed QP to the kernel


if __name__ == "__main__":
    main()
