"""``kbtp bench --floor``: the pure-Python floor of KBTP's exchange (kbtp.cli.bench_floor).

The floor's FPDUs, recorded by a proxy between its two ends, are decoded by the stack's own
deframer and RDMAP decoder and by KBTP's message decoder; an octet changed in transit is
caught (by the CRC, or with CRC off by the receiving side's check of what it placed); the
bench's table and JSON carry the floor only with ``--floor``.  No speed is asserted.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from kbtp.cli import bench_floor as bench_floor_module
from kbtp.cli import main
from kbtp.cli.bench_floor import (
    _HELLO,
    _READY,
    _RESULT,
    STORE_INLINE,
    bench_floor,
    floor_process,
    floor_target,
    kind_of,
)
from kbtp.cli.bench_report import FLOOR_HEADER, HEADER
from kbtp.constants import MessageOpcode, RequestFlag, Status
from kbtp.messages import Completion, Load, Store, decode_message
from stack.cli import CliError, trio_run
from stack.constants import RAW_RECEIVE_SIZE, Opcode, QueueNumber
from stack.wire.deframer import FpduDeframer
from stack.wire.events import ReadRequest
from stack.wire.rdmap import Segment, decode_ulpdu

Flip = tuple[str, int] | None
"""An octet to change in transit: direction ("up": initiator to target, or "down") and its
offset in that direction's stream."""


@asynccontextmanager
async def recorded(port: int, flip: Flip = None) -> AsyncIterator[tuple[int, dict[str, bytearray]]]:
    """A proxy to ``port`` recording both directions of its one connection."""
    streams = {"up": bytearray(), "down": bytearray()}

    async def pump(src: trio.SocketStream, dst: trio.SocketStream, name: str) -> None:
        record = streams[name]
        try:
            while data := bytearray(await src.receive_some(1 << 16)):
                if flip is not None and flip[0] == name and 0 <= flip[1] - len(record) < len(data):
                    data[flip[1] - len(record)] ^= 1
                record += data
                await dst.send_all(data)
            await dst.send_eof()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            await dst.aclose()

    async def handle(client: trio.SocketStream) -> None:
        target = await trio.open_tcp_stream("127.0.0.1", port)
        async with client, target, trio.open_nursery() as nursery:
            nursery.start_soon(pump, client, target, "up")
            nursery.start_soon(pump, target, client, "down")

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handle, listeners)
        yield listeners[0].socket.getsockname()[1], streams
        nursery.cancel_scope.cancel()


def run_floor(op: str, path: str, size: int, iters: int, inflight: int, **options: Any) -> Any:
    """One floor run (one receive size) against an in-process target behind the recording
    proxy: (seconds, CPU seconds, the two recorded streams)."""
    flip = options.pop("flip", None)
    options.setdefault("receives", (RAW_RECEIVE_SIZE,))

    async def go() -> Any:
        async with floor_target(in_process=True) as port, recorded(port, flip) as (proxy, s):
            seconds, cpu = await bench_floor(
                proxy, op, path, size, iters, inflight, peer_cpu=False, **options
            )
            return seconds, cpu, s

    return trio_run(go)


def fpdus(stream: bytes) -> list[Segment]:
    """Every FPDU of ``stream`` (CRC checked), decoded; nothing may be left over."""
    deframer = FpduDeframer(crc=True)
    deframer.feed(bytes(stream))
    segments = []
    while (ulpdu := deframer.next_ulpdu()) is not None:
        segments.append(decode_ulpdu(ulpdu))
    assert deframer.pending == 0
    return segments


def messages(segments: list[Segment], qn: int = QueueNumber.SEND) -> list[tuple[int, bytes]]:
    """(MSN, reassembled payload) of each untagged message on ``qn``, checking MO and L."""
    done: list[tuple[int, bytes]] = []
    body = bytearray()
    for s in segments:
        if s.tagged or s.qn != qn:
            continue
        assert s.mo == len(body)
        body += s.payload
        if s.last:
            assert s.msn is not None
            done.append((s.msn, bytes(body)))
            body = bytearray()
    assert not body
    return done


def check_completions(down: list[Segment], op: str, size: int, iters: int) -> None:
    sent = messages(down)
    assert [msn for msn, _ in sent] == list(range(1, iters + 1))
    for _, body in sent:
        c = decode_message(body)
        assert isinstance(c, Completion) and c.status == Status.SUCCESS
        assert c.request_opcode == MessageOpcode[op.upper()] and c.data_length == size


@pytest.mark.parametrize(
    ("size", "mulpdu", "read"), [(1, 64768, 1 << 17), (5003, 1024, 997), (70001, 64768, 4096)]
)
@pytest.mark.parametrize(
    ("op", "path"),
    [("load", "rdma"), ("store", "rdma"), ("alloc_store", "rdma"), ("store", "inline")],
)
def test_the_floor_sends_real_fpdus_that_the_stack_decodes(
    op: str, path: str, size: int, mulpdu: int, read: int
) -> None:
    """Sizes of one octet, of several FPDUs of a small MULPDU, of two of the largest; reads
    of fewer octets than an FPDU (a partial FPDU at the end of most reads)."""
    iters, inflight = 9, 4
    seconds, cpu, streams = run_floor(
        op, path, size, iters, inflight, mulpdu=mulpdu, receives=(read,)
    )
    assert seconds > 0 and cpu > 0
    up = fpdus(streams["up"][_HELLO.size :])
    down = fpdus(streams["down"][len(_READY) : -_RESULT.size])
    assert all(s.ulpdu_len <= mulpdu for s in up + down)
    requests = messages(up)
    assert [msn for msn, _ in requests] == list(range(1, iters + 1))
    decoded = [decode_message(body) for _, body in requests]
    check_completions(down, op, size, iters)
    tagged = [s for s in (down if op == "load" else up) if s.tagged]
    if op == "load":
        assert all(isinstance(r, Load) and r.descriptor.length == size for r in decoded)
        assert {s.opcode for s in tagged} == {Opcode.RDMA_WRITE}
    elif kind_of(op, path) == STORE_INLINE:
        assert not tagged and not any(s.tagged for s in down)
        for r in decoded:
            assert isinstance(r, Store) and r.flags & RequestFlag.INLINE and len(r.data) == size
    else:
        reads = [s for s in down if s.opcode == Opcode.RDMA_READ_REQUEST]
        assert [s.msn for s in reads] == list(range(1, iters + 1))
        assert all(isinstance(s.header, ReadRequest) and s.header.size == size for s in reads)
        assert {s.opcode for s in tagged} == {Opcode.RDMA_READ_RESPONSE}
        assert all(r.opcode == MessageOpcode[op.upper()] for r in decoded)
    if path == "inline":
        assert sum(len(r.data) for r in decoded if isinstance(r, Store)) == iters * size
    else:
        assert sum(len(s.payload) for s in tagged) == iters * size
        assert sum(s.last for s in tagged) == iters


@pytest.mark.parametrize(
    ("op", "flip", "crc", "message"),
    [
        ("load", "down", True, "CRC mismatch at the initiator"),
        ("load", "down", False, "the initiator got other octets"),
        ("store", "up", False, "the target got other octets"),
        ("store", "up", True, "closed|reset|pipe"),  # the target drops the connection
    ],
)
def test_a_changed_octet_is_caught_by_the_crc_or_the_receiving_side(
    op: str, flip: str, crc: bool, message: str
) -> None:
    size, iters = 70001, 6
    start = _HELLO.size if flip == "up" else len(_READY)
    # an octet inside a block's data (well past the headers of its FPDU)
    where = start + (iters - 1) * (size + 200) + 1000 if flip == "down" else start + 5 * size
    with pytest.raises(CliError, match=message):
        run_floor(op, "rdma", size, iters, 2, mulpdu=64768, crc=crc, flip=(flip, where))


def test_the_target_counts_the_octets_it_placed(monkeypatch: pytest.MonkeyPatch) -> None:
    real = bench_floor_module._target

    async def one_short(*args: Any) -> int:
        return await real(*args) - 1

    monkeypatch.setattr(bench_floor_module, "_target", one_short)
    with pytest.raises(CliError, match="the target placed 40959 octets, 40960 were sent"):
        run_floor("store", "rdma", 4096, 10, 4, mulpdu=64768)


def test_the_target_survives_a_bad_connection_and_its_process_ends() -> None:
    async def go() -> int:
        async with floor_process() as port:
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.sendall(b"\xff" * _HELLO.size)  # a kind that does not exist
                assert s.recv(1) == b""
            seconds, _ = await bench_floor(port, "load", "rdma", 4096, 8, 2, mulpdu=64768)
            assert seconds > 0
        return port

    port = trio.run(go)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port)).close()


def table(text: str) -> tuple[str, list[list[str]]]:
    lines = text.splitlines()
    return lines[1], [line.split() for line in lines[2:]]


def test_kbtp_bench_floor_adds_the_floor_to_each_row_and_the_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "bench.json"
    argv = ["bench", "-s", "4K,64K", "--floor", "-n", "32", "-t", "4", "--quiet"]
    assert main([*argv, "--json", str(out)]) == 0
    header, rows = table(capsys.readouterr().out)
    assert header == HEADER + FLOOR_HEADER
    doc = json.loads(out.read_text())
    assert doc["parameters"]["floor"] is True and doc["floor"]["same_run"] is True
    assert len(rows) == len(doc["results"]) == 6
    for cells, row in zip(rows, doc["results"], strict=True):
        floor = row["floor"]
        assert floor["ops_per_s"] > 0 and floor["gbyte_per_s"] > 0 and floor["cpu_us_per_op"] > 0
        assert floor["exchange"].startswith("Send")
        base = row["baseline"]["gbyte_per_s"]
        assert row["floor_ratio"] == pytest.approx(floor["gbyte_per_s"] / base)
        assert row["vs_floor"] == pytest.approx(row["gbyte_per_s"] / floor["gbyte_per_s"])
        assert cells[11:] == [
            f"{floor['ops_per_s']:.0f}",
            f"{floor['gbyte_per_s']:.3f}",
            f"{row['floor_ratio']:.2f}",
            f"{row['vs_floor']:.2f}",
            f"{floor['cpu_us_per_op']:.0f}",
        ]
    assert "allocation is not modelled" in doc["results"][2]["floor"]["exchange"]
    assert (
        doc["results"][0]["path"] == "inline"
        and "Send of request and block" in (doc["results"][0]["floor"]["exchange"])
    )


def test_without_floor_the_table_and_rows_are_as_before(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "bench.json"
    argv = ["bench", "-s", "4K", "--ops", "store", "-n", "16", "-t", "2", "--in-process"]
    assert main([*argv, "--quiet", "--json", str(out)]) == 0
    header, rows = table(capsys.readouterr().out)
    assert header == HEADER and [len(r) for r in rows] == [11]
    doc = json.loads(out.read_text())
    assert doc["parameters"]["floor"] is False and doc["floor"] is None
    assert not {"floor", "floor_ratio", "vs_floor"} & set(doc["results"][0])


@pytest.mark.parametrize(
    ("extra", "message"),
    [(["--offload"], "not --offload"), (["--markers"], "without markers")],
)
def test_floor_with_an_option_it_cannot_model_is_one_error(
    capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    try:
        code = main(["bench", "--floor", *extra])
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    assert code == 2 and not captured.out
    assert captured.err.count("\n") == 1 and message in captured.err, captured.err
