"""tshark as an independent oracle for ``iwarp dissect`` (Debian's tshark decodes the same
captures on its own).

Shared by the tshark cross-check tests (tests/dissect/test_tshark_crosscheck.py) and the
interop suite, which holds every real siw capture against tshark too.  Where tshark 4.0.17
is reliable (MPA framing without markers or with one marker per FPDU, the CRC verdict,
every DDP field, RDMAP opcodes 0-7 and 10-11, Terminate fields, reassembly across
segments) our fields must equal tshark's, PDU by PDU, read from ``-T pdml`` (the only
output carrying the CRC verdict).
"""

from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from stack.dissect import record_json
from stack.dissect.decoder import DissectOptions, PduRecord, dissect
from stack.pcap import read_tcp_segments

TSHARK = shutil.which("tshark")
OPTIONS = [
    "--disable-heuristic",
    "rpcrdma_iwarp",
    "--disable-heuristic",
    "smb_direct_iwarp",
    "-o",
    "iwarp_ddp_rdmap.reassemble_iwarp_rdma_send:FALSE",
]


# ======================================================================================
# reading tshark's PDML
# ======================================================================================


def _fields(element: ET.Element, out: dict[str, list[ET.Element]]) -> None:
    for field in element.findall("field"):
        out.setdefault(field.get("name", ""), []).append(field)
        _fields(field, out)


def tshark_pdus(tshark: str, path: Path) -> list[dict[str, Any]]:
    """Every MPA PDU tshark dissected, in order: {'frame', 'kind', 'f': {name: [fields]}}."""
    proc = subprocess.run(
        [tshark, "-n", "-r", str(path), *OPTIONS, "-T", "pdml"],
        capture_output=True,
        check=True,
    )
    pdus: list[dict[str, Any]] = []
    for packet in ET.fromstring(proc.stdout).findall("packet"):
        frame = 0
        for proto in packet.findall("proto"):
            name = proto.get("name")
            if name == "frame":
                for f in proto.iter("field"):
                    if f.get("name") == "frame.number":
                        frame = int(f.get("show", "0"))
            elif name == "iwarp_mpa":
                fields: dict[str, list[ET.Element]] = {}
                _fields(proto, fields)
                kind = "mpa_req" if "iwarp_mpa.req" in fields else (
                    "mpa_rep" if "iwarp_mpa.rep" in fields else "fpdu"
                )  # fmt: skip
                pdus.append({"frame": frame, "kind": kind, "f": fields})
            elif name == "iwarp_ddp_rdmap" and pdus:
                _fields(proto, pdus[-1]["f"])
    return pdus


def field_show(pdu: dict[str, Any], name: str) -> str | None:
    fields = pdu["f"].get(name)
    return fields[0].get("show") if fields else None


def field_int(pdu: dict[str, Any], name: str) -> int | None:
    text = field_show(pdu, name)
    return None if text is None else int(text, 0)


def field_hex(pdu: dict[str, Any], name: str) -> str | None:
    fields = pdu["f"].get(name)
    return fields[0].get("value") if fields else None


def ours(path: Path, options: DissectOptions | None = None) -> list[dict[str, Any]]:
    recs = [r for r in dissect(read_tcp_segments(path.read_bytes()), options)
            if isinstance(r, PduRecord)]  # fmt: skip
    out = []
    for r in recs:
        j = record_json(r)
        j["_crc_field"] = r.crc_field
        out.append(j)
    return out


def compare(mine: dict[str, Any], theirs: dict[str, Any], crc_on: bool) -> None:
    """Our JSON record against tshark's fields for one PDU (only where tshark is right)."""
    where = f"frame {mine['frame']} {mine['type']}"
    assert mine["frame"] == theirs["frame"], where
    assert mine["type"] == theirs["kind"], where
    t = theirs
    if mine["type"] != "fpdu":
        assert field_int(t, "iwarp_mpa.marker_flag") == int(mine["marker_flag"]), where
        assert field_int(t, "iwarp_mpa.crc_flag") == int(mine["crc_flag"]), where
        assert field_int(t, "iwarp_mpa.rej_flag") == int(mine["rej_flag"]), where
        assert field_int(t, "iwarp_mpa.rev") == mine["rev"], where
        assert field_int(t, "iwarp_mpa.pdlength") == mine["pd_len"], where
        if mine["pd_len"]:
            assert field_hex(t, "iwarp_mpa.privatedata") == mine["private_data"], where
        return
    assert field_int(t, "iwarp_mpa.ulpdulength") == mine["ulpdu_len"], where
    if crc_on:
        (check,) = t["f"]["iwarp_mpa.crc_check"]
        good = "Good CRC32" in check.get("showname", "")
        assert good is mine["crc_ok"], where
        # tshark shows the big-endian reading of the LSB-first wire bytes (tshark 4.0.17)
        assert int(check.get("show"), 16) == int.from_bytes(
            mine["_crc_field"].to_bytes(4, "little"), "big"
        ), where
    else:
        assert mine["crc_ok"] is None and "iwarp_mpa.crc" in t["f"], where
    if mine["markers"]:
        ptrs = [int(f.get("show"), 0) for f in t["f"].get("iwarp_mpa.marker_fpduptr", [])]
        assert ptrs == mine["marker_ptrs"], where
    assert field_int(t, "iwarp_ddp.tagged_flag") == int(mine["tagged"]), where
    assert field_int(t, "iwarp_ddp.last_flag") == int(mine["last"]), where
    assert field_int(t, "iwarp_ddp.dv") == mine["ddp_version"], where
    assert field_int(t, "iwarp_rdma.version") == mine["rdmap_version"], where
    assert field_int(t, "iwarp_rdma.opcode") == mine["opcode"], where
    if mine["tagged"]:
        assert field_int(t, "iwarp_ddp.stag") == mine["stag"], where
        assert field_int(t, "iwarp_ddp.tagged_offset") == mine["to"], where
    else:
        assert field_int(t, "iwarp_ddp.qn") == mine["qn"], where
        assert field_int(t, "iwarp_ddp.msn") == mine["msn"], where
        assert field_int(t, "iwarp_ddp.mo") == mine["mo"], where
    op = mine["opcode"]
    if op in (4, 6):
        assert field_int(t, "iwarp_rdma.inval_stag") == mine["inval_stag"], where
    if op == 1:
        for theirs_name, my_name in (
            ("iwarp_rdma.sinkstag", "read_sink_stag"),
            ("iwarp_rdma.sinkto", "read_sink_to"),
            ("iwarp_rdma.rdmardsz", "read_size"),
            ("iwarp_rdma.srcstag", "read_src_stag"),
            ("iwarp_rdma.srcto", "read_src_to"),
        ):
            assert field_int(t, theirs_name) == mine[my_name], (where, my_name)
    if op == 7:
        _compare_terminate(mine, t, where)
    if op == 10:
        assert field_int(t, "iwarp_rdma.atomic.opcode") == mine["atomic_opcode"], where
        assert field_int(t, "iwarp_rdma.atomic.request_identifier") == mine["atomic_req_id"], where
        assert field_int(t, "iwarp_rdma.atomic.remote_stag") == mine["atomic_remote_stag"], where
        remote_to = field_int(t, "iwarp_rdma.atomic.remote_tagged_offset")
        assert remote_to == mine["atomic_remote_to"], where
        data = field_int(t, "iwarp_rdma.atomic.add_data") or field_int(
            t, "iwarp_rdma.atomic.swap_data"
        )
        assert data == mine["atomic_add_swap_data"], where
        assert field_int(t, "iwarp_rdma.atomic.compare_data") == mine["atomic_compare_data"], where
        assert field_int(t, "iwarp_rdma.atomic.compare_mask") == mine["atomic_compare_mask"], where
    if op == 11:
        orig_id = field_int(t, "iwarp_rdma.atomic.original_request_identifier")
        assert orig_id == mine["atomic_orig_req_id"], where
        value = field_int(t, "iwarp_rdma.atomic.original_remote_data_value")
        assert value == mine["atomic_orig_value"], where


def _compare_terminate(mine: dict[str, Any], t: dict[str, Any], where: str) -> None:
    assert field_int(t, "iwarp_rdma.term_layer") == mine["term_layer"], where
    etype = next(
        field_int(t, n)
        for n in ("iwarp_rdma.term_etype_rdma", "iwarp_rdma.term_etype_ddp",
                  "iwarp_rdma.term_etype_llp", "iwarp_rdma.term_etype")
        if n in t["f"]
    )  # fmt: skip
    assert etype == mine["term_etype"], where
    code = next(
        field_int(t, n)
        for n in ("iwarp_rdma.term_errcode_rdma", "iwarp_rdma.term_errcode_ddp_tagged",
                  "iwarp_rdma.term_errcode_ddp_untagged", "iwarp_rdma.term_errcode_llp",
                  "iwarp_rdma.term_errcode")
        if n in t["f"]
    )  # fmt: skip
    assert code == mine["term_errcode"], where
    assert field_int(t, "iwarp_rdma.term_hdrct_m") == int(mine["term_m"]), where
    assert field_int(t, "iwarp_rdma.hdrct_d") == int(mine["term_d"]), where
    assert field_int(t, "iwarp_rdma.hdrct_r") == int(mine["term_r"]), where
    if mine["term_d"]:
        seg_len = field_hex(t, "iwarp_rdma.term_ddp_seg_len")
        assert seg_len is not None and int(seg_len, 16) == mine["term_ddp_seg_len"], where
        copied = field_hex(t, "iwarp_rdma.term_ddp_h")
        if (mine["term_layer"], mine["term_etype"]) == (0, 1):
            # tshark sizes the copied header by EType 1 = "tagged": 14 bytes (tshark 4.0.17)
            assert copied == mine["term_ddp_hdr"][:28], where
        else:
            assert copied == mine["term_ddp_hdr"], where


def tshark_reliable(mine: list[dict[str, Any]]) -> bool:
    """False for captures tshark 4.0.17 misdecodes: markers (8a-8f: several per FPDU,
    one direction only, several FPDUs per marked segment, FPDUs ending on a boundary; the
    single-marker cases are cross-checked by test_single_markers_agree_with_tshark), an
    FPDU in the Reply's segment, or no MPA startup (mid-stream), on any of its streams."""
    streams = {r["stream"] for r in mine}
    frames: dict[str, set[tuple[int, int]]] = {r["type"]: set() for r in mine}
    for r in mine:
        frames[r["type"]].add((r["stream"], r["frame"]))
        if r["type"] != "fpdu" and r["marker_flag"]:
            return False
    for kind in ("mpa_req", "mpa_rep"):
        if {stream for stream, _ in frames.get(kind, ())} != streams:
            return False
    return not frames.get("fpdu", set()) & frames["mpa_rep"]


def check_against_tshark(tshark: str, path: Path) -> int:
    """Our decode of ``path`` equals tshark's, PDU by PDU; the number of PDUs compared
    (0 when the capture is one tshark misdecodes, see :func:`tshark_reliable`)."""
    mine = ours(path)
    if not mine or not tshark_reliable(mine):
        return 0
    theirs = tshark_pdus(tshark, path)
    crc_on = any(r["crc_ok"] is not None for r in mine if r["type"] == "fpdu")
    assert len(mine) == len(theirs), f"{path.name}: {len(mine)} PDUs, tshark {len(theirs)}"
    for m, t in zip(mine, theirs, strict=True):
        compare(m, t, crc_on)
    return len(mine)
