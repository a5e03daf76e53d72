"""perftest ``-R`` compatibility (``iwarp bench ib_*_bw``): wire formats and sessions.

The hand-built byte strings come from perftest 4.5+0.17's layout and were checked against
captures of siw <-> siw runs (``ib_write_bw -R -n 5 -s 2000``) in the QEMU guest.
"""

from __future__ import annotations

import io
import math
from typing import TypedDict

import pytest
import trio
from trio.testing import MockClock

from stack.cli import build_parser
from stack.cli.iwarp import COMMANDS
from stack.peers.perftest import (
    DEST,
    BwReport,
    ByteMeter,
    Comm,
    PerftestClient,
    PerftestError,
    PerftestOptions,
    PerftestServer,
    PingpongDest,
    Step,
    check_peer_version,
    decode_credit,
    decode_mtu,
    decode_sys_int,
    decode_version,
    default_rx_depth,
    encode_credit,
    encode_mtu,
    encode_sys_int,
    encode_version,
    message_sizes,
    script,
)
from stack.rnic import Access, Rnic, WcOpcode, WcStatus, WorkCompletion

# The client's pingpong_dest of a siw run: lid 0, out_reads 1, QPN 3, PSN 0x1b1c5e, rkey
# 0x47f10200, 4 uninitialised padding bytes (1e56 0000), vaddr 0x561e48d36000, GID of
# siw0 (52:54:00:12:34:56 and zeros), srqn 0, gid_index 0.
SIW_DEST = bytes.fromhex(
    "00000000" "00000001" "00000003" "001b1c5e" "47f10200" "1e560000"
    "0000561e48d36000" "52540012345600000000000000000000" "00000000" "00000000"
)  # fmt: skip
SIW_REPORT = [  # the client's xchg_bw_reports of that run: 2000 B, 5 iterations
    bytes.fromhex("00000000000007d0"),
    bytes.fromhex("0000000000000005"),
    bytes.fromhex("3ff89385817fc56d"),
    bytes.fromhex("3fe526fbe41645ea"),
    bytes.fromhex("3f36b64b743d33d1"),
]


# --------------------------------------------------------------------------- formats


def test_pingpong_dest_decodes_siw_bytes_ignoring_padding() -> None:
    dest = PingpongDest.decode(SIW_DEST)
    assert dest == PingpongDest(
        lid=0,
        out_reads=1,
        qpn=3,
        psn=0x1B1C5E,
        rkey=0x47F10200,
        vaddr=0x561E48D36000,
        gid=bytes.fromhex("52540012345600000000000000000000"),
        srqn=0,
        gid_index=0,
    )
    assert dest.encode() == SIW_DEST[:20] + bytes(4) + SIW_DEST[24:]


def test_pingpong_dest_hand_built_layout() -> None:
    dest = PingpongDest(1, 2, 3, 4, 0xA1B2C3D4, 0x0102030405060708, bytes(range(16)), 9, 10)
    wire = (
        b"\x00\x00\x00\x01" b"\x00\x00\x00\x02" b"\x00\x00\x00\x03" b"\x00\x00\x00\x04"
        b"\xa1\xb2\xc3\xd4" b"\x00\x00\x00\x00" b"\x01\x02\x03\x04\x05\x06\x07\x08"
        + bytes(range(16)) + b"\x00\x00\x00\x09" b"\x00\x00\x00\x0a"
    )  # fmt: skip
    assert DEST.size == 56
    assert dest.encode() == wire
    assert PingpongDest.decode(wire) == dest


@pytest.mark.parametrize("length", [0, 55, 57, 64])
def test_pingpong_dest_wrong_length_refused(length: int) -> None:
    with pytest.raises(PerftestError, match="56-byte"):
        PingpongDest.decode(bytes(length))


def test_pingpong_dest_out_of_range_field_refused() -> None:
    with pytest.raises(PerftestError):
        PingpongDest(qpn=1 << 32).encode()


def test_version_message_is_16_nul_padded_bytes() -> None:
    assert encode_version() == b"6.06" + bytes(12)
    assert decode_version(b"6.06" + bytes(12)) == ("6.06", 6.06)
    assert decode_version(b"5.70\0garbage\0\0\0\0") == ("5.70", 5.70)
    assert decode_version(b"x" + bytes(15)) == ("x", 0.0)


@pytest.mark.parametrize("text", ["5.69", "4.5", "", "abc"])
def test_old_or_unparseable_peer_version_refused(text: str) -> None:
    _, value = decode_version(text.encode().ljust(16, b"\0"))
    with pytest.raises(PerftestError, match="not compatible"):
        check_peer_version(value, text)


def test_version_wrong_length_refused() -> None:
    with pytest.raises(PerftestError, match="16-byte"):
        decode_version(b"6.06")


def test_sys_data_and_mtu_messages() -> None:
    assert encode_sys_int(4096) == bytes.fromhex("00001000")
    assert encode_sys_int(64) == bytes.fromhex("00000040")
    assert decode_sys_int(bytes.fromhex("00002000"), "page") == 8192
    with pytest.raises(PerftestError):
        decode_sys_int(b"\0\0\x10", "page")
    assert encode_mtu() == b"3\0"  # IBV_MTU_1024, as siw on a 1500-byte netdev
    assert encode_mtu(5) == b"5\0"
    assert decode_mtu(b"3\0") == 3
    assert decode_mtu(b"x\0") == 0
    with pytest.raises(PerftestError):
        decode_mtu(b"")


def test_bw_report_hand_built_and_siw_bytes() -> None:
    report = BwReport(2000, 5, 1.5, 0.75, 0.25)
    assert report.encode() == [
        bytes.fromhex("00000000000007d0"),
        bytes.fromhex("0000000000000005"),
        bytes.fromhex("3ff8000000000000"),
        bytes.fromhex("3fe8000000000000"),
        bytes.fromhex("3fd0000000000000"),
    ]
    assert BwReport.decode(report.encode()) == report
    siw = BwReport.decode(SIW_REPORT)
    assert (siw.size, siw.iters) == (2000, 5)
    assert math.isclose(siw.bw_peak, 1.536, rel_tol=1e-3)
    assert math.isclose(siw.bw_avg, 0.661, rel_tol=1e-3)
    with pytest.raises(PerftestError, match="malformed"):
        BwReport.decode(SIW_REPORT[:4])
    with pytest.raises(PerftestError, match="malformed"):
        BwReport.decode([*SIW_REPORT[:4], b"\0\0\0\0"])


def test_send_credit_is_little_endian_u32() -> None:
    assert encode_credit(2) == b"\x02\x00\x00\x00"  # as siw's receiver writes it
    assert decode_credit(bytes.fromhex("04000000")) == 4
    assert encode_credit(1 << 32 | 7) == b"\x07\x00\x00\x00"


# --------------------------------------------------------------------------- script


HELLO = [16, 4, 4, 2]


def test_write_and_read_exchange_sizes_match_siw_capture() -> None:
    # siw <-> siw ib_write_bw -R: 16 Sends each way on the exchange connection.
    expected = HELLO + [56] * 6 + [8] * 5 + [56]
    assert message_sizes("write") == expected
    assert message_sizes("read") == expected


def test_send_exchange_sizes_match_siw_capture() -> None:
    # siw <-> siw ib_send_bw -R: 11 Sends each way, no report exchange, no sync between
    # the run and the closing one.
    assert message_sizes("send") == HELLO + [56] * 7


def test_script_per_qp_and_per_size() -> None:
    assert message_sizes("write", num_qps=2) == HELLO + [56] * 8 + [8] * 5 + [56]
    assert script("send", 2, all_sizes=True).count(Step.RUN) == 2
    assert message_sizes("send", 2, all_sizes=True) == HELLO + [56] * 5 + [56] * 4 + [56]
    assert message_sizes("write", 3, all_sizes=True) == message_sizes("write")
    assert script("write", 1)[:4] == (Step.HELLO, Step.SYNC, Step.CONNECT, Step.SYNC)
    with pytest.raises(PerftestError):  # ib_atomic_bw has a peer here, ib_atomic_lat not
        script("atomic", 1, latency=True)


# --------------------------------------------------------------------------- options


@pytest.mark.parametrize(
    ("iters", "all_sizes", "rx", "depth"),
    [(5, False, None, 6), (5, True, None, 5), (1000, False, None, 512), (7, False, 3, 4)],
)
def test_rx_depth_as_perftest(iters: int, all_sizes: bool, rx: int | None, depth: int) -> None:
    assert default_rx_depth(iters, all_sizes, rx) == depth


def test_options_follow_perftest_defaults() -> None:
    write = PerftestOptions.build("write")
    assert (write.iters, write.tx_depth, write.sizes, write.cq_mod) == (5000, 128, (65536,), 1)
    small = PerftestOptions.build("write", size=2000, iters=5)
    assert (small.tx_depth, small.cq_mod, small.cm_reads) == (5, 5, 0)
    read = PerftestOptions.build("read", size=64)
    assert (read.iters, read.out_reads, read.cm_reads, read.cq_mod) == (1000, 128, 128, 100)
    assert PerftestOptions.build("read", out_reads=4).cm_reads == 4
    send = PerftestOptions.build("send", size=64, iters=5)
    assert (send.rx_depth, send.out_reads) == (6, 1)
    every = PerftestOptions.build("write", all_sizes=True, iters=3)
    assert every.sizes[0] == 2 and every.buffer_size == 1 << 23


def test_send_server_receive_cq_holds_every_receive_of_its_qps() -> None:
    """-q 129 with 512 receives each: 66048 posted, past the 65536 entries the shared
    receive CQ had.  All of them complete into it (flushed here, as at teardown) and none
    is lost to an overflow (fatal, SEC-09): the CQ is sized -q x receives, as perftest's."""
    opts = PerftestOptions.build("send", size=64, iters=512, num_qps=129, out=io.StringIO())
    assert opts.recv_cq_size == 129 * opts.recv_slots
    server = PerftestServer(opts)
    for _ in range(opts.num_qps):
        d = server.new_data_qp()
        d.buf = server.pd.reg_mr(bytearray(64), Access.LOCAL_WRITE)
    server.prepare(64)
    posted = sum(d.recvs_posted for d in server.data)
    assert posted == 129 * 512 > 1 << 16
    for d in server.data:
        d.qp.stream_closed(ConnectionError("gone"))
    wcs = server.recv_cq.poll(posted + 1)
    assert len(wcs) == posted
    assert {wc.status for wc in wcs} == {WcStatus.WR_FLUSH_ERR}


def test_send_receives_posted_at_once_are_bounded() -> None:
    """-q x -r receives would all be posted before a byte is sent: past the bound the run is
    refused up front with both factors named, not left to exhaust memory."""
    from stack.peers.perftest.options import MAX_POSTED_RECEIVES

    per_qp = MAX_POSTED_RECEIVES // 1024
    ok = PerftestOptions.build("send", iters=per_qp, rx_depth=per_qp, num_qps=1024)
    assert ok.num_qps * ok.rx_depth == MAX_POSTED_RECEIVES
    with pytest.raises(PerftestError, match=r"-q 1025 QPs x 16384 receives each"):
        PerftestOptions.build("send", iters=per_qp, rx_depth=per_qp, num_qps=1025)
    # Write, Read and the latency tests post no such receives.
    PerftestOptions.build("write", iters=per_qp, num_qps=16384)
    PerftestOptions.build("send", iters=per_qp, rx_depth=per_qp, num_qps=1025, latency=True)


def test_cli_parses_perftest_command_lines() -> None:
    parser = build_parser("iwarp", "test", COMMANDS)
    args = parser.parse_args(["bench", "ib_send_bw", "-R", "-n", "5", "-s", "2K", "10.0.2.15"])
    from stack.peers.perftest import options_from_args

    client = options_from_args(args, "send")
    assert (client.host, client.iters, client.sizes, client.crc) == ("10.0.2.15", 5, (2048,), True)
    args = parser.parse_args(["bench", "ib_read_bw", "-o", "8", "-p", "5000"])
    server = options_from_args(args, "read")
    assert (server.host, server.port, server.out_reads, server.crc) == (None, 5000, 8, False)


# --------------------------------------------------------------------------- sessions


class _Common(TypedDict):
    """The options both peers of a session get."""

    size: int
    iters: int
    num_qps: int
    timeout: float
    port: int


async def _session(
    test: str, size: int, iters: int, num_qps: int = 1
) -> tuple[PerftestClient, PerftestServer]:
    common: _Common = {
        "size": size,
        "iters": iters,
        "num_qps": num_qps,
        "timeout": 10.0,
        "port": 0,
    }
    sopts = PerftestOptions.build(test, bind="127.0.0.1", crc=False, out=io.StringIO(), **common)
    server = PerftestServer(sopts)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(server.session)
            copts = PerftestOptions.build(
                test, host="127.0.0.1", first_fpdu_delay=0.0, out=io.StringIO(), **common
            )
            copts = PerftestOptions(**{**_fields(copts), "port": port})
            client = PerftestClient(copts)
            await client.session()
    return client, server


def _fields(opts: PerftestOptions) -> dict[str, object]:
    return {name: getattr(opts, name) for name in PerftestOptions.__slots__}


def _hello_bytes() -> list[bytes]:
    return [b"6.06" + bytes(12), bytes.fromhex("00001000"), bytes.fromhex("00000040"), b"3\0"]


@pytest.mark.parametrize("size", [64, 5000])
def test_write_session_places_client_data_at_server(size: int) -> None:
    client, server = trio.run(_session, "write", size, 5)
    [result] = client.results
    assert (result.size, result.iterations, result.messages) == (size, 5, 5)
    assert server.peer_report is not None
    assert (server.peer_report.size, server.peer_report.iters) == (size, 5)
    src, dst = client.data[0].buf, server.data[0].buf
    assert src is not None and dst is not None
    assert bytes(dst.buf[:size]) == bytes(src.buf[:size]) != bytes(dst.buf[size : 2 * size])
    received = [data for ours, data in server.comm.transcript if not ours]
    assert received[:4] == _hello_bytes()
    assert [len(d) for d in received] == message_sizes("write")
    assert PingpongDest.decode(received[4]) == PingpongDest()  # sync before the data QPs
    assert PingpongDest.decode(received[6]) == client.mine[0]


@pytest.mark.parametrize("size", [64, 5000])
def test_read_session_fetches_server_data(size: int) -> None:
    client, server = trio.run(_session, "read", size, 5)
    assert client.results[0].iterations == 5
    sink, source = client.data[0].buf, server.data[0].buf
    assert sink is not None and source is not None
    assert bytes(sink.buf[:size]) == bytes(source.buf[:size])
    assert client.theirs[0].out_reads == 128 == server.mine[0].out_reads
    assert client.data[0].qp.ord >= 1


@pytest.mark.parametrize("size", [64, 5000])
def test_send_session_uses_receives_and_credits(size: int) -> None:
    client, server = trio.run(_session, "send", size, 5)
    assert server.data[0].received == 5
    assert server.results[0].iterations == 5 and client.results[0].iterations == 5
    src, dst = client.data[0].buf, server.data[0].buf
    assert src is not None and dst is not None
    assert bytes(dst.buf[:size]) == bytes(src.buf[:size])
    # rx_depth 6, a credit every 2 receives: the last credit the server wrote is 4.
    assert client.credit is not None and decode_credit(client.credit.buf[:4]) == 4
    assert client.mine[0].rkey == client.credit.rkey
    assert [len(d) for ours, d in client.comm.transcript if ours] == message_sizes("send")


def test_send_session_many_messages_waits_for_credits() -> None:
    client, server = trio.run(_session, "send", 32, 700)  # rx_depth 512 < 700: credits needed
    assert server.data[0].received == 700
    assert client.credit is not None and decode_credit(client.credit.buf[:4]) >= 700 - 512


@pytest.mark.parametrize("test", ["write", "send"])
def test_two_qps(test: str) -> None:
    client, server = trio.run(_session, test, 256, 5, 2)
    assert len(client.data) == len(server.data) == 2
    assert [d.qpn for d in client.theirs] == [d.qp.qp_num for d in server.data]
    if test == "send":
        assert [d.received for d in server.data] == [5, 5]
    assert client.results[0].messages == client.results[0].iterations == 10  # as perftest
    if test == "write":
        assert server.peer_report is not None and server.peer_report.iters == 10


def test_client_without_server_fails_clearly() -> None:
    async def main() -> None:
        port = await _unused_port()
        opts = PerftestOptions.build(
            "write", host="127.0.0.1", port=port, timeout=0.3, out=io.StringIO()
        )
        await PerftestClient(opts).session()

    with pytest.raises(PerftestError, match="cannot open the exchange connection"):
        trio.run(main)


def test_cli_client_without_server_exits_1_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from stack.cli import run

    port = trio.run(_unused_port)
    argv = ["bench", "ib_write_bw", "-R", "-n", "5", "--timeout", "0.3", "-p", str(port)]
    assert run("iwarp", "test", COMMANDS, [*argv, "127.0.0.1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("iwarp bench ib_write_bw: error: cannot open")


async def _unused_port() -> int:
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --------------------------------------------------------------------------- waiting


def _comm(broken: str = "") -> tuple[Comm, ByteMeter]:
    rnic = Rnic()
    meter = ByteMeter()
    return Comm(rnic, rnic.alloc_pd(), False, 2.0, meter, lambda: broken), meter


def _deliver(comm: Comm, data: bytes) -> None:
    """A receive completion as the RNIC would report it (slot 0 holds ``data``)."""
    comm.mr.buf[: len(data)] = data
    comm.qp._rq.popleft()  # the RNIC consumed the receive that the message landed in
    comm.recv_cq.push(WorkCompletion(0, WcStatus.SUCCESS, WcOpcode.RECV, 1, len(data)))


def test_waiting_side_keeps_waiting_while_data_flows() -> None:
    """A slow Write run (no completions at the target) must not time out the next sync."""

    async def main() -> bytes:
        comm, meter = _comm()

        async def peer() -> None:
            for _ in range(20):  # 10 s of traffic, five times the 2 s timeout
                await trio.sleep(0.5)
                meter.record(False, b"x" * 1448)
            _deliver(comm, b"late but fine")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(peer)
            return await comm._receive("sync")

    assert trio.run(main, clock=MockClock(autojump_threshold=0)) == b"late but fine"


def test_waiting_side_times_out_without_progress() -> None:
    async def main() -> None:
        comm, meter = _comm()
        meter.record(True, b"outbound bytes are no progress")
        await comm._receive("sync")

    with pytest.raises(PerftestError, match="no sync from the peer within 2.0 s"):
        trio.run(main, clock=MockClock(autojump_threshold=0))


def test_waiting_side_fails_fast_when_a_data_connection_broke() -> None:
    async def main() -> None:
        comm, _ = _comm("data QP 0 is ERROR: closed")
        with trio.fail_after(1):
            await comm._receive("sync")

    with pytest.raises(PerftestError, match="waiting for the sync: data QP 0 is ERROR"):
        trio.run(main, clock=MockClock(autojump_threshold=0))
