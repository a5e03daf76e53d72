"""CRC32c backends and the MPA CRC field (RFC 5044 §4.4 and Appendix B, MPA-12)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stack import crc
from stack.constants import MPA_CRC_RESIDUE
from stack.crc import crc32c_crcmod, crc32c_hw, crc_field, crc_from_field

# Digest §2.4 table: (input, CRC32C value, wire bytes).
FIG5_COVERED = (
    bytes(4)  # marker, FPDUPTR 0
    + bytes.fromhex("002a 4143 00000000 00000000 00000001 00000000")
    + bytes(24)
)
VECTORS = [
    pytest.param(bytes(32), 0x8A9136AA, "aa 36 91 8a", id="32x00"),
    pytest.param(b"\xff" * 32, 0x62A8AB43, "43 ab a8 62", id="32xFF"),
    pytest.param(bytes(range(32)), 0x46DD794E, "4e 79 dd 46", id="incrementing"),
    pytest.param(bytes(range(31, -1, -1)), 0x113FDB5C, "5c db 3f 11", id="decrementing"),
    pytest.param(b"123456789", 0xE3069283, "83 92 06 e3", id="check"),
    pytest.param(FIG5_COVERED, 0x83992352, "52 23 99 83", id="rfc5044-fig5"),
]

BACKENDS = [pytest.param(crc32c_crcmod, id="crcmod")]
if crc32c_hw is not None:
    BACKENDS.append(pytest.param(crc32c_hw, id="crc32c"))


def test_both_backends_present() -> None:
    """The project runs on the hardware backend; crcmod is the fallback."""
    assert crc32c_hw is not None
    assert crc.BACKEND == "crc32c"


@pytest.mark.parametrize("fn", BACKENDS)
@pytest.mark.parametrize(("data", "value", "wire"), VECTORS)
def test_mpa_12_crc_vectors(fn, data: bytes, value: int, wire: str) -> None:
    assert fn(data) == value


@pytest.mark.parametrize(("data", "value", "wire"), VECTORS)
def test_mpa_12_crc_field_is_lsb_first(data: bytes, value: int, wire: str) -> None:
    assert crc_field(data) == bytes.fromhex(wire)
    assert crc_from_field(bytes.fromhex(wire)) == value


@pytest.mark.parametrize(("data", "value", "wire"), VECTORS)
def test_mpa_12_crc_residue(data: bytes, value: int, wire: str) -> None:
    """CRC32c over the covered bytes followed by the field is the constant residue."""
    assert crc.crc32c(data + crc_field(data)) == MPA_CRC_RESIDUE


@pytest.mark.parametrize("fn", BACKENDS)
def test_mpa_12_crc_running_value_and_buffer_types(fn) -> None:
    data = bytes(range(256)) * 5
    whole = fn(data)
    assert fn(data[700:], fn(data[:700])) == whole
    assert fn(bytearray(data)) == whole
    assert fn(memoryview(data)) == whole


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2048), st.integers(0, 0xFFFFFFFF))
def test_mpa_12_backends_agree(data: bytes, start: int) -> None:
    assert crc32c_crcmod(data, start) == crc32c_hw(data, start)
