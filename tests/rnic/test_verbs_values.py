"""Work-completion values as rdma-core has them: ``enum ibv_wc_status``/``ibv_wc_opcode``
integers and ``ibv_wc_status_str`` texts, so code and logs compare across the two."""

from __future__ import annotations

from stack.rnic import WC_STATUS_TEXT, WcOpcode, WcStatus, wc_status_str


def test_status_values_and_texts_are_rdma_cores() -> None:
    assert [s.value for s in WcStatus] == list(range(22))
    assert (WcStatus.WR_FLUSH_ERR, WcStatus.REM_ACCESS_ERR, WcStatus.GENERAL_ERR) == (5, 10, 21)
    assert WcStatus.WR_FLUSH_ERR.text == "Work Request Flushed Error"
    assert str(WcStatus.MW_BIND_ERR) == "memory management operation error"
    assert wc_status_str(10) == "remote access error" and wc_status_str(99) == "unknown"
    assert set(WC_STATUS_TEXT) == set(WcStatus)


def test_opcode_values_are_rdma_cores_with_the_receive_bit() -> None:
    assert (WcOpcode.SEND, WcOpcode.RDMA_READ, WcOpcode.FETCH_ADD, WcOpcode.LOCAL_INV) == (
        0, 2, 4, 6
    )  # fmt: skip
    assert WcOpcode.RECV == 0x80 and WcOpcode.RECV_RDMA_WITH_IMM == 0x81
    assert all(op & 0x80 for op in WcOpcode if op.name.startswith("RECV"))
    assert str(WcOpcode.RDMA_WRITE) == "RDMA_WRITE"
