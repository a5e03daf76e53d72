"""perftest's result output for the ``-R`` peers: table rows, ``--report_gbits``, JSON.

The tables are :mod:`stack.bench.report`'s (perftest's layout).  ``--report_gbits``
prints bandwidth in Gb/s (10^9 bits) instead of MB/s (2^20 bytes), as perftest's
``report_fmt == GBS``.  ``--out_json FILE`` writes what perftest >= 4.5's ``--out_json``
writes: a ``test_info`` object and a ``results`` object of the last size, with perftest's
key names (``MsgSize``, ``n_iterations``, ``BW_peak``, ``t_typical``, ``percentile_99``,
...), but as valid JSON.
"""

from __future__ import annotations

import json
from dataclasses import replace

from stack.bench.report import BW_HEADER, LAT_HEADER, TEST_NAMES, format_bw, format_lat
from stack.bench.results import MB, BwResult, LatResult
from stack.peers.perftest.options import PerftestOptions

GBIT = 125_000_000
"""Bytes per second in one Gb/s (perftest's GBS format factor)."""
LAT_DUR_HEADER = " #bytes        #iterations       t_avg[usec]    tps average"
IB_MTU_BYTES = 1024
"""The path MTU we report, as siw on a 1500-byte netdev (``IB_MTU_1024``)."""


def bw_header(gbits: bool) -> str:
    return BW_HEADER.replace("[MB/sec]", "[Gb/sec]") if gbits else BW_HEADER


def bw_row(result: BwResult, gbits: bool) -> str:
    return format_bw(in_gbits(result) if gbits else result, False)


def in_gbits(result: BwResult) -> BwResult:
    """The row with its bandwidth in Gb/s instead of MB/s."""
    factor = MB / GBIT
    return replace(result, bw_peak=result.bw_peak * factor, bw_average=result.bw_average * factor)


def lat_header(duration: bool) -> str:
    return LAT_DUR_HEADER if duration else LAT_HEADER


def lat_row(result: LatResult, duration: bool) -> str:
    """A latency row; in ``-D`` mode perftest prints the average and transactions/s."""
    if not duration:
        return format_lat(result, False)
    tps = 1e6 / result.t_avg if result.t_avg else 0.0
    return (
        f" {result.size:<7}       {result.iterations:<13}     {result.t_avg:<7.2f}        {tps:.2f}"
    )


def test_label(opts: PerftestOptions) -> str:
    """perftest's ``test`` value: ``RDMA_Write_BW_Test``, ``Send_Latency_Test``, ..."""
    name = TEST_NAMES[opts.test].replace(" ", "_")
    return f"{name}_{'Latency' if opts.latency else 'BW'}_Test"


def test_info(opts: PerftestOptions) -> dict[str, object]:
    """The ``test_info`` object (perftest's ``write_test_info_to_file`` keys)."""
    info: dict[str, object] = {
        "test": test_label(opts),
        "Dual_port": "OFF",
        "Device": "iwarp (userspace)",
        "Number_of_qps": opts.num_qps,
        "Transport_type": "IW",
        "Connection_type": "RC",
        "Using_SRQ": "OFF",
    }
    if not opts.latency and opts.host is not None:
        info["TX_depth"] = opts.tx_depth
    if opts.test == "send":
        info["RX_depth"] = opts.rx_depth
    if not opts.latency:
        info["CQ_Moderation"] = opts.cq_mod
    info["Mtu"] = IB_MTU_BYTES
    info["Link_type"] = "Ethernet"
    if opts.test in ("read", "atomic"):
        info["Outstand_reads"] = opts.out_reads
    info["rdma_cm_QPs"] = "ON"
    info["Data_ex_method"] = "rdma_cm"
    return info


def results_object(result: BwResult | LatResult, opts: PerftestOptions) -> dict[str, object]:
    """The ``results`` object of one row (perftest's ``REPORT_FMT_*_JSON`` keys)."""
    if isinstance(result, BwResult):
        row = in_gbits(result) if opts.report_gbits else result
        return {
            "MsgSize": row.size,
            "n_iterations": row.iterations,
            "BW_peak": round(row.bw_peak, 6 if opts.report_gbits else 2),
            "BW_average": round(row.bw_average, 6 if opts.report_gbits else 2),
            "MsgRate": round(row.msg_rate, 6),
        }
    if opts.duration is not None:
        tps = 1e6 / result.t_avg if result.t_avg else 0.0
        return {
            "MsgSize": result.size,
            "n_iterations": result.iterations,
            "t_avg": round(result.t_avg, 2),
            "tps_average": round(tps, 2),
        }
    return {
        "MsgSize": result.size,
        "n_iterations": result.iterations,
        "t_min": round(result.t_min, 2),
        "t_max": round(result.t_max, 2),
        "t_typical": round(result.t_typical, 2),
        "t_avg": round(result.t_avg, 2),
        "t_stdev": round(result.t_stdev, 2),
        "percentile_99": round(result.p99, 2),
        "percentile_99.9": round(result.p999, 2),
    }


def write_json(path: str, opts: PerftestOptions, result: BwResult | LatResult) -> None:
    """Write ``--out_json``'s file for the last row (perftest rewrites it per size)."""
    document = {"test_info": test_info(opts), "results": results_object(result, opts)}
    with open(path, "w", encoding="utf-8") as out:
        json.dump(document, out, indent=1)
        out.write("\n")
