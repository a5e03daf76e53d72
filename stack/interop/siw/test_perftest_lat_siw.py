"""perftest's ib_write_lat / ib_read_lat / ib_send_lat ``-R`` and ib_atomic_bw against siw.

Both directions (``siw-active``: the guest's perftest client connects to ``iwarp bench``'s
server on 10.0.2.2; ``iwarp-active``: our client reaches the guest's perftest server through
a hostfwd), each captured at the guest's NIC and decoded by our dissector: the exchange
Sends follow perftest's script, the data connection carries the test's messages, and
nothing is flagged except siw's non-zero MPA pad bytes (MPA-04, siw's side only).

ib_write_lat's server writes first.  With siw's default client-server MPA (no RFC 6581
peer-to-peer mode) perftest's client sends nothing before it, and MPA-25 would hold our
server's Write for ever; after ``--send-first-after`` our server writes first, as siw's own
responder does, says so, and the capture flags exactly that one Write.  With siw
``peer_to_peer=Y`` its Write RTR opens the way and nothing is flagged.  Our client Writes
zero bytes first, so siw's server never sends first.

siw has no atomics: siw's ib_atomic_bw client fails to post its first Fetch-and-Add and
quits; our client's Fetch-and-Adds get a Terminate from siw.  Both sides say so and exit 1.
"""

from __future__ import annotations

import re

import pytest

from stack.constants import Opcode
from stack.dissect.decoder import PduRecord, SegmentView
from stack.interop.helpers import Decode, dissect, perftest_uncalibrated
from stack.interop.peers import (
    IWARP_ACTIVE,
    SIW_ACTIVE,
    PeerRun,
    iwarp_active,
    no_guest_oops,  # noqa: F401 - fixture
    siw_active,
)
from stack.peers.perftest import DEFAULT_PORT, message_sizes
from stack.siwvm import GUEST_ADDR, SiwVM
from stack.wire.events import ReadRequest

pytestmark = [pytest.mark.interop, pytest.mark.usefixtures("no_guest_oops")]

ITERS = 5
SIZES = (2, 5000)
"""perftest's latency default, and a message of several FPDUs (siw's MULPDU ~1448)."""
BOTH = pytest.mark.parametrize("direction", [SIW_ACTIVE, IWARP_ACTIVE])
LAT_ROW = re.compile(rf"^\s*(\d+)\s+{ITERS}\s+((?:[\d.]+\s+){{6}}[\d.]+)\s*$", re.MULTILINE)
"""perftest's latency row: #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%."""
WROTE_FIRST = "writing first, as Linux siw does (MPA-25 waived)"
DATA_OPCODE = {"write": Opcode.RDMA_WRITE, "read": Opcode.RDMA_READ_REQUEST, "send": Opcode.SEND}


def perftest(vm: SiwVM, case: str, direction: str, program: str, args: str) -> PeerRun:
    """``program -R args`` in the guest against ``iwarp bench program -R args`` (once more
    if the guest's perftest could not calibrate its clock)."""
    ours = ["bench", program, "-R", *args.split(), "--timeout", "15"]
    for attempt in (case, f"{case}-again"):
        if direction == SIW_ACTIVE:
            run = siw_active(
                vm,
                attempt,
                lambda port: [*ours, "-p", str(port), "--bind", "127.0.0.1"],
                lambda addr, port: f"{program} -R {args} -p {port} {addr}",
            )
        else:
            run = iwarp_active(
                vm,
                attempt,
                lambda port: f"{program} -R {args} -p {port}",
                lambda port: [*ours, "-p", str(port), "127.0.0.1"],
                guest_port=DEFAULT_PORT,
            )
        if not perftest_uncalibrated(run.siw):
            return run
    return run


def latency_rows(output: str, size: int) -> list[list[float]]:
    """The figures of every result row of ``size`` (seven numbers each, as perftest)."""
    rows = [
        [float(x) for x in m.group(2).split()]
        for m in LAT_ROW.finditer(output)
        if int(m.group(1)) == size
    ]
    for t_min, t_max, t_typical, t_avg, _stdev, p99, p999 in rows:
        assert 0 < t_min <= t_typical <= t_max, rows
        assert t_min <= t_avg <= t_max and t_min <= p99 <= p999 <= t_max, rows
    return rows


def findings_except_siw_pad(decode: Decode) -> list[tuple[int, str, str]]:
    """Every finding but MPA-04 on siw's FPDUs (siw pads with buffer bytes)."""
    return [
        (r.frame, f.rule, f.detail)
        for r in decode.records
        for f in r.findings
        if not (f.rule == "MPA-04" and r.src.startswith(GUEST_ADDR + ":"))
    ]


def streams(decode: Decode) -> tuple[int, int]:
    """(the exchange connection, the data connection), in the order they were opened."""
    opened = [r.stream for r in decode.records if r.kind == "mpa_req"]
    assert len(opened) == 2, f"want exchange + data connections, got {opened}"
    return opened[0], opened[1]


def data_fpdus(decode: Decode, stream: int, direction: str) -> list[PduRecord]:
    return [
        r
        for r in decode.fpdus()
        if r.stream == stream and r.direction == direction and r.segment is not None
    ]


def is_write_rtr(segment: SegmentView | None) -> bool:
    """A zero-length RDMA Write: siw's RTR in peer-to-peer mode (ERC-09), or our client's
    opening Write."""
    return segment is not None and segment.opcode == Opcode.RDMA_WRITE and not segment.payload


def check_exchange(decode: Decode, test: str) -> None:
    """Both sides' exchange Sends follow perftest's latency script message by message (after
    the initiator's RTR in peer-to-peer mode)."""
    comm, _data = streams(decode)
    for direction in ("i2r", "r2i"):
        sends = [r.segment for r in data_fpdus(decode, comm, direction)]
        if direction == "i2r" and sends and is_write_rtr(sends[0]):
            sends = sends[1:]
        assert all(s is not None and s.opcode == Opcode.SEND for s in sends)
        sizes = [len(s.payload) for s in sends if s is not None]
        assert sizes == message_sizes(test, latency=True), f"{direction} exchange Sends"


def payload(records: list[PduRecord], opcode: Opcode) -> tuple[int, int]:
    """(bytes, messages ending) of ``opcode`` with data in these FPDUs."""
    segs = [r.segment for r in records if r.segment is not None and r.segment.opcode == opcode]
    return sum(len(s.payload) for s in segs), sum(1 for s in segs if s.last and s.payload)


def check_data(decode: Decode, test: str, size: int) -> None:
    """The data connection carries ``ITERS`` messages of ``size`` of the test, each way
    for the ping-pongs (ib_read_lat: Read Requests one way, the Responses back)."""
    _comm, data = streams(decode)
    i2r, r2i = data_fpdus(decode, data, "i2r"), data_fpdus(decode, data, "r2i")
    if test == "read":
        requests = [r.segment.header for r in i2r if r.segment is not None]
        assert all(isinstance(h, ReadRequest) and h.size == size for h in requests), requests
        assert len(requests) == ITERS
        assert payload(r2i, Opcode.RDMA_READ_RESPONSE)[0] == ITERS * size
        return
    for records in (i2r, r2i):
        assert payload(records, DATA_OPCODE[test]) == (ITERS * size, ITERS)


def check_run(run: PeerRun, direction: str, test: str, size: int) -> Decode:
    """Both exit 0, the figures parse (the client's; the server's too but ib_read_lat's,
    whose server prints none), and the capture decodes cleanly."""
    assert run.ours_rc == 0 and run.siw_rc == 0, run.describe()
    client, server = (run.siw, run.ours) if direction == SIW_ACTIVE else (run.ours, run.siw)
    assert len(latency_rows(client, size)) == 1, run.describe()
    assert len(latency_rows(server, size)) == (0 if test == "read" else 1), run.describe()
    decode = dissect(run.pcap)
    assert [n for n in decode.notes if n.kind != "trailing"] == []
    check_exchange(decode, test)
    check_data(decode, test, size)
    return decode


@BOTH
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("test", ["read", "send"])
def test_perftest_lat(vm: SiwVM, case: str, direction: str, test: str, size: int) -> None:
    """ib_read_lat and ib_send_lat: the client's first FPDU opens the data connection."""
    run = perftest(vm, case, direction, f"ib_{test}_lat", f"-n {ITERS} -s {size}")
    decode = check_run(run, direction, test, size)
    assert findings_except_siw_pad(decode) == [], run.describe()


@BOTH
@pytest.mark.parametrize("size", SIZES)
def test_perftest_write_lat(vm: SiwVM, case: str, direction: str, size: int) -> None:
    """iwarp-active: our client's zero-length Write is the data connection's first FPDU,
    before siw's server writes (it would anyway): nothing is flagged.  siw-active: siw's
    client without P2P sends nothing first; after ``--send-first-after`` our server
    writes first, says so, and that Write is the one finding (MPA-25)."""
    run = perftest(vm, case, direction, "ib_write_lat", f"-n {ITERS} -s {size}")
    decode = check_run(run, direction, "write", size)
    _comm, data = streams(decode)
    first = next(r for r in decode.fpdus() if r.stream == data)
    flagged = findings_except_siw_pad(decode)
    if direction == IWARP_ACTIVE:
        assert flagged == [], run.describe()
        assert first.direction == "i2r" and is_write_rtr(first.segment)
        return
    assert WROTE_FIRST in run.ours, run.describe()
    assert first.direction == "r2i" and [f.rule for f in first.findings] == ["MPA-25"]
    assert first.segment is not None and first.segment.opcode == Opcode.RDMA_WRITE
    assert [(frame, rule) for frame, rule, _ in flagged] == [(first.frame, "MPA-25")], flagged


@pytest.mark.parametrize("direction", [SIW_ACTIVE])
@pytest.mark.parametrize("size", SIZES)
def test_perftest_write_lat_siw_p2p_rtr(vm: SiwVM, case: str, direction: str, size: int) -> None:
    """siw ``peer_to_peer=Y``: its zero-length Write RTR is the first FPDU; our server
    keeps MPA-25 without waiting out ``--send-first-after``; nothing is flagged."""
    vm.set_siw(p2p=True)
    run = perftest(vm, case, direction, "ib_write_lat", f"-n {ITERS} -s {size}")
    decode = check_run(run, direction, "write", size)
    assert WROTE_FIRST not in run.ours, run.describe()
    assert findings_except_siw_pad(decode) == [], run.describe()
    _comm, data = streams(decode)
    [req] = [r for r in decode.records if r.stream == data and r.kind == "mpa_req"]
    assert req.mpa is not None and req.mpa.ird_ord is not None and req.mpa.ird_ord.p2p
    first = next(r for r in decode.fpdus() if r.stream == data)
    assert first.direction == "i2r" and is_write_rtr(first.segment)


@BOTH
def test_perftest_atomic_bw_siw_has_no_atomics(vm: SiwVM, case: str, direction: str) -> None:
    """siw has no atomics.  siw-active: siw's client cannot post its Fetch-and-Add
    (nothing of it on the wire) and quits; our server reports the closed connection.
    iwarp-active: siw answers our Fetch-and-Adds with a Terminate, which our client names;
    siw's server fails its next exchange.  Both exit 1, one error line ours; the capture
    decodes with no finding."""
    run = perftest(vm, case, direction, "ib_atomic_bw", f"-n {ITERS}")
    assert run.ours_rc == 1 and run.siw_rc not in (0, None), run.describe()
    errors = [line for line in run.ours.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("iwarp bench ib_atomic_bw: error: ")
    assert "Traceback" not in run.ours
    decode = dissect(run.pcap)
    assert findings_except_siw_pad(decode) == [], run.describe()
    _comm, data = streams(decode)
    i2r, r2i = data_fpdus(decode, data, "i2r"), data_fpdus(decode, data, "r2i")
    if direction == SIW_ACTIVE:
        assert "Couldn't post send" in run.siw, run.describe()
        assert "the connection closed" in errors[0]
        assert i2r == [] and r2i == [], "no atomic (nor anything else) on the data connection"
        return
    assert "Failed to exchange data" in run.siw, run.describe()
    assert "the peer sent Terminate" in errors[0], errors
    atomics = [r.segment for r in i2r if r.segment is not None]
    assert atomics and all(s.opcode == Opcode.ATOMIC_REQUEST for s in atomics)
    terminates = [r.segment for r in r2i if r.segment is not None]
    assert [s.opcode for s in terminates] == [Opcode.TERMINATE]
