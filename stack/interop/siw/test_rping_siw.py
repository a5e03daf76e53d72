"""rping between Linux siw (rdma-core's rping in the guest) and ``iwarp rping`` on the host.

Every case runs in both directions where the tools allow (test ids ``siw-active``: the
guest's ``rping -c`` connects to our ``rping -s``; ``iwarp-active``: our ``rping -c``
connects to the guest's ``rping -s``), is captured in the guest and decoded by our
dissector.  Covered: MPA rev 2 defaults, CRC requested by either side, siw's
crc_strict against our CRC request, peer-to-peer with Write and Read RTR (and siw's refusal
of a Send RTR), MPA rev 1, markers, private data, several -C/-S up to 20000 bytes, and
siw's passive race on the first FPDU after its MPA Reply (20 of 20 runs).

siw behaviours these tests pin down (see siw-vm.md):

* passive siw does not enforce ``mpa_crc_required`` (a Request without C is accepted);
* an MPA rev 1 connection gives siw IRD/ORD 0, so ``rping -s`` on siw cannot Read
  (Rev 1 gives it IRD/ORD 0) while ``rping -c`` on siw works;
* siw refuses markers (Reply R=1 as passive; as active it rejects our Reply with M=1);
* siw's Terminate uses its swapped nibble layout (its Terminate bitfield on little-endian
  hosts) and, sent before RTS, carries CRC 0 even when CRC was negotiated;
* Linux 6.1's iw_cm hits BUG() (iwcm.c:969, cm_close_handler) when passive siw waiting for
  a peer-to-peer RTR gets a Terminate instead, so the Send-RTR case never runs iwarp-active:
  our initiator's Terminate 2/0/7 (RFC 6581 §9.2) would crash the guest kernel.
"""

from __future__ import annotations

import pytest

from stack.constants import DDP_UNTAGGED_HDR_LEN, TERM_LLP_NO_MATCHING_RTR, Opcode, RtrType
from stack.dissect.decoder import PduRecord
from stack.interop.helpers import Decode, dissect, tshark_cross_check
from stack.interop.peers import (
    GUEST_MSS,
    IWARP_ACTIVE,
    SIW_ACTIVE,
    PeerRun,
    check_decode,
    iwarp_active,
    no_guest_oops,  # noqa: F401 - fixture
    siw_active,
)
from stack.interop.tshark import TSHARK
from stack.siwvm import SiwVM
from stack.wire.events import MpaFrame, ReadRequest
from stack.wire.terminate import decode_terminate

pytestmark = [pytest.mark.interop, pytest.mark.usefixtures("no_guest_oops")]

GUEST_PORT = 7174
BOTH = pytest.mark.parametrize("direction", [SIW_ACTIVE, IWARP_ACTIVE])
WRITE_RTR_STAG = 1
"""siw's zero-length RDMA Write RTR uses STag 1 (siw-vm.md §3b)."""


def rping(
    vm: SiwVM,
    case: str,
    direction: str,
    *,
    count: int = 1,
    size: int = 64,
    ours: tuple[str, ...] = (),
) -> PeerRun:
    """One rping run in ``direction``; ``ours`` are extra ``iwarp rping`` options."""
    cs = ("-C", str(count), "-S", str(size), "-v")
    iw = ("rping", "--timeout", "10", *cs)
    guest_cs = " ".join(cs)
    if direction == SIW_ACTIVE:
        return siw_active(
            vm,
            case,
            lambda port: [*iw, "-s", "-a", "127.0.0.1", "-p", str(port), *ours],
            lambda addr, port: f"rping -c -a {addr} -p {port} {guest_cs} -V",
        )
    return iwarp_active(
        vm,
        case,
        lambda port: f"rping -s -a 0.0.0.0 -p {port} {guest_cs}",
        lambda port: [*iw, "-c", "-a", "127.0.0.1", "-p", str(port), "-V", *ours],
        guest_port=GUEST_PORT,
    )


def siw_passive_race(run: PeerRun) -> str | None:
    """The capture's sign of siw's passive race: our first FPDU followed siw's MPA Reply and
    siw never sent an FPDU.  Returns the diagnosis, or None."""
    decode = dissect(run.pcap)
    ours = [r for r in decode.fpdus() if r.direction == "i2r"]
    theirs = [r for r in decode.fpdus() if r.direction == "r2i"]
    replies = [r for r in decode.records if r.kind == "mpa_rep"]
    if not (ours and replies) or theirs:
        return None
    gap = ours[0].timestamp - replies[0].timestamp
    return f"our first FPDU went {gap * 1000:.0f} ms after siw's MPA Reply; siw sent no FPDU"


RPING_TEARDOWN_RACE = "rdma_get_cm_event: Bad file descriptor"
"""rping's own exit race: when the connection ends, its main thread destroys the CM event
channel while its CM thread still waits on it, and that thread calls exit(-1) (status 255)."""


def rping_teardown_race(run: PeerRun) -> bool:
    """siw's rping exited 255 only through :data:`RPING_TEARDOWN_RACE`, after the normal
    end of a server run (the client's DISCONNECT); the pings are checked separately."""
    return run.siw_rc == 255 and RPING_TEARDOWN_RACE in run.siw and "DISCONNECT EVENT" in run.siw


def assert_pinged(run: PeerRun, count: int) -> None:
    """Both tools finished and printed every ping."""
    if run.ours_rc != 0 and (race := siw_passive_race(run)):
        pytest.fail(f"siw passive race: {race}\n{run.describe()}")
    assert run.ours_rc == 0 and (run.siw_rc == 0 or rping_teardown_race(run)), run.describe()
    for i in range(count):
        assert f"rdma-ping-{i}: " in run.ours, f"ping {i} missing\n{run.describe()}"
        assert f"rdma-ping-{i}: " in run.siw, f"ping {i} missing\n{run.describe()}"


def handshake(decode: Decode) -> tuple[MpaFrame, MpaFrame]:
    """The capture's MPA Request and Reply."""
    req = next(r.mpa for r in decode.records if r.kind == "mpa_req")
    rep = next(r.mpa for r in decode.records if r.kind == "mpa_rep")
    assert req is not None and rep is not None
    return req, rep


def from_side(decode: Decode, initiator: bool) -> list[PduRecord]:
    return [r for r in decode.fpdus() if (r.direction == "i2r") is initiator]


RDMA_OPS = {Opcode.SEND, Opcode.RDMA_READ_REQUEST, Opcode.RDMA_READ_RESPONSE, Opcode.RDMA_WRITE}


# ---------------------------------------------------------------------- MPA rev 2 and CRC


@BOTH
def test_rping_mpa_22_rev2_defaults_without_crc(vm: SiwVM, case: str, direction: str) -> None:
    """siw's defaults (rev 2, E, IRD/ORD 1/1, no CRC) against ours with --no-crc."""
    run = rping(vm, case, direction, count=3, ours=("--no-crc",))
    assert_pinged(run, 3)
    decode = check_decode(run.pcap)
    req, rep = handshake(decode)
    assert (req.rev, rep.rev) == (2, 2) and req.enhanced and rep.enhanced
    assert not (req.crc or rep.crc or req.markers or rep.markers or rep.reject)
    assert {r.crc_ok for r in decode.fpdus()} == {None}
    assert RDMA_OPS <= set(decode.opcodes())


@BOTH
def test_rping_mpa_11_crc_requested_by_iwarp(vm: SiwVM, case: str, direction: str) -> None:
    """Our C=1 (Request or Reply) turns CRC on both ways; siw's CRCs check out (MPA-12)."""
    run = rping(vm, case, direction, count=3, ours=("--crc",))
    assert_pinged(run, 3)
    decode = check_decode(run.pcap)
    req, rep = handshake(decode)
    ours = rep if direction == SIW_ACTIVE else req
    assert ours.crc and not (req.reject or rep.reject)
    assert {r.crc_ok for r in decode.fpdus()} == {True}
    assert RDMA_OPS <= set(decode.opcodes())
    # tshark, an independent decoder, agrees field by field (CRC verdicts and values too)
    if TSHARK is not None:
        assert tshark_cross_check(run.pcap) == len(decode.records)


@BOTH
def test_rping_mpa_11_crc_requested_by_siw(vm: SiwVM, case: str, direction: str) -> None:
    """siw's mpa_crc_required against our --no-crc.

    siw-active: its Request has C=1 and our Reply echoes it, so CRC runs both ways.
    iwarp-active: passive siw does not enforce mpa_crc_required; it accepts our C=0
    Request with a C=0 Reply and the connection runs without CRC (siw-vm.md §3c).
    """
    vm.set_siw(crc_required=True)
    run = rping(vm, case, direction, count=2, ours=("--no-crc",))
    assert_pinged(run, 2)
    decode = check_decode(run.pcap)
    req, rep = handshake(decode)
    crc = direction == SIW_ACTIVE
    assert (req.crc, rep.crc) == (crc, crc)
    assert {r.crc_ok for r in decode.fpdus()} == {True if crc else None}


@BOTH
def test_rping_mpa_23_siw_crc_strict_refuses_our_crc(vm: SiwVM, case: str, direction: str) -> None:
    """siw's mpa_crc_strict against our CRC request: a clean refusal, no FPDU at all.

    iwarp-active: siw's Reply has R=1, C=0 and zeroed IRD/ORD; our rping says what we
    asked for.  siw-active: siw drops our C=1 Reply and reports a reject to rdma_cm.
    """
    vm.set_siw(crc_strict=True)
    run = rping(vm, case, direction, ours=("--crc",))
    decode = check_decode(run.pcap, allowed_notes=("rejected",))
    req, rep = handshake(decode)
    assert decode.fpdus() == [], run.describe()
    if direction == IWARP_ACTIVE:
        assert req.crc and rep.reject and not rep.crc
        assert rep.ird_ord is not None and (rep.ird_ord.ird, rep.ird_ord.ord) == (0, 0)
        assert run.ours_rc == 1 and "rejected by peer" in run.ours, run.describe()
        assert "(peer IRD 0, ORD 0)" in run.ours and "CRC (C=1)" not in run.ours
    else:
        assert not req.crc and rep.crc and not rep.reject
        assert run.siw_rc not in (0, None) and "REJECTED" in run.siw, run.describe()
        assert run.ours_rc != -9, run.describe()  # our server ends on its own


# ---------------------------------------------------------------------- RFC 6581 P2P


@BOTH
@pytest.mark.parametrize("rtr", ["write", "read"])
def test_rping_erc_09_p2p_rtr(vm: SiwVM, case: str, direction: str, rtr: str) -> None:
    """Peer-to-peer with a Write RTR (zero-length Write, STag 1) or a Read RTR (zero-length
    Read Request and Response) as the initiator's first FPDU, then rping."""
    kind = RtrType.WRITE if rtr == "write" else RtrType.READ
    if direction == SIW_ACTIVE:
        vm.set_siw(p2p=True)
    run = rping(vm, case, direction, count=2, ours=("--p2p", rtr))
    assert_pinged(run, 2)
    decode = check_decode(run.pcap)
    req, rep = handshake(decode)
    assert req.ird_ord is not None and rep.ird_ord is not None
    assert req.ird_ord.p2p and rep.ird_ord.p2p and rep.ird_ord.rtr == kind
    if direction == SIW_ACTIVE:
        assert req.ird_ord.rtr == RtrType.WRITE | RtrType.READ  # siw offers both
    first = from_side(decode, initiator=True)[0].segment
    assert first is not None
    if kind is RtrType.WRITE:
        assert first.opcode == Opcode.RDMA_WRITE and first.tagged and first.last
        assert first.stag == WRITE_RTR_STAG and first.ulpdu_len == first.ddp_header_len
    else:
        assert first.opcode == Opcode.RDMA_READ_REQUEST
        assert isinstance(first.header, ReadRequest) and first.header.size == 0
        answer = from_side(decode, initiator=False)[0].segment
        assert answer is not None and answer.opcode == Opcode.RDMA_READ_RESPONSE
        assert answer.ulpdu_len == answer.ddp_header_len


SEND_RTR_CRASHES_SIW = (
    "Linux 6.1 iw_cm BUG() (iwcm.c:969 cm_close_handler): passive siw waiting for a P2P RTR "
    "crashes on the Terminate 2/0/7 our initiator must send (RFC 6581 §9.2)"
)


@pytest.mark.parametrize(
    "direction",
    [SIW_ACTIVE, pytest.param(IWARP_ACTIVE, marks=pytest.mark.skip(reason=SEND_RTR_CRASHES_SIW))],
)
@pytest.mark.parametrize("crc", [False, True], ids=["nocrc", "crc"])
def test_rping_erc_09_siw_refuses_send_rtr(vm: SiwVM, case: str, direction: str, crc: bool) -> None:
    """siw (offering Write|Read RTR) gets our Reply flagging only Send (ERC-08): it sends
    Terminate 2/0/7 in its swapped layout and rping reports a connect error.
    With CRC negotiated siw's Terminate carries CRC 0 (sent before RTS): we report MPA-12."""
    vm.set_siw(p2p=True)
    run = rping(vm, case, direction, ours=("--p2p", "send", "--crc" if crc else "--no-crc"))
    assert run.siw_rc not in (0, None) and "CONNECT_ERROR" in run.siw, run.describe()
    assert run.ours_rc == 1, run.describe()
    decode = check_decode(run.pcap, allowed_rules=("MPA-12",) if crc else ())
    _req, rep = handshake(decode)
    assert rep.ird_ord is not None and rep.ird_ord.rtr == RtrType.SEND
    term = from_side(decode, initiator=True)
    assert len(term) == 1 and term[0].segment is not None, term
    assert term[0].segment.opcode == Opcode.TERMINATE and term[0].segment.qn == 2
    control = decode_terminate(bytes(term[0].ulpdu)[DDP_UNTAGGED_HDR_LEN:], siw_layout=True)
    assert control.cause == TERM_LLP_NO_MATCHING_RTR and control.siw_swapped
    if crc:
        assert term[0].crc_ok is False and term[0].crc_field == 0
        assert "MPA-12" in run.ours
        assert [rule for rule, _ in decode.findings()] == ["MPA-12"]
    else:
        assert "peer sent Terminate" in run.ours


# ---------------------------------------------------------------------- MPA options


@BOTH
def test_rping_mpa_20_rev1(vm: SiwVM, case: str, direction: str) -> None:
    """MPA rev 1 both ways.  siw-active works; iwarp-active leaves siw with ORD 0, so the
    guest's rping -s cannot post its RDMA Read (Rev 1: IRD/ORD 0) and closes: we report it."""
    if direction == SIW_ACTIVE:
        vm.set_siw(mpa_version=1)
        run = rping(vm, case, direction, count=2)
        assert_pinged(run, 2)
    else:
        run = rping(vm, case, direction, ours=("--mpa-rev", "1"))
        assert "post send error" in run.siw, run.describe()
        assert run.ours_rc == 1 and "closed by the peer" in run.ours, run.describe()
    decode = check_decode(run.pcap)
    req, rep = handshake(decode)
    assert (req.rev, rep.rev) == (1, 1) and not req.enhanced and not rep.enhanced


@BOTH
def test_rping_mpa_09_siw_refuses_markers(vm: SiwVM, case: str, direction: str) -> None:
    """Markers asked for by us: siw supports none.  iwarp-active: Reply R=1 and our rping
    names the markers; siw-active: siw drops our Reply with M=1 and rping reports a reject."""
    run = rping(vm, case, direction, ours=("--markers",))
    decode = check_decode(run.pcap, allowed_notes=("rejected",))
    req, rep = handshake(decode)
    assert decode.fpdus() == [], run.describe()
    if direction == IWARP_ACTIVE:
        assert req.markers and rep.reject and not rep.markers
        assert run.ours_rc == 1 and "rejected by peer" in run.ours, run.describe()
        assert "we asked for markers (M=1), the Reply has M=0" in run.ours
    else:
        assert not req.markers and rep.markers and not rep.reject
        assert run.siw_rc not in (0, None) and "REJECTED" in run.siw, run.describe()


PRIVATE_DATA = "iwarp interop private data"


@BOTH
def test_rping_mpa_21_private_data(vm: SiwVM, case: str, direction: str) -> None:
    """Our ULP private data after the IRD/ORD word; siw accepts it (rping sends none)."""
    run = rping(vm, case, direction, ours=("--private-data", PRIVATE_DATA))
    assert_pinged(run, 1)
    req, rep = handshake(check_decode(run.pcap))
    ours, theirs = (rep, req) if direction == SIW_ACTIVE else (req, rep)
    assert ours.private_data == PRIVATE_DATA.encode() and ours.ird_ord is not None
    assert theirs.private_data == b""


# ---------------------------------------------------------------------- sizes and iterations


@BOTH
@pytest.mark.parametrize(
    "count, size", [(10, 64), (3, 4000), (2, 20000)], ids=["C10-S64", "C3-S4000", "C2-S20000"]
)
def test_rping_ddp_02_sizes(vm: SiwVM, case: str, direction: str, count: int, size: int) -> None:
    """Several -C/-S, above the guest's 1460-byte MSS: tagged messages (Read Responses and
    Writes) span several FPDUs from each side, none above the MSS (ours with --emss)."""
    run = rping(vm, case, direction, count=count, size=size, ours=("--emss", str(GUEST_MSS)))
    assert_pinged(run, count)
    decode = check_decode(run.pcap)
    assert {r.crc_ok for r in decode.fpdus()} == {True}
    assert max(r.ulpdu_len for r in decode.fpdus()) <= GUEST_MSS
    if size > GUEST_MSS:
        for initiator in (True, False):
            tagged = [
                r.segment
                for r in from_side(decode, initiator)
                if r.segment is not None and r.segment.tagged
            ]
            assert any(not s.last for s in tagged), f"no multi-FPDU message (initiator={initiator})"


# ---------------------------------------------------------------------- siw's passive race


@pytest.mark.slow
@pytest.mark.parametrize("direction", [IWARP_ACTIVE])
def test_rping_first_fpdu_delay_20_of_20(vm: SiwVM, case: str, direction: str) -> None:
    """siw's passive race must not make our initiator flaky: 20 of 20 runs with
    the default --first-fpdu-delay, CRC on and off, each first FPDU 0.2 s after the Reply."""
    for n in range(20):
        run = rping(vm, f"{case}_{n:02d}", direction, ours=("--crc" if n % 2 else "--no-crc",))
        assert_pinged(run, 1)
        decode = check_decode(run.pcap)
        _req, rep = (r for r in decode.records if r.kind in ("mpa_req", "mpa_rep"))
        first = from_side(decode, initiator=True)[0]
        assert first.timestamp - rep.timestamp >= 0.19, f"run {n + 1}: no first-FPDU delay"
