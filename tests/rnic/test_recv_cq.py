"""A QP created with a separate receive CQ reports receives there, even when it is empty.

Regression: ``CompletionQueue`` has ``__len__``, so ``recv_cq or send_cq`` took an EMPTY
receive CQ for false and sent receive completions to the send CQ.
"""

from __future__ import annotations

from stack.rnic import Access, RecvWR, Rnic, Sge, WcOpcode, WcStatus


def test_empty_recv_cq_gets_receive_completions() -> None:
    rnic = Rnic()
    pd = rnic.alloc_pd()
    send_cq, recv_cq = rnic.create_cq(), rnic.create_cq()
    qp = rnic.create_qp(pd, send_cq, recv_cq)
    assert qp.recv_cq is recv_cq
    mr = pd.reg_mr(bytearray(16), Access.LOCAL_WRITE)
    qp.post_recv(RecvWR(7, (Sge(mr.base, 16, mr.lkey),)))
    qp.fatal(None, send_terminate=False)  # flushes the posted receive
    [wc] = recv_cq.poll()
    assert (wc.wr_id, wc.status, wc.opcode) == (7, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV)
    assert len(send_cq) == 0


def test_without_recv_cq_receives_share_the_send_cq() -> None:
    rnic = Rnic()
    cq = rnic.create_cq()
    qp = rnic.create_qp(rnic.alloc_pd(), cq)
    assert qp.recv_cq is cq
