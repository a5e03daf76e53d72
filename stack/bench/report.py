"""The benchmark tables, perftest's layout: headers, dashed lines, one row per size.

Column names and spacing are perftest's (``ib_write_bw``, ``ib_read_lat``, ...); a value
starts under its column name.  ``--baseline`` appends the raw trio TCP figure and its
ratio, then the blocking-socket figure and its ratio (``ratio_blk``), and the opening
block says what each compares with; ``--cpu`` the CPU time per message; ``iwarp bench
idle-qps`` has its own table.
"""

from __future__ import annotations

from collections.abc import Sequence

from stack.bench.baseline import raw_receive_sizes
from stack.bench.options import BenchOptions
from stack.bench.results import BwResult, IdleResult, LatResult
from stack.wire.events import Negotiated

RESULT_LINE = "-" * 87
BW_HEADER = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
LAT_HEADER = (
    " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]"
    "    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
)
BW_BASELINE_HEADER = "  raw TCP[MB/sec]   ratio   blocking[MB/sec]   ratio_blk"
LAT_BASELINE_HEADER = "  raw t_typical[usec]   ratio   blocking t_typical[usec]   ratio_blk"
CPU_HEADER = "   CPU cli/srv[usec/msg]"
REPEAT_HEADER = "   runs   ratio min-max"
REPEAT_BW_HEADER = "   runs   BW min-max[MB/sec]"
REPEAT_LAT_HEADER = "   runs   t_typical min-max[usec]"
RAW_CPU_HEADER = "   raw CPU cli/srv[usec/msg]"
BW_COLUMNS = ("#bytes", "#iterations", "BW peak[MB/sec]", "BW average[MB/sec]", "MsgRate[Mpps]")
LAT_COLUMNS = (
    "#bytes",
    "#iterations",
    "t_min[usec]",
    "t_max[usec]",
    "t_typical[usec]",
    "t_avg[usec]",
    "t_stdev[usec]",
    "99% percentile[usec]",
    "99.9% percentile[usec]",
)
IDLE_HEADER = (
    " #qps     server RSS before[KiB]   server RSS after[KiB]   per QP[KiB]   client per QP[KiB]"
)
IDLE_COLUMNS = (
    "#qps",
    "server RSS before[KiB]",
    "server RSS after[KiB]",
    "per QP[KiB]",
    "client per QP[KiB]",
)
TRANSPORT = "iWARP (userspace, TCP)"
TEST_NAMES = {
    "write": "RDMA_Write",
    "read": "RDMA_Read",
    "send": "Send",
    "atomic": "Atomic FETCH_AND_ADD",
}


def _row(header: str, names: Sequence[str], values: Sequence[str]) -> str:
    """Place each value under its column name (left-aligned, perftest style)."""
    line = ""
    pos = 0
    for name, value in zip(names, values, strict=True):
        start = header.index(name, pos)
        pos = start + len(name)
        if len(line) >= start:
            line += " "
        line = line.ljust(start) + value
    return line


def _extra_header(baseline: bool, cpu: bool) -> str:
    return (CPU_HEADER if cpu else "") + (RAW_CPU_HEADER if cpu and baseline else "")


def _repeat_header(baseline: bool, repeat: int, figure_header: str) -> str:
    if repeat <= 1:
        return ""
    return REPEAT_HEADER if baseline else figure_header


def _columns(
    first: str, baseline_header: str, figure_header: str, baseline: bool, cpu: bool, repeat: int
) -> str:
    """A table's column line: perftest's columns, then the ones the options add."""
    return (
        first
        + (baseline_header if baseline else "")
        + _extra_header(baseline, cpu)
        + _repeat_header(baseline, repeat, figure_header)
    )


def bw_header(baseline: bool, cpu: bool = False, repeat: int = 1) -> str:
    """The bandwidth table's column line (perftest's ``*_bw``, then the extra columns)."""
    return _columns(BW_HEADER, BW_BASELINE_HEADER, REPEAT_BW_HEADER, baseline, cpu, repeat)


def lat_header(baseline: bool, cpu: bool = False, repeat: int = 1) -> str:
    """The latency table's column line (perftest's ``*_lat``, then the extra columns)."""
    return _columns(LAT_HEADER, LAT_BASELINE_HEADER, REPEAT_LAT_HEADER, baseline, cpu, repeat)


def _repeat_columns(
    result: BwResult | LatResult, baseline: bool, repeat: int, figure_name: str
) -> tuple[list[str], list[str]]:
    """``--repeat``: how many runs the row was chosen from and the range they spanned."""
    if repeat <= 1:
        return [], []
    runs = result.repeats
    count = str(runs.runs) if runs is not None else "1"
    if baseline:
        span = runs.ratio_range if runs is not None else None
        text = f"{span[0]:.2f}-{span[1]:.2f}" if span is not None else "-"
        return ["runs", "ratio min-max"], [count, text]
    low, high = runs.value_range if runs is not None else (result.figure, result.figure)
    return ["runs", figure_name], [count, f"{low:.2f}-{high:.2f}"]


def _cpu_columns(
    result: BwResult | LatResult, baseline: bool, cpu: bool
) -> tuple[list[str], list[str]]:
    if not cpu:
        return [], []
    names, values = ["CPU cli/srv[usec/msg]"], [str(result.cpu or "-")]
    if baseline:
        names.append("raw CPU cli/srv[usec/msg]")
        values.append(str(result.raw_cpu or "-"))
    return names, values


def format_bw(result: BwResult, baseline: bool, cpu: bool = False, repeat: int = 1) -> str:
    """One bandwidth row under :func:`bw_header`."""
    values = [
        str(result.size),
        str(result.iterations),
        f"{result.bw_peak:.2f}",
        f"{result.bw_average:.2f}",
        f"{result.msg_rate:.6f}",
    ]
    names = list(BW_COLUMNS)
    if baseline:
        names += ["raw TCP[MB/sec]", "ratio", "blocking[MB/sec]", "ratio_blk"]
        values += [
            f"{result.raw_bw or 0:.2f}",
            f"{result.ratio or 0:.2f}",
            f"{result.blocking_bw or 0:.2f}",
            f"{result.ratio_blocking or 0:.2f}",
        ]
    cpu_names, cpu_values = _cpu_columns(result, baseline, cpu)
    rep_names, rep_values = _repeat_columns(result, baseline, repeat, "BW min-max[MB/sec]")
    return _row(
        bw_header(baseline, cpu, repeat),
        names + cpu_names + rep_names,
        values + cpu_values + rep_values,
    )


def format_lat(result: LatResult, baseline: bool, cpu: bool = False, repeat: int = 1) -> str:
    """One latency row under :func:`lat_header`."""
    values = [str(result.size), str(result.iterations)] + [
        f"{v:.2f}"
        for v in (
            result.t_min,
            result.t_max,
            result.t_typical,
            result.t_avg,
            result.t_stdev,
            result.p99,
            result.p999,
        )
    ]
    names = list(LAT_COLUMNS)
    if baseline:
        names += ["raw t_typical[usec]", "ratio", "blocking t_typical[usec]", "ratio_blk"]
        values += [
            f"{result.raw_typical or 0:.2f}",
            f"{result.ratio or 0:.2f}",
            f"{result.blocking_typical or 0:.2f}",
            f"{result.ratio_blocking or 0:.2f}",
        ]
    cpu_names, cpu_values = _cpu_columns(result, baseline, cpu)
    figure = "t_typical min-max[usec]"
    rep_names, rep_values = _repeat_columns(result, baseline, repeat, figure)
    return _row(
        lat_header(baseline, cpu, repeat),
        names + cpu_names + rep_names,
        values + cpu_values + rep_values,
    )


def header_block(
    opts: BenchOptions, neg: Negotiated, layout: str, emss: int | None = None
) -> list[str]:
    """perftest's opening block: test name and the connection's parameters.

    ``emss``: the EMSS the connection derived its MULPDU from at connect (MPA-13; the
    socket's MSS, followed as it grows, unless ``--mtu`` fixed it); None prints what the
    options asked for.
    """
    kind = "Latency" if opts.latency else "BW"
    title = f"{TEST_NAMES[opts.test]} {kind} Test"

    def pair(left: str, lval: object, right: str, rval: object) -> str:
        return f" {left:<16}: {lval!s:<14}{right:<15}: {rval}"

    def one(name: str, value: object) -> str:
        return f" {name:<16}: {value}"

    markers = f"{'ON' if neg.markers_tx else 'OFF'} (to server), "
    markers += f"{'ON' if neg.markers_rx else 'OFF'} (to client)"
    if opts.emss:
        mtu = f"{opts.emss}[B] (EMSS)"
    elif emss:  # the socket's, read again as it grows (stack.transport.driver)
        mtu = f"{emss}[B] at connect (EMSS: the socket's MSS, followed)"
    else:
        mtu = "the socket's MSS (EMSS, followed)"
    return [
        RESULT_LINE,
        title.center(len(RESULT_LINE)).rstrip(),
        pair("Number of qps", opts.num_qps, "Transport type", TRANSPORT),
        pair("Connection type", "RC", "Using SRQ", "OFF"),
        pair("MPA revision", neg.rev, "CRC", "ON" if neg.crc else "OFF"),
        one("Markers", markers),
        one("Mtu", f"{mtu}, MULPDU {neg.mulpdu}[B]"),
        one("TX depth", 1 if opts.latency else opts.tx_depth),
        one("Post list", opts.post_list),
        one("CQ Moderation", 1 if opts.latency else opts.cq_mod),
        one("Outstand reads", opts.ord if opts.test in ("read", "atomic") else "-"),
        one("Data ex. method", "MPA private data"),
        *(
            [one("Driver", "blocking, both ends (stack.transport.blocking)")]
            if opts.blocking
            else []
        ),
        one("Server", layout),
        *(
            [one("CPUs", f"client {opts.cpus[0]}, server {opts.server_cpu} (--cpus)")]
            if opts.cpus is not None
            else []
        ),
        *baseline_lines(opts),
        *repeat_lines(opts),
        RESULT_LINE,
    ]


BASELINE_SHAPES = {
    "write": "a stream of the same bytes, up to tx depth messages per send",
    "send": "a stream of the same bytes, up to tx depth messages per send",
    "read": "pipelined request/response, the same depth, replies batched",
    "atomic": "pipelined request/response of 8-octet replies, the same depth, batched",
}
"""What each test's baselines do (:mod:`stack.bench.baseline`, :mod:`stack.bench.blocking`)."""


def baseline_shape(opts: BenchOptions) -> str:
    """The exchange both baselines run for ``opts``."""
    return "the same exchange, one at a time" if opts.latency else BASELINE_SHAPES[opts.test]


def _receive_note(opts: BenchOptions) -> str:
    """How the raw baseline reads (:func:`~stack.bench.baseline.raw_receive_sizes`)."""
    if opts.latency:
        return ""
    sizes = [f"{n // 1024}" for n in raw_receive_sizes(opts)]
    if len(sizes) == 1:
        return f"; {sizes[0]} KiB per read"
    return f"; {' and '.join(sizes)} KiB per read, the faster run"


def baseline_lines(opts: BenchOptions) -> list[str]:
    """The opening block's lines that say what ``ratio`` and ``ratio_blk`` compare with."""
    if not opts.baseline:
        return []
    return [
        f" {'ratio':<16}: iWARP / raw trio TCP ({baseline_shape(opts)}{_receive_note(opts)};"
        " send and recv_into on the socket, as the driver)",
        f" {'ratio_blk':<16}: iWARP / blocking sockets (sendall/recv_into, both ends)",
    ]


def repeat_lines(opts: BenchOptions) -> list[str]:
    """The opening block's line that says how ``--repeat`` chose each row."""
    if opts.repeat <= 1:
        return []
    if opts.baseline:
        how = "iWARP then its baselines each time; the row is the run with the median ratio"
    else:
        figure = "t_typical" if opts.latency else "BW average"
        how = f"the row is the run with the median {figure}"
    return [f" {'Repeats':<16}: {opts.repeat} runs per size, {how}"]


def format_idle(r: IdleResult, layout: str) -> list[str]:
    """The idle-QP memory table, opening block included."""
    lines = [
        RESULT_LINE,
        "Idle QP memory".center(len(RESULT_LINE)).rstrip(),
        f" {'Transport type':<16}: {TRANSPORT}",
        f" {'Server':<16}: {layout}",
        f" {'Method':<16}: server RSS growth over {r.qps} idle connected QPs / {r.qps}",
    ]
    if r.shared_process:
        lines.append(f" {'Note':<16}: client and server share one process: both ends counted")
    values = [
        str(r.qps),
        str(r.server_before // 1024),
        str(r.server_after // 1024),
        f"{r.per_qp / 1024:.2f}",
        f"{r.client_per_qp / 1024:.2f}",
    ]
    lines += [RESULT_LINE, IDLE_HEADER, _row(IDLE_HEADER, IDLE_COLUMNS, values), RESULT_LINE]
    return lines
