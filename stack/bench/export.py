"""``--json`` documents of ``iwarp bench``: built from the result rows the tables print.

Units are in the key names: ``mib_per_s`` (2^20 B/s, perftest's MB/sec), ``gbit_per_s``
(10^9 bit/s), ``msg_per_s``, ``us_*`` (microseconds; ``us_p50`` is perftest's t_typical,
the median), ``us_per_msg`` (CPU time).  ``ratio`` is iWARP over the run's own baseline,
named in ``baseline`` (bandwidth: above 1 is better; latency: below 1 is better);
``ratio_blocking`` is iWARP over the blocking-socket baseline, figures under ``blocking``.
With ``--repeat`` a row is the run with the median ratio and ``repeats`` lists every run.
"""

from __future__ import annotations

from typing import Any

from stack.bench.codec import CodecResult
from stack.bench.options import BenchOptions
from stack.bench.report import TEST_NAMES, TRANSPORT, baseline_shape
from stack.bench.results import MB, BwResult, CpuCost, IdleResult, LatResult, Repeats
from stack.bench.run import BenchRecord
from stack.cli.json_report import schema

RAW_TCP = "raw trio TCP"
BLOCKING_TCP = "blocking sockets"


def _cpu(prefix: str, cost: CpuCost | None) -> dict[str, float | None]:
    if cost is None:
        return {}
    return {
        f"{prefix}client_us_per_msg": cost.client,
        f"{prefix}server_us_per_msg": cost.server,
        f"{prefix}shared_process": cost.server is None,
    }


def _repeats(runs: Repeats | None, figure_key: str) -> dict[str, Any]:
    """``--repeat``: every run of the row's size, in run order (the row is the median)."""
    if runs is None:
        return {}
    doc: dict[str, Any] = {"runs": runs.runs, "figure": figure_key, "values": list(runs.values)}
    if runs.ratios:
        doc["ratios"] = list(runs.ratios)
        doc["ratio_min"], doc["ratio_max"] = runs.ratio_range or (None, None)
    return {"repeats": doc}


def gbit_per_s(mib_per_s: float) -> float:
    """perftest's MB/sec (2^20 B/s) in 10^9 bit/s."""
    return mib_per_s * MB * 8 / 1e9


def bw_row(r: BwResult) -> dict[str, Any]:
    """One bandwidth row: iWARP's figures, then the baseline's under ``baseline``."""
    row: dict[str, Any] = {
        "size_bytes": r.size,
        "iterations_per_qp": r.iterations,
        "messages": r.messages,
        "bw_peak_mib_per_s": r.bw_peak,
        "bw_average_mib_per_s": r.bw_average,
        "gbit_per_s": gbit_per_s(r.bw_average),
        "msg_per_s": r.msg_rate * 1e6,
    }
    row.update(_cpu("cpu_", r.cpu))
    if r.raw_bw is not None:
        row["baseline"] = {**_baseline_bw(r.raw_bw, r.size), **_cpu("cpu_", r.raw_cpu)}
        row["ratio"] = r.ratio
    if r.blocking_bw is not None:
        row["blocking"] = _baseline_bw(r.blocking_bw, r.size)
        row["ratio_blocking"] = r.ratio_blocking
    row.update(_repeats(r.repeats, "bw_average_mib_per_s"))
    return row


def _baseline_bw(mib_per_s: float, size: int) -> dict[str, float]:
    """A baseline's bandwidth figures, keyed as iWARP's."""
    return {
        "bw_average_mib_per_s": mib_per_s,
        "gbit_per_s": gbit_per_s(mib_per_s),
        "msg_per_s": mib_per_s * MB / size,
    }


def lat_row(r: LatResult) -> dict[str, Any]:
    """One latency row (microseconds)."""
    row: dict[str, Any] = {
        "size_bytes": r.size,
        "iterations": r.iterations,
        "us_min": r.t_min,
        "us_max": r.t_max,
        "us_p50": r.t_typical,
        "us_avg": r.t_avg,
        "us_stdev": r.t_stdev,
        "us_p99": r.p99,
        "us_p999": r.p999,
    }
    row.update(_cpu("cpu_", r.cpu))
    if r.raw_typical is not None:
        row["baseline"] = {"us_p50": r.raw_typical, **_cpu("cpu_", r.raw_cpu)}
        row["ratio"] = r.ratio
    if r.blocking_typical is not None:
        row["blocking"] = {"us_p50": r.blocking_typical}
        row["ratio_blocking"] = r.ratio_blocking
    row.update(_repeats(r.repeats, "us_p50"))
    return row


def rdma_document(
    opts: BenchOptions, record: BenchRecord, exit_status: int, error: str | None = None
) -> dict[str, Any]:
    """``iwarp bench write|read|send|atomic --json``: parameters, connection, rows, verdict."""
    neg = record.negotiated
    connection = None
    if neg is not None:
        connection = {
            "transport": TRANSPORT,
            "mpa_revision": neg.rev,
            "crc": neg.crc,
            "markers_to_server": neg.markers_tx,
            "markers_to_client": neg.markers_rx,
            "mulpdu_bytes": neg.mulpdu,
            "server": record.layout,
        }
    baseline = None
    if opts.baseline:
        baseline = {
            "name": RAW_TCP,
            "shape": baseline_shape(opts),
            "same_run": True,
            "second": {"name": BLOCKING_TCP, "key": "blocking", "ratio_key": "ratio_blocking"},
        }
    return {
        "schema": schema(f"iwarp bench {opts.test}"),
        "command": f"iwarp bench {opts.test}",
        "test": TEST_NAMES[opts.test],
        "kind": "latency" if opts.latency else "bandwidth",
        "parameters": {
            "sizes_bytes": list(opts.sizes),
            "iters": opts.iters,
            "duration_s": opts.duration,
            "qps": opts.num_qps,
            "post_list": opts.post_list,
            "cq_mod": 1 if opts.latency else opts.cq_mod,
            "tx_depth": 1 if opts.latency else opts.tx_depth,
            "rx_depth": opts.rx_depth,
            "crc_requested": opts.crc,
            "markers_requested": opts.markers,
            "emss_bytes": opts.emss,
            "mode": opts.mode,
            "baseline": opts.baseline,
            "cpu": opts.cpu,
            "repeat": opts.repeat,
            "driver": "blocking" if opts.blocking else "trio",
            "cpus": None
            if opts.cpus is None
            else {"client": opts.cpus[0], "server": opts.server_cpu},
        },
        "connection": connection,
        "baseline": baseline,
        "results": [lat_row(r) if isinstance(r, LatResult) else bw_row(r) for r in record.results],
        "exit_status": exit_status,
        "verdict": "error" if error else "ok",
        "error": error,
    }


def codec_document(
    parameters: dict[str, Any], results: list[CodecResult], exit_status: int
) -> dict[str, Any]:
    """``iwarp bench codec --json``: encode/decode against the crc32c + copy baseline."""
    rows = [
        {
            "size_bytes": r.size,
            "markers": r.markers,
            "encode_mb_per_s": r.encode,
            "decode_mb_per_s": r.decode,
            "encode_gbit_per_s": r.encode * 8e-3,
            "decode_gbit_per_s": r.decode * 8e-3,
            "baseline": {"mb_per_s": r.baseline, "gbit_per_s": r.baseline * 8e-3},
            "ratio": r.ratio,
        }
        for r in results
    ]
    return {
        "schema": schema("iwarp bench codec"),
        "command": "iwarp bench codec",
        "parameters": parameters,
        "baseline": {
            "name": "crc32c + copy",
            "shape": "one CRC32c over the ULPDU and one copy of it per FPDU",
            "same_run": True,
        },
        "ratio_is": "min(encode, decode) / baseline",
        "results": rows,
        "exit_status": exit_status,
        "verdict": "ok" if exit_status == 0 else "error",
    }


def idle_document(
    parameters: dict[str, Any],
    result: IdleResult | None,
    exit_status: int,
    error: str | None = None,
) -> dict[str, Any]:
    """``iwarp bench idle-qps --json``: server (and client) RSS growth per idle QP."""
    row = None
    if result is not None:
        row = {
            "qps": result.qps,
            "server_rss_before_bytes": result.server_before,
            "server_rss_after_bytes": result.server_after,
            "per_qp_bytes": result.per_qp,
            "client_per_qp_bytes": result.client_per_qp,
            "shared_process": result.shared_process,
        }
    return {
        "schema": schema("iwarp bench idle-qps"),
        "command": "iwarp bench idle-qps",
        "parameters": parameters,
        "result": row,
        "exit_status": exit_status,
        "verdict": "error" if error else "ok",
        "error": error,
    }
