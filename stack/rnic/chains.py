"""Work-request chains: a verbs extension for WAIT, ENABLE and execution-time patches.

Not in RFC 5040 or libibverbs; modelled on the WAIT/ENABLE work requests and self-modifying
WQEs of some RNICs.  A :class:`Chain` posted with ``qp.post_chain`` waits in the QP's *chain
queue* (apart from its send queue, which keeps working) for a trigger:

* :class:`WaitRecv`: the next receive completion of the QP.  While a QP has such a chain
  posted, its successful receive completions go to the chain queue first, in arrival order;
  one a chain runs on is consumed by it (never reaches the receive CQ) and re-posted by the
  RNIC when the chain has completed.
* :class:`WaitCq`: a completion queue has had ``count`` completions pushed.

A triggered chain picks the first :class:`Branch` whose :class:`Guard` s all hold and posts
that branch's work requests on the send queue (a :class:`LocalWrite` among them writes
registered memory once the WRs before it have completed; a :class:`LocalAtomic` runs an
RFC 7306 FetchAdd or CmpSwap there and stores the original value for later Refs; a
:class:`Check` evaluates guards at that point and, if one fails, *stops* the chain: it
falls back as below, what ran before it staying done).  Each :class:`Patch` replaces a
field of one of them when it reaches the head of the send queue (execution time), from a
:class:`Ref`: octets of the triggering receive, of the run's own scratch (``Ref.run``) or
of any registered memory, at an address that may itself be computed from another Ref.
Every Ref is read through the checks of a local SGE (lkey,
PD, bounds) and the patched WR is then checked as any other (local and remote STags,
rights, bounds), so a patch cannot reach memory its WR could not.

No branch holds: the chain *falls back*.  The receive completion goes to the receive CQ as
if no chain existed, and the chain queue stalls until the application calls
``qp.enable_chains()`` (ENABLE), so software handles the message before any later one.  A
``held`` chain also waits for ENABLE.  A run is *in flight* once it waits on its WRs or
has started every item; then a ``rearm`` chain goes back to the tail of the queue (or once
it fell back), and the next chain may trigger if it has a ``key`` whose value no run in
flight shares (runs of one key, and chains without a key, go one at a time).  A Ref
outside its MR fails the chain with LOC_PROT_ERR (a receive read past its message:
LOC_LEN_ERR) and, as for any WR failing locally, the QP is Terminated (RDMAP-12); nothing
of the failing WR has touched memory.  A QP that fails flushes its chains with
WR_FLUSH_ERR (opcode :attr:`~stack.rnic.verbs.WcOpcode.CHAIN`) and the receives they held.

A *deferred* :class:`LocalAtomic` runs once every receive that had arrived when its run's
latest WR left (was handed to the transport; with none, when it was reached) has been
examined: it triggered a run, or fell back and the application ENABLEd the queue again.
One posted with ``qp.post_deferred`` waits for the receives that have arrived by then.
Receives of the input being fed at that moment count as arrived, since they all came
before anything the RNIC sends in answer.  This is how a run returns a request credit:
its answer left after those requests arrived, so for them the credit is still out.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stack.constants import TERM_RDMAP_CATASTROPHIC
from stack.errors import RdmapError
from stack.rnic.chain_checks import check_chain
from stack.rnic.chain_items import (
    RECV,
    RECV_LEN,
    RUN,
    RUN_SCRATCH,
    Branch,
    Chain,
    ChainItem,
    Check,
    Cmp,
    Guard,
    LocalAtomic,
    LocalWrite,
    Patch,
    PatchField,
    Ref,
    WaitCq,
    WaitRecv,
)
from stack.rnic.chain_local import Reader, holds, patched, run_local
from stack.rnic.qp_base import _SENDING, _LocalWrError, _SqEntry
from stack.rnic.verbs import RecvWR, SendWR, Sge, WcOpcode, WcStatus, WorkCompletion

if TYPE_CHECKING:
    from stack.rnic.qp_send import QpSend

__all__ = [
    "RECV",
    "RECV_LEN",
    "RUN",
    "RUN_SCRATCH",
    "Branch",
    "Chain",
    "ChainItem",
    "ChainQueue",
    "ChainRun",
    "Check",
    "Cmp",
    "Guard",
    "LocalAtomic",
    "LocalWrite",
    "Patch",
    "PatchField",
    "Ref",
    "WaitCq",
    "WaitRecv",
]


@dataclass(slots=True)
class _Posted:
    chain: Chain
    held: bool


class ChainRun:
    """One triggered chain: resolves its WRs' patches and learns of their completions."""

    def __init__(
        self,
        queue: ChainQueue,
        posted: _Posted,
        branch: int,
        recv: tuple[RecvWR, bytes] | None,
        wc: WorkCompletion | None = None,
        read: Reader | None = None,
        key: int | None = None,
    ) -> None:
        self.queue = queue
        self.posted = posted
        self.branch = branch
        self.recv = recv
        self.wc = wc
        self.read = queue.reader(recv) if read is None else read
        self.key = key
        self.done = False
        self.rearmed = False
        self.index: dict[int, int] = {}
        self.left = 0
        self.next = 0  # the next item of the branch to start
        self.status = WcStatus.SUCCESS
        self.sent: list[int] | None = None
        """The queue's stamp when the run's latest WR left: a deferred item after it
        waits for the receives that had arrived by then."""

    def step(self) -> None:
        """Start the branch's items in order: WRs up to the next local item join the send
        queue; a local item (LocalWrite, LocalAtomic, Check) runs once every earlier WR has
        completed."""
        items = self.posted.chain.branches[self.branch].wrs
        qp = self.queue.qp
        while self.left == 0 and self.next < len(items):
            item = items[self.next]
            if not isinstance(item, SendWR):
                if isinstance(item, LocalAtomic) and item.deferred:
                    self.queue.defer(item, self.read, self.sent)
                    self.next += 1
                    continue
                try:
                    held = run_local(item, self.read)
                except _LocalWrError as exc:
                    self.status = exc.status
                    qp.fatal(
                        RdmapError(
                            "RDMAP-12",
                            f"chain {self.posted.chain.wr_id}: {exc}",
                            TERM_RDMAP_CATASTROPHIC,
                        ),
                        send_terminate=True,
                    )
                    return
                if not held:
                    self.queue.stopped(self, self.next)
                    return
                self.next += 1
                continue
            entries = []
            while self.next < len(items) and isinstance(items[self.next], SendWR):
                wr = items[self.next]
                assert isinstance(wr, SendWR)
                entry = _SqEntry(wr, int(wr.send_flags), chain=self)
                self.index[id(entry)] = self.next
                entries.append(entry)
                self.next += 1
            self.left = len(entries)
            qp._enqueue(entries)
        if self.queue.running is self and (self.left or self.next == len(items)):
            self.queue.issued(self)  # waiting on its WRs, or every item started
        if self.left == 0 and self.next == len(items):
            self.queue.finished(self)

    def resolve(self, entry: _SqEntry) -> None:
        """Apply the patches of ``entry``'s WR now, at execution time (raises _LocalWrError)."""
        self.sent = self.queue.stamp()  # the WR leaves now: what had arrived by then
        i = self.index[id(entry)]
        branch = self.posted.chain.branches[self.branch]
        patches = [p for p in branch.patches if p.wr == i]
        if patches:
            entry.wr = patched(entry.wr, patches, self.read)

    def wr_done(self, entry: _SqEntry) -> None:
        if entry.status is not WcStatus.SUCCESS and self.status is WcStatus.SUCCESS:
            self.status = entry.status
        self.left -= 1
        if self.left == 0:
            if self.status is not WcStatus.SUCCESS:
                self.queue.finished(self)
            else:
                self.step()


class ChainQueue:
    """The chain queue of one QP (created by its first ``post_chain``)."""

    def __init__(self, qp: QpSend) -> None:
        self.qp = qp
        self.waiting: deque[_Posted] = deque()
        self.recvs: deque[tuple[RecvWR, WorkCompletion, bytes]] = deque()
        self.running: ChainRun | None = None
        """The run whose items are not all started yet."""
        self.flight: list[ChainRun] = []
        """Runs whose items have all started, with WRs still outstanding."""
        self.stalled = False
        self._watched: set[int] = set()
        self.runs = 0
        """Chains that ran a branch (the RNIC's work, counted apart from the application's)."""
        self.fallbacks = 0
        """Chains that fell back to the application."""
        self.arrived = 0
        """Receives the queue has taken (:meth:`take_recv`)."""
        self.examined = 0
        """Of those, how many triggered a run, or fell back and were ENABLEd again."""
        self.feeding = False
        """Input is being fed (:meth:`begin_input`): deferred items reached now wait for
        every receive it brings."""
        self._fell_back = False  # a receive fell back: it is examined at the next ENABLE
        self._deferred: list[tuple[list[int], LocalAtomic, Reader]] = []
        self._input: list[int] | None = None  # the stamp of the input being fed
        self._advancing = False

    # ---------------------------------------------------------------- verbs
    def post(self, chain: Chain) -> None:
        """Check ``chain`` against the QP (LocalError) and queue it."""
        check_chain(self.qp, chain)
        if isinstance(chain.wait, WaitCq) and id(chain.wait.cq) not in self._watched:
            self._watched.add(id(chain.wait.cq))
            chain.wait.cq.watchers.append(self.advance)
        self.waiting.append(_Posted(chain, chain.held))
        self.advance()

    def enable(self, count: int | None) -> None:
        """ENABLE: end a fallback stall and release ``count`` held chains (None: all)."""
        self.stalled = False
        if self._fell_back:  # the application has taken the receive that fell back
            self._fell_back = False
            self._examine()
        for posted in self.waiting:
            if count is not None and count <= 0:
                break
            if posted.held:
                posted.held = False
                if count is not None:
                    count -= 1
        self.advance()

    # ---------------------------------------------------------------- triggers
    def take_recv(self, wr: RecvWR, wc: WorkCompletion) -> bool:
        """A receive completed: hold it for the chains if any waits on receives."""
        active = [r.posted for r in self.flight] + [r.posted for r in [self.running] if r]
        if not any(isinstance(p.chain.wait, WaitRecv) for p in [*self.waiting, *active]):
            return False
        try:
            data = self._message(wr, wc.byte_len)
        except _LocalWrError:
            return False  # its buffer went away: the application hears of the receive
        self.recvs.append((wr, wc, data))
        self.arrived += 1
        self.advance()
        return True

    def _message(self, wr: RecvWR, byte_len: int) -> bytes:
        """The received octets (the buffer stays the chain's until it completes)."""
        parts: list[bytes] = []
        left = byte_len
        for sge in wr.sg_list:
            take = min(sge.length, left)
            if take <= 0:
                break
            parts.append(bytes(self.qp._local(Sge(sge.addr, take, sge.lkey), 0)[1]))
            left -= take
        return b"".join(parts)

    # ---------------------------------------------------------------- deferred items
    def stamp(self) -> list[int]:
        """How many receives have arrived now, as a cell; while input is being fed, a cell
        shared by the whole input and filled once it is applied (-1 until then)."""
        if not self.feeding:
            return [self.arrived]
        if self._input is None:
            self._input = [-1]
        return self._input

    def defer(
        self, item: LocalAtomic, read: Reader | None = None, fence: list[int] | None = None
    ) -> None:
        """Run ``item`` once the receives that had arrived at ``fence`` (default: now, with
        those of the input being fed) have been examined (see the module docstring)."""
        self._deferred.append((fence or self.stamp(), item, read or Reader(self.qp, None)))
        self._settle()

    def begin_input(self) -> None:
        """Received bytes are about to be fed to the QP."""
        self.feeding = True

    def end_input(self) -> None:
        """The bytes fed are applied: what was stamped meanwhile waits for their receives."""
        self.feeding = False
        if self._input is not None:
            self._input[0] = self.arrived
            self._input = None
            self._settle()

    def _examine(self) -> None:
        self.examined += 1
        if self._deferred:
            self._settle()

    def _settle(self) -> None:
        """Run the deferred items whose receives have all been examined."""
        examined = self.examined
        due = [d for d in self._deferred if 0 <= d[0][0] <= examined]
        if not due:
            return
        self._deferred = [d for d in self._deferred if not 0 <= d[0][0] <= examined]
        for _fence, item, read in due:
            try:
                run_local(item, read)
            except _LocalWrError as exc:
                self._deferred.clear()
                self.qp.fatal(
                    RdmapError("RDMAP-12", f"deferred item: {exc}", TERM_RDMAP_CATASTROPHIC),
                    send_terminate=True,
                )
                return

    def advance(self) -> None:
        """Trigger the head chain if it can run now."""
        if self._advancing:
            return
        self._advancing = True
        try:
            while self.running is None and not self.stalled and self.waiting:
                if self.qp.state not in _SENDING or not self._triggered(self.waiting[0]):
                    return
                key = self._key(self.waiting[0])
                if key is False:
                    return
                self._trigger(self.waiting.popleft(), key)
        finally:
            self._advancing = False

    def _triggered(self, posted: _Posted) -> bool:
        if posted.held:
            return False
        wait = posted.chain.wait
        if isinstance(wait, WaitRecv):
            return bool(self.recvs)
        return wait.cq.total >= wait.count

    def _key(self, posted: _Posted) -> int | None | bool:
        """The head chain's key value, or False while it must wait for runs in flight."""
        key = posted.chain.key
        if key is None:
            return False if self.flight else None
        recv = None
        if isinstance(posted.chain.wait, WaitRecv):
            wr, _wc, data = self.recvs[0]
            recv = (wr, data)
        try:
            value = self.reader(recv).value(key)
        except _LocalWrError:
            return False if self.flight else None  # the trigger reports the bad Ref
        if any(r.key is None or r.key == value for r in self.flight):
            return False
        return value

    def _trigger(self, posted: _Posted, key: int | None = None) -> None:
        chain = posted.chain
        recv = None
        wc = None
        if isinstance(chain.wait, WaitRecv):
            wr, wc, data = self.recvs.popleft()
            recv = (wr, data)
        read = self.reader(recv)
        try:
            chosen = next(
                (i for i, b in enumerate(chain.branches) if all(holds(g, read) for g in b.guards)),
                None,
            )
        except _LocalWrError as exc:
            if wc is not None:
                self.qp._deliver_recv(wc)
            self._completion(chain, exc.status, None)
            self.qp.fatal(
                RdmapError("RDMAP-12", f"chain {chain.wr_id}: {exc}", TERM_RDMAP_CATASTROPHIC),
                send_terminate=True,
            )
            return
        if chosen is None:  # fall back to software, which ENABLEs the queue again
            self._fell_back = wc is not None
            self._fall_back(posted, wc, None, None)
            return
        if wc is not None:
            self._examine()
        run = ChainRun(self, posted, chosen, recv, wc, read, key)
        self.running = run
        self.runs += 1
        run.step()

    def reader(self, recv: tuple[RecvWR, bytes] | None) -> Reader:
        return Reader(self.qp, None if recv is None else recv[1])

    def _fall_back(
        self,
        posted: _Posted,
        wc: WorkCompletion | None,
        branch: int | None,
        at: int | None,
        rearmed: bool = False,
    ) -> None:
        """The receive goes to the application; the queue stalls until ENABLE."""
        self.fallbacks += 1
        self.stalled = True
        if posted.chain.rearm and not rearmed:
            self.waiting.append(posted)
        if wc is not None:
            self.qp._deliver_recv(wc)
        if posted.chain.signaled:
            self._completion(posted.chain, WcStatus.SUCCESS, branch, at)

    def stopped(self, run: ChainRun, at: int) -> None:
        """A :class:`Check` at item ``at`` of ``run`` failed: the chain falls back there."""
        run.done = True
        if self.running is run:
            self.running = None
        if run in self.flight:
            self.flight.remove(run)
        self._fall_back(run.posted, run.wc, run.branch, at, run.rearmed)
        self.advance()

    # ---------------------------------------------------------------- completion
    def issued(self, run: ChainRun) -> None:
        """``run`` waits on its WRs or has started every item: it is in flight, a
        ``rearm`` chain goes back to the queue, and the next chain may trigger (see
        :attr:`Chain.key`)."""
        self.running = None
        if run.status is not WcStatus.SUCCESS:
            return
        self.flight.append(run)
        if run.posted.chain.rearm:
            run.rearmed = True
            self.waiting.append(run.posted)
        self.advance()

    def finished(self, run: ChainRun) -> None:
        """Every WR of ``run`` completed: re-post its receive, signal, run the next."""
        if run.done:
            return
        run.done = True
        if self.running is run:
            self.running = None
        if run in self.flight:
            self.flight.remove(run)
        chain = run.posted.chain
        if run.status is not WcStatus.SUCCESS:  # a WR failed: the QP is failing
            self._completion(chain, run.status, run.branch)
            if run.recv is not None:
                self.qp._complete_recv(run.recv[0], WcStatus.WR_FLUSH_ERR, WcOpcode.RECV)
            return
        if run.recv is not None and self.qp.state in _SENDING:
            self.qp.post_recv(run.recv[0])
        if chain.signaled:
            self._completion(chain, WcStatus.SUCCESS, run.branch)
        self.advance()

    def fail(self) -> None:
        """The QP failed: flush every chain and every receive held for them."""
        runs = [*self.flight, *([self.running] if self.running is not None else [])]
        self._deferred.clear()
        self.running = None
        self.flight = []
        for run in runs:
            run.done = True
            status = WcStatus.WR_FLUSH_ERR if run.status is WcStatus.SUCCESS else run.status
            self._completion(run.posted.chain, status, run.branch)
            if run.recv is not None:
                self.qp._complete_recv(run.recv[0], WcStatus.WR_FLUSH_ERR, WcOpcode.RECV)
        while self.waiting:
            self._completion(self.waiting.popleft().chain, WcStatus.WR_FLUSH_ERR, None)
        while self.recvs:
            wr = self.recvs.popleft()[0]
            self.qp._complete_recv(wr, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV)

    def _completion(
        self, chain: Chain, status: WcStatus, branch: int | None, at: int | None = None
    ) -> None:
        wc = WorkCompletion(chain.wr_id, status, WcOpcode.CHAIN, self.qp.qp_num)
        wc.extra["branch"] = branch
        wc.extra["stopped"] = at
        self.qp._push_wc(self.qp.send_cq, wc)
