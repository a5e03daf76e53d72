"""librdmacm's example programs (rdmacm-utils in the guest) against our compatible peers.

``rdma_server``/``rdma_client`` against ``iwarp rdma-client``/``iwarp rdma-server`` and
``ucmatose`` against ``iwarp cmatose``, both directions (ids ``siw-active``: the guest's
client connects to our server on 10.0.2.2; ``iwarp-active``: our client connects to the
guest's server through a hostfwd), each captured in the guest and decoded by our dissector.

ucmatose's server Sends as soon as a connection is up, before its client has sent
anything, so in client-server mode (no RFC 6581 RTR) it only works with a responder that
breaks MPA-25:

* iwarp-active: siw as responder does send first; the dissector flags it (MPA-25 on siw's
  side only) and our initiator takes the data.
* siw-active: our responder holds its Sends until the initiator's first FPDU (MPA-25) and
  ucmatose's client waits for them, so siw must run peer-to-peer (``peer_to_peer=Y``): its
  zero-length Write RTR opens the way.  Without it the pair waits until our server gives
  up, and nothing of ours goes on the wire (checked too).
"""

from __future__ import annotations

from collections import Counter

import pytest

from stack.constants import Opcode, RtrType
from stack.dissect.decoder import SegmentView
from stack.interop.helpers import Decode
from stack.interop.peers import (
    IWARP_ACTIVE,
    SIW_ACTIVE,
    PeerRun,
    check_decode,
    iwarp_active,
    no_guest_oops,  # noqa: F401 - fixture
    siw_active,
)
from stack.siwvm import SiwVM

pytestmark = [pytest.mark.interop, pytest.mark.usefixtures("no_guest_oops")]

GUEST_PORT = 7471
"""librdmacm's examples' default port."""
MESSAGE_LEN = 16
"""rdma_server/rdma_client exchange one 16-byte Send each way."""
BOTH = pytest.mark.parametrize("direction", [SIW_ACTIVE, IWARP_ACTIVE])


def messages(decode: Decode, direction: str) -> list[int]:
    """Payload sizes of the complete Sends in one direction ('i2r' or 'r2i'), per stream
    in capture order (a message spans FPDUs up to the one with L=1)."""
    sizes: list[int] = []
    pending: Counter[int] = Counter()
    for r in decode.fpdus():
        seg = r.segment
        if r.direction != direction or seg is None or seg.opcode != Opcode.SEND:
            continue
        pending[r.stream] += len(seg.payload)
        if seg.last:
            sizes.append(pending.pop(r.stream))
    return sizes


def rdma_examples(vm: SiwVM, case: str, direction: str) -> PeerRun:
    iw = ("--timeout", "10")
    if direction == SIW_ACTIVE:
        return siw_active(
            vm,
            case,
            lambda port: ["rdma-server", "-s", "127.0.0.1", "-p", str(port), *iw],
            lambda addr, port: f"rdma_client -s {addr} -p {port}",
        )
    return iwarp_active(
        vm,
        case,
        lambda port: f"rdma_server -p {port}",
        lambda port: ["rdma-client", "-s", "127.0.0.1", "-p", str(port), *iw],
        guest_port=GUEST_PORT,
    )


@BOTH
def test_rdmacm_rdma_server_rdma_client(vm: SiwVM, case: str, direction: str) -> None:
    """One 16-byte Send from the client, one back from the server, both end with 0."""
    run = rdma_examples(vm, case, direction)
    assert run.ours_rc == 0 and run.siw_rc == 0, run.describe()
    server, client = (run.ours, run.siw) if direction == SIW_ACTIVE else (run.siw, run.ours)
    assert "rdma_server: end 0" in server and "rdma_client: end 0" in client, run.describe()
    decode = check_decode(run.pcap)
    assert decode.kinds().count("mpa_req") == 1
    assert messages(decode, "i2r") == [MESSAGE_LEN] and messages(decode, "r2i") == [MESSAGE_LEN]
    assert set(decode.opcodes()) == {Opcode.SEND}


def ucmatose(
    vm: SiwVM, case: str, direction: str, conns: int, count: int, size: int, timeout: int = 10
) -> PeerRun:
    args = ("-c", str(conns), "-C", str(count), "-S", str(size))
    iw = (*args, "--timeout", str(timeout))
    flags = " ".join(args)
    if direction == SIW_ACTIVE:
        return siw_active(
            vm,
            case,
            lambda port: ["cmatose", "-b", "127.0.0.1", "-p", str(port), *iw],
            lambda addr, port: f"ucmatose -s {addr} -p {port} {flags}",
        )
    return iwarp_active(
        vm,
        case,
        lambda port: f"ucmatose -p {port} {flags}",
        lambda port: ["cmatose", "-s", "127.0.0.1", "-p", str(port), *iw],
        guest_port=GUEST_PORT,
    )


@BOTH
@pytest.mark.parametrize(
    "conns, count, size", [(2, 5, 100), (1, 3, 5000)], ids=["c2-C5-S100", "c1-C3-S5000"]
)
def test_rdmacm_ucmatose(
    vm: SiwVM, case: str, direction: str, conns: int, count: int, size: int
) -> None:
    """``-c`` connections, ``-C`` messages of ``-S`` bytes each way on each (5000 bytes:
    several FPDUs per message); siw-active runs siw peer-to-peer (module docstring)."""
    if direction == SIW_ACTIVE:
        vm.set_siw(p2p=True)
    run = ucmatose(vm, case, direction, conns, count, size)
    assert run.ours_rc == 0 and run.siw_rc == 0, run.describe()
    for out in (run.ours, run.siw):
        assert "data transfers complete" in out and "return status 0" in out, run.describe()
    siw_responder = direction == IWARP_ACTIVE
    decode = check_decode(run.pcap, allowed_rules=("MPA-25",) if siw_responder else ())
    flagged = {r.direction for r in decode.fpdus() if any(f.rule == "MPA-25" for f in r.findings)}
    assert flagged <= {"r2i"}, "MPA-25 on our side"
    assert decode.kinds().count("mpa_req") == conns
    assert messages(decode, "i2r") == [size] * (conns * count)
    assert messages(decode, "r2i") == [size] * (conns * count)
    if direction == SIW_ACTIVE:
        reqs = [r.mpa for r in decode.records if r.kind == "mpa_req"]
        assert all(m is not None and m.ird_ord is not None and m.ird_ord.p2p for m in reqs)
        assert {m.ird_ord.rtr for m in reqs if m and m.ird_ord} == {RtrType.WRITE | RtrType.READ}
        firsts: dict[int, SegmentView] = {}
        for r in decode.fpdus():
            if r.direction == "i2r" and r.segment is not None:
                firsts.setdefault(r.stream, r.segment)
        assert len(firsts) == conns
        for seg in firsts.values():  # siw's zero-length Write RTR opens each connection
            assert seg.opcode == Opcode.RDMA_WRITE and len(seg.payload) == 0


@pytest.mark.parametrize("direction", [SIW_ACTIVE])
def test_rdmacm_ucmatose_mpa_25_without_p2p_our_responder_waits(
    vm: SiwVM, case: str, direction: str
) -> None:
    """siw-active ucmatose in client-server mode: our responder keeps MPA-25 (nothing of
    ours goes out before siw's first FPDU), ucmatose's client waits for our Sends first,
    so our server gives up after its --timeout and says so."""
    run = ucmatose(vm, case, direction, conns=1, count=2, size=100, timeout=3)
    assert run.ours_rc == 1 and "cmatose: timed out" in run.ours, run.describe()
    decode = check_decode(run.pcap)
    assert decode.kinds().count("mpa_rep") == 1
    assert [r for r in decode.fpdus() if r.direction == "r2i"] == [], "we sent before siw"
