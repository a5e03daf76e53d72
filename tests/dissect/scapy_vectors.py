"""Reference FPDUs and frames for the Scapy layer tests, byte-exact with their CRCs.

E1-E9 are one FPDU each (CRC on, no markers), built independently of the layers and the
wire core; E10 is the marked FPDU of RFC 5044 Fig. 5 (a marker with FPDUPTR 0 opening
it).  FRAMES are RFC 6581 Request/Reply frames and a Rev 1 reject Reply.
"""

from __future__ import annotations

from hypothesis import strategies as st
from scapy.packet import Packet

from stack.constants import ALL_ONES_64
from stack.dissect.scapy import DDP_Tagged, DDP_Untagged, send_fpdu


def hx(text: str) -> bytes:
    return bytes.fromhex(text.replace("\n", " "))


HELLO = b"Hello, iWARP!"


E = {
    "E1": hx(
        "00 1f 41 43 00 00 00 00 00 00 00 00 00 00 00 01 00 00 00 00 48 65 6c 6c 6f 2c 20 69"
        " 57 41 52 50 21 00 00 00 13 43 08 1e"
    ),
    "E2": hx("00 16 c1 40 00 ab cd ef 00 00 00 00 00 00 10 00 01 02 03 04 05 06 07 08 50 c1 0c dc"),
    "E3": hx(
        "00 2e 41 41 00 00 00 00 00 00 00 01 00 00 00 01 00 00 00 00 11 22 33 44 00 00 00 00"
        " 00 00 20 00 00 00 10 00 55 66 77 88 00 00 00 00 00 00 30 00 16 66 7b d9"
    ),
    "E4": hx("00 0e c1 40 00 00 00 01 00 00 00 00 00 00 00 00 eb d3 4c 5f"),
    "E5": hx(
        "00 2a 41 47 00 00 00 00 00 00 00 02 00 00 00 01 00 00 00 00 12 03 c0 00 00 1f 41 43"
        " 00 00 00 00 00 00 00 00 00 00 00 07 00 00 00 00 46 7c 16 52"
    ),
    "E6": hx(
        "00 46 41 47 00 00 00 00 00 00 00 02 00 00 00 01 00 00 00 00 01 00 e0 00 00 2e 41 41"
        " 00 00 00 00 00 00 00 01 00 00 00 01 00 00 00 00 11 22 33 44 00 00 00 00 00 00 20 00"
        " 00 00 10 00 55 66 77 88 00 00 00 00 00 00 30 00 ef 77 f6 c0"
    ),
    "E7": hx(
        "00 46 41 4a 00 00 00 00 00 00 00 01 00 00 00 01 00 00 00 00 00 00 00 00 de ad be ef"
        " 0a 0b 0c 0d 00 00 00 00 00 00 40 00 00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 00"
        " 00 00 00 00 00 00 00 00 ff ff ff ff ff ff ff ff fa df ca 51"
    ),
    "E8": hx(
        "00 1e 41 4b 00 00 00 00 00 00 00 03 00 00 00 01 00 00 00 00 de ad be ef 00 00 00 00"
        " 00 00 00 29 b0 f1 11 7e"
    ),
    "E9": hx(
        "00 1a 41 48 00 00 00 00 00 00 00 00 00 00 00 02 00 00 00 00 01 02 03 04 05 06 07 08"
        " a9 8a 5e 54"
    ),
    "E10": hx("00000000 002a 4143 00000000 00000000 00000001 00000000" + " 00" * 24 + " 52239983"),
}


KEY_TAIL = "4d 50 41 20 49 44 20 52 65 {} 20 46 72 61 6d 65"


FRAMES = {
    "req": hx(KEY_TAIL.format("71") + " 50 02 00 04 80 10 c0 10"),
    "rep": hx(KEY_TAIL.format("70") + " 50 02 00 04 80 10 80 10"),
    "rej": hx(KEY_TAIL.format("70") + " 60 01 00 00"),
}


E3_FIELDS = dict(sink_stag=0x11223344, sink_to=0x2000, size=0x1000, src_stag=0x55667788)


E3_FIELDS["src_to"] = 0x3000


def e5_offending() -> Packet:
    return send_fpdu(HELLO, msn=7)


def fields_of(pkt: Packet) -> dict[str, object]:
    """Every field value of one layer (payload excluded)."""
    return {f.name: pkt.getfieldval(f.name) for f in pkt.fields_desc}


DDP_EXPECT: dict[str, tuple[type[Packet], dict[str, int]]] = {
    "E1": (DDP_Untagged, dict(opcode=3, qn=0, msn=1, mo=0, inval_stag=0)),
    "E2": (DDP_Tagged, dict(opcode=0, stag=0x00ABCDEF, to=0x1000)),
    "E3": (DDP_Untagged, dict(opcode=1, qn=1, msn=1, mo=0)),
    "E4": (DDP_Tagged, dict(opcode=0, stag=1, to=0)),
    "E5": (DDP_Untagged, dict(opcode=7, qn=2, msn=1, mo=0)),
    "E6": (DDP_Untagged, dict(opcode=7, qn=2, msn=1, mo=0)),
    "E7": (DDP_Untagged, dict(opcode=0xA, qn=1, msn=1, mo=0)),
    "E8": (DDP_Untagged, dict(opcode=0xB, qn=3, msn=1, mo=0)),
    "E9": (DDP_Untagged, dict(opcode=8, qn=0, msn=2, mo=0)),
}


ULPDU_LEN = dict(E1=31, E2=22, E3=46, E4=14, E5=42, E6=70, E7=70, E8=30, E9=26)


PAD_LEN = dict(E1=3)


CRC = dict(
    E1=0x1E084313,
    E2=0xDC0CC150,
    E3=0xD97B6616,
    E4=0x5F4CD3EB,
    E5=0x52167C46,
    E6=0xC0F677EF,
    E7=0x51CADFFA,
    E8=0x7E11F1B0,
    E9=0x545E8AA9,
)


u32 = st.integers(min_value=0, max_value=0xFFFFFFFF)


u64 = st.integers(min_value=0, max_value=ALL_ONES_64)


bit = st.integers(min_value=0, max_value=1)
