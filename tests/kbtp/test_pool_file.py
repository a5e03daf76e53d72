"""The persistent pool (docs/kbtp.md §12): sealed blocks survive a stop and a SIGKILL.

Over real loopback TCP: blocks stored through one target load byte for byte from the next
one on the same file; a target process killed with blocks sealed, an ALLOC_STORE whose RDMA
Read is in flight and a direct ticket taken but not bound comes back with exact
accounting.  The file is refused with one line when it is not a pool, corrupt, of the wrong
size or made for another configuration.  The recovery of a hand-corrupted table repairs
what it must and nothing else; an interrupted recovery resumes from its journal; with
``pool_sync`` the data is made durable before the entry that seals it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from kbtp.cli import COMMANDS, main
from kbtp.cli.target import build_config, pool_summary
from kbtp.constants import (
    EMPTY_BLOCK_OFFSET,
    POOL_FILE_PREFIX_LEN,
    Capability,
    RequestFlag,
    Status,
    TableFlag,
    next_generation,
)
from kbtp.initiator import KbtpInitiator
from kbtp.initiator_errors import SessionClosed
from kbtp.layout import (
    TableEntry,
    TargetLayout,
    consume_slot,
    read_entry,
    write_entry,
    write_slot,
)
from kbtp.messages import AllocStore, Free, inline_descriptor
from kbtp.pool_file import PoolFile, PoolFileError, PoolState, pool_file_size
from kbtp.pool_recovery import (
    apply_recovery,
    check_pool,
    plan_recovery,
    read_ring_blocks,
    read_table,
)
from kbtp.target import KbtpTarget
from kbtp.target_config import plan_target_layout
from kbtp.target_core import TargetCore
from stack.cli import build_parser
from tests.kbtp.helpers import Harness, default_config
from tests.kbtp.targets import new_target, target_argv
from tests.kbtp.test_binding_ops import BLOCK, config, data

DIRECT = Capability.DIRECT_LOAD | Capability.DIRECT_ALLOC


def free_blocks(core: TargetCore) -> list[int]:
    return [b for ring in core.rings.values() for b in ring.available_blocks()]


def assert_consistent(target: KbtpTarget, sealed: int) -> None:
    """The ring check of §12.3 on a live pool: nothing to repair or reclaim, every block
    bound once or free once, free = F - sealed."""
    core = target.core
    report = check_pool(core.memory, target.config, core.layout)
    assert (report.repaired, report.reclaimed, report.sealed) == (0, 0, sealed), report.line()
    free = free_blocks(core)
    assert len(free) == len(set(free)) == core.config.pool_blocks - sealed
    bound = {core.entry(h).block_offset for h in range(core.layout.table_entries)}
    bound.discard(EMPTY_BLOCK_OFFSET)
    assert not bound & set(free)


# ======================================================================================
# a clean stop, over TCP
# ======================================================================================


@pytest.mark.both_targets
@pytest.mark.parametrize("sync", [False, True], ids=["flushed-at-stop", "pool-sync"])
async def test_s12_sealed_blocks_survive_a_clean_stop_byte_for_byte(
    tmp_path: Path, sync: bool
) -> None:
    path = tmp_path / "pool"
    with trio.fail_after(60):
        first = new_target(config(), pool_file=path, pool_sync=sync)
        assert (first.core.persist is not None) is sync
        assert first.recovery is None and first.pool is not None and first.pool.created
        async with first.running():
            async with KbtpInitiator.connect("127.0.0.1", first.port, "a") as a:
                inline = await a.alloc_store(1, data(1, 300), seal=True)  # INLINE
                await a.alloc_store(2, data(2, BLOCK), seal=True)  # RDMA Read
                await a.alloc_store(3, data(3, 5000))
                await a.store(3, data(4, 4000), seal=True)  # sealed by a mapped STORE
                await a.alloc_store(4, data(5, 100))  # never sealed: not kept
                freed = await a.free(1, generation=inline.generation)
            async with KbtpInitiator.connect("127.0.0.1", first.port, "c") as c:
                bound = await c.direct_alloc(130, data(6, 7000))
        assert first.pool.was_clean  # as opened (a new file)
        base_before = first.config.base_to

        second = new_target(config(), pool_file=path)
        report = second.recovery
        assert report is not None and second.pool is not None and second.pool.was_clean
        assert (report.sealed, report.unsealed, report.reclaimed, report.repaired) == (3, 1, 0, 0)
        assert report.free == 24 - 3
        assert "recovered after a clean stop: 3 sealed, 21 free" in pool_summary(second)
        core = second.core
        assert second.config.base_to == core.layout.base_to
        # Block Offsets are Tagged Offsets of the new mapping (§12.3): each names its block.
        for handle in (2, 3, 130):
            assert core.layout.block_index(core.entry(handle).block_offset) is not None
        assert core.entry(130).block_offset - second.config.base_to == (
            bound.block_offset - base_before
        )
        assert_consistent(second, 3)
        assert (core.usage(b"a"), core.usage(b"c")) == (2, 1)
        async with second.running():
            async with KbtpInitiator.connect("127.0.0.1", second.port, "a") as a:
                assert await a.load(2) == data(2, BLOCK)
                assert await a.load(3) == data(4, 4000)
                # The unsealed handle was freed, its Generation moved on.
                lost = await a.load_into(4, bytearray(BLOCK), allow_unsealed=True, check=False)
                assert lost.status == Status.NOT_VALID and lost.generation == 3
                # A handle freed before the stop is bound again with a newer Generation.
                again = await a.alloc_store(1, data(7, 200), seal=True)
                assert again.generation == next_generation(freed.generation)
                old = await a.load_into(
                    1, bytearray(BLOCK), generation=inline.generation, check=False
                )
                assert old.status == Status.WRONG_GENERATION
                # New allocations never take a block that survived.
                for h in range(5, 10):
                    await a.alloc_store(h, data(h, 64), seal=True)
                assert await a.load(2) == data(2, BLOCK)
            async with KbtpInitiator.connect(
                "127.0.0.1", second.port, "c", capabilities=DIRECT
            ) as c:
                assert await c.direct_load(130) == data(6, 7000)
        assert_consistent(second, 3 + 6)


@pytest.mark.both_targets
async def test_s12_the_file_is_locked_while_a_target_uses_it(tmp_path: Path) -> None:
    path = tmp_path / "pool"
    target = new_target(config(), pool_file=path)
    with pytest.raises(PoolFileError, match="in use by another target"):
        KbtpTarget(config(), pool_file=path)
    async with target.running():
        with pytest.raises(PoolFileError, match="in use by another target"):
            PoolFile(path, config())
    PoolFile(path, config()).close()  # released at the clean stop


# ======================================================================================
# SIGKILL with work in flight
# ======================================================================================

TARGET_ARGS = [
    "--block-size", "8K", "-F", "24", "--max-inline", "512", "--ticket-timeout", "60",
    "--initiator", "a:handles=0+64,quota=8",
    "--initiator", "c:handles=128+64,quota=4,direct=both",
]  # fmt: skip


class KillOnInbound:
    """A capture tap that SIGKILLs the target the moment, once armed, the initiator
    receives anything: the RDMA Read Request of its ALLOC_STORE, before the initiator's
    RNIC has seen it (the tap runs before the bytes are fed to the endpoint)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.armed = False
        self.fired = False

    def factory(self, stream: trio.SocketStream, is_active: bool) -> KillOnInbound:
        return self

    def record(self, outbound: bool, chunk: bytes | bytearray | memoryview) -> None:
        if self.armed and not outbound and len(chunk) and not self.fired:
            self.fired = True
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        pass


@pytest.mark.both_targets
def test_s12_sigkill_with_an_alloc_store_in_flight_loses_only_what_was_in_flight(
    tmp_path: Path,
) -> None:
    path = tmp_path / "pool"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kbtp", "target", "-p", "0", "--pool-file", str(path),
         *TARGET_ARGS, *target_argv()],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    tap = KillOnInbound(proc)
    sealed = {0: data(10, 3000), 1: data(11, 600), 2: data(12, BLOCK), 130: data(13, 5000)}
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert "listening on 127.0.0.1:" in first, first
        port = int(first.rsplit(":", 1)[1])
        lines = [proc.stdout.readline() for _ in range(5)]  # the pool, 2 initiators, the file
        assert lines[-1] == f"kbtp target: pool file {path}: new pool initialized\n", lines

        async def client() -> None:
            with trio.fail_after(60):
                async with KbtpInitiator.connect("127.0.0.1", port, "c", capabilities=DIRECT) as c:
                    await c.direct_alloc(130, sealed[130])
                    await c.reserve(data(14, 2000))  # a direct ticket, never bound
                    async with KbtpInitiator.connect(
                        "127.0.0.1", port, "a", tap_factory=tap.factory
                    ) as a:
                        for handle in (0, 1, 2):
                            await a.alloc_store(handle, sealed[handle], seal=True)
                        tap.armed = True
                        await a.alloc_store(10, data(15, BLOCK), seal=True)  # RDMA Read

        with pytest.raises((SessionClosed, OSError, trio.BrokenResourceError)):
            trio.run(client)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)
    assert tap.fired and proc.returncode == -9

    parser = build_parser("kbtp", "", COMMANDS, only="target")
    cfg = build_config(parser.parse_args(["target", *TARGET_ARGS]))
    target = new_target(cfg, pool_file=path)
    report = target.recovery
    assert report is not None and target.pool is not None and not target.pool.was_clean
    # The ALLOC_STORE's block (consumed from the shared ring, never bound) and the direct
    # ticket's block (taken, not bound) are back; nothing needed repair.
    assert (report.sealed, report.reclaimed, report.unsealed, report.repaired) == (4, 2, 0, 0)
    assert report.free == 24 - 4
    assert "after an unclean stop" in pool_summary(target)
    core = target.core
    assert (core.usage(b"a"), core.usage(b"c")) == (3, 1)
    assert not core.entry(10).valid and core.entry(10).generation == 1
    assert_consistent(target, 4)

    async def reload() -> None:
        with trio.fail_after(60):
            async with target.running():
                async with KbtpInitiator.connect("127.0.0.1", target.port, "a") as a:
                    for handle in (0, 1, 2):
                        assert await a.load(handle) == sealed[handle]
                    done = await a.alloc_store(10, data(16, 100), seal=True)
                    assert done.generation == 2
                async with KbtpInitiator.connect(
                    "127.0.0.1", target.port, "c", capabilities=DIRECT
                ) as c:
                    assert await c.direct_load(130) == sealed[130]
                    for handle in (131, 132, 133):  # the partition's 3 free blocks
                        await c.direct_alloc(handle, data(handle, 100))

    trio.run(reload)
    assert_consistent(target, 4 + 1 + 3)


# ======================================================================================
# files that are refused: one line, no traceback
# ======================================================================================

ARGS = ["--block-size", "4K", "-F", "8", "--initiator", "x:quota=4", "--initiator", "y"]


def _run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def _made(path: Path, args: list[str] = ARGS) -> None:
    parser = build_parser("kbtp", "", COMMANDS, only="target")
    PoolFile(path, build_config(parser.parse_args(["target", *args]))).close()


def _damage(path: Path, at: int, value: bytes) -> None:
    with path.open("r+b") as f:
        f.seek(at)
        f.write(value)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("short", "not a KBTP pool file (10 octets, shorter than the header)"),
        ("magic", "not a KBTP pool file (bad magic)"),
        ("version", "format version 7, this target reads 1"),
        ("checksum", "header corrupt (checksum mismatch)"),
        ("state", "header corrupt (state 9, clean 0)"),
        ("truncated", "octets, the configuration needs"),
        ("grown", "octets, the configuration needs"),
        ("block size", "made for block size 8192, the configuration has 4096"),
        ("pool", "made for pool blocks 16, the configuration has 8"),
        ("identity", "made for initiator 2 identity 'z', the configuration has 'y'"),
        ("direct", "made for initiator 1 DIRECT_ALLOC 1, the configuration has 0"),
        ("directory", "cannot open: Is a directory"),
        ("sync alone", "--pool-sync needs --pool-file"),
    ],
)
def test_s12_1_a_file_that_is_not_this_pool_is_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, message: str
) -> None:
    path = tmp_path / "pool"
    argv = ["target", "-p", "0", "--pool-file", str(path), *ARGS]
    if case == "short":
        path.write_bytes(b"KBTPPOOL\x00\x00")
    elif case == "directory":
        path.mkdir()
    elif case == "sync alone":
        argv = ["target", "-p", "0", "--pool-sync", *ARGS]
    elif case in ("block size", "pool", "identity", "direct"):
        other = {
            "block size": ["--block-size", "8K", *ARGS[2:]],
            "pool": [*ARGS[:2], "-F", "16", *ARGS[4:]],
            "identity": [*ARGS[:-1], "z"],
            "direct": [*ARGS[:5], "x:quota=4,direct=alloc", *ARGS[6:]],
        }[case]
        _made(path, other)
    else:
        _made(path)
        size = path.stat().st_size
        if case == "magic":
            _damage(path, 0, b"KBTPLOOP")
        elif case == "version":
            _damage(path, 8, (7).to_bytes(4, "big"))
        elif case == "checksum":
            _damage(path, POOL_FILE_PREFIX_LEN + 3, b"\x77")  # inside Block Size
        elif case == "state":
            _damage(path, 20, (9).to_bytes(4, "big"))
        elif case == "truncated":
            os.truncate(path, size - 1)
        elif case == "grown":
            os.truncate(path, size + 4096)
    before = path.read_bytes() if path.is_file() else None
    code = _run(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("kbtp target: error: "), err
    assert message in err and "Traceback" not in err, err
    if before is not None:
        assert path.read_bytes() == before  # a refused file is not touched


def test_s12_1_the_file_has_the_configurations_size(tmp_path: Path) -> None:
    path = tmp_path / "pool"
    pool = PoolFile(path, config())
    assert pool.created and pool.state is PoolState.FRESH
    assert path.stat().st_size == pool_file_size(config())
    assert len(pool.mapping) == plan_target_layout(config()).size
    pool.close()


# ======================================================================================
# recovery on the core (sans-IO): a hand-corrupted table
# ======================================================================================


def _sealed(h: Harness, session: int, handle: int, payload: bytes) -> TableEntry:
    desc = inline_descriptor(payload)
    flags = RequestFlag.INLINE | RequestFlag.SEAL
    comp = h.request(session, AllocStore(handle, handle, desc, payload, flags=flags))
    assert comp.status == Status.SUCCESS, comp
    return h.core.entry(handle)


def test_s12_3_recovery_repairs_a_corrupted_table_and_nothing_else() -> None:
    """Shared blocks 3..9 (a: handles 0-7, b: 16-23), c's partition blocks 0..2 (32-39)."""
    h = Harness(default_config(pool_blocks=10))
    h.connect(1, b"a")
    h.connect(2, b"b")
    h.connect(3, b"c", DIRECT)
    core, lay, mem = h.core, h.core.layout, h.core.memory
    keep = _sealed(h, 1, 0, b"kept")  # stays as it is
    twice = _sealed(h, 1, 1, b"one")
    other = _sealed(h, 2, 16, b"two")
    part = _sealed(h, 3, 32, b"part")
    unsealed = AllocStore(9, 17, inline_descriptor(b"u"), b"u", flags=RequestFlag.INLINE)
    assert h.request(2, unsealed).status == Status.SUCCESS
    # -- the corruption ------------------------------------------------------------------
    # (1) b's handle 16 now names a's block of handle 1: that block is bound twice.
    at16 = lay.entry_offset(16)
    write_entry(mem, at16, TableEntry(other.flags, other.generation, 3, twice.block_offset))
    orphan = other.block_offset  # (2) ... so b's old block is neither free nor bound
    # (3) c's handle 33 names a shared block: outside its partition.
    shared_free = core.ring_of(b"a").available_blocks()[-1]
    bad = TableEntry(TableFlag.VALID | TableFlag.SEALED, 5, 4, shared_free)
    write_entry(mem, lay.entry_offset(33), bad)
    # (4) a free shared block taken out of its ring without being bound.
    ring = core.ring_of(b"a")
    lost_ticket = ring.head()[0]
    lost = ring.ready_block(lost_ticket)
    assert lost is not None and lost != shared_free
    consume_slot(mem, ring.slot_byte_offset(lost_ticket))
    # (5) c's sealed block also written into a free slot of its partition ring.
    pring = core.ring_of(b"c")
    empty = next(
        t for t in range(pring.geometry.slots) if pring.slot(t).consumed and t != pring.head()[0]
    )
    write_slot(mem, pring.slot_byte_offset(empty), empty, part.block_offset)
    # (6) an unbound entry with Generation 0.
    write_entry(mem, lay.entry_offset(5), TableEntry(TableFlag.NONE, 0, 0, EMPTY_BLOCK_OFFSET))

    cfg = core.config
    plan = plan_recovery(cfg, lay, read_table(mem, lay), lay.base_to, read_ring_blocks(mem, lay))
    r = plan.report
    assert (r.bound_twice, r.bad_entries, r.free_and_bound, r.unsealed) == (2, 2, 1, 1)
    assert (r.reclaimed, r.duplicate_free, r.stray_slots) == (2, 0, 0)  # orphan and lost
    assert (r.sealed, r.free) == (2, 8)
    assert r.repaired == 5
    apply_recovery(mem, lay, plan)
    again = TargetCore(cfg, mem, recovered=True)

    # Both holders of the twice-bound block are invalidated, Generation advanced.
    for handle, gen in ((1, twice.generation), (16, other.generation), (33, 5)):
        e = again.entry(handle)
        assert not e.valid and e.generation == next_generation(gen), (handle, e)
    assert not again.entry(17).valid
    assert again.entry(5).generation == 1
    # What was right is untouched.
    assert again.entry(0) == keep and again.entry(32) == part
    assert again.block_bytes(keep.block_offset, 4) == b"kept"
    # Every block once: bound (handles 0 and 32) or free in its own ring.
    assert sorted(again.ring_of(b"a").available_blocks()) == sorted(
        {lay.block_to(i) for i in range(3, 10)} - {keep.block_offset}
    )
    assert orphan in again.ring_of(b"a").available_blocks()
    assert lost in again.ring_of(b"a").available_blocks()
    assert sorted(again.ring_of(b"c").available_blocks()) == sorted(
        {lay.block_to(i) for i in range(3)} - {part.block_offset}
    )
    assert (again.usage(b"a"), again.usage(b"b"), again.usage(b"c")) == (1, 0, 1)
    second = check_pool(mem, cfg, lay)
    assert (second.repaired, second.reclaimed, second.sealed, second.free) == (0, 0, 2, 8)

    # The recovered core serves: a and b allocate up to their quotas from the repaired ring
    # and never receive a block that is bound.
    h2 = Harness(cfg)
    h2.core = again
    h2.connect(11, b"a")
    h2.connect(12, b"b")
    got = {_sealed(h2, 11, 2, b"x").block_offset}
    got |= {_sealed(h2, 12, n, b"y").block_offset for n in (18, 19)}
    assert len(got) == 3 and keep.block_offset not in got and part.block_offset not in got
    full = h2.request(11, AllocStore(1, 3, inline_descriptor(b"z"), b"z", flags=RequestFlag.INLINE))
    assert full.status == Status.NO_SPACE


def test_s12_3_a_pool_killed_between_operations_needs_no_repair() -> None:
    """Recovery of a consistent table changes no entry and rebuilds the rings alike."""
    h = Harness()
    h.connect(1, b"a")
    h.connect(3, b"c", DIRECT)
    _sealed(h, 1, 0, b"a0")
    _sealed(h, 3, 32, b"c0")
    table = read_table(h.core.memory, h.core.layout)
    plan = plan_recovery(
        h.core.config,
        h.core.layout,
        table,
        h.core.layout.base_to,
        read_ring_blocks(h.core.memory, h.core.layout),
    )
    assert plan.report.repaired == plan.report.reclaimed == 0
    apply_recovery(h.core.memory, h.core.layout, plan)
    assert read_table(h.core.memory, h.core.layout) == [
        e if e.valid else TableEntry(e.flags, e.generation) for e in table
    ]


# ======================================================================================
# crash safety of the recovery itself, and pool_sync
# ======================================================================================


@pytest.mark.both_targets
def test_s12_3_an_interrupted_recovery_resumes_from_its_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "pool"

    async def store() -> None:
        target = new_target(config(), pool_file=path)
        async with target.running():
            async with KbtpInitiator.connect("127.0.0.1", target.port, "a") as a:
                await a.alloc_store(7, data(7, 3000), seal=True)
                await a.alloc_store(8, data(8, 100), seal=True)

    trio.run(store)

    def crash(mem: memoryview, layout: TargetLayout, plan: object) -> None:
        size = layout.table_entries * 16
        mem[:size] = b"\xa5" * size  # the table rewrite has begun: garbage everywhere
        raise KeyboardInterrupt  # the process dies here

    import kbtp.pool_file as pool_file

    monkeypatch.setattr(pool_file, "apply_recovery", crash)
    with pytest.raises(KeyboardInterrupt):
        KbtpTarget(config(), pool_file=path)
    monkeypatch.undo()
    pool = PoolFile(path, config())
    assert pool.state is PoolState.JOURNAL
    pool.close()

    async def reload() -> None:
        target = new_target(config(), pool_file=path)
        report = target.recovery
        assert report is not None and not report.checked and report.sealed == 2
        assert target.pool is not None and target.pool.state is PoolState.TABLE
        assert_consistent(target, 2)
        async with target.running():
            async with KbtpInitiator.connect("127.0.0.1", target.port, "a") as a:
                assert await a.load(7) == data(7, 3000)
                assert await a.load(8) == data(8, 100)

    trio.run(reload)


def test_s12_4_pool_sync_makes_the_data_durable_before_the_sealing_entry() -> None:
    """``persist`` is called for the block before the entry is VALID|SEALED, then for the
    entry; a FREE persists the freed entry before the block can be handed out again."""
    calls: list[tuple[int, int, TableEntry]] = []
    holder: list[TargetCore] = []

    def persist(offset: int, length: int) -> None:
        core = holder[0]
        calls.append((offset, length, read_entry(core.memory, core.layout.entry_offset(2))))

    h = Harness(default_config(), persist=persist)
    holder.append(h.core)
    h.connect(1, b"a")
    lay = h.core.layout
    plain = AllocStore(1, 2, inline_descriptor(b"abc"), b"abc", flags=RequestFlag.INLINE)
    assert h.request(1, plain).status == Status.SUCCESS
    assert calls == []  # not sealed: nothing to make durable
    assert h.request(1, Free(2, 2)).status == Status.SUCCESS
    assert [(o, n) for o, n, _ in calls] == [(lay.entry_offset(2), 16)]
    assert not calls[0][2].valid  # the free is in the entry when it is flushed
    calls.clear()
    entry = _sealed(h, 1, 2, b"sealed!")
    block = lay.offset_of(entry.block_offset)
    assert [(o, n) for o, n, _ in calls] == [(block, 7), (lay.entry_offset(2), 16)]
    assert not calls[0][2].valid and calls[1][2].valid and calls[1][2].sealed


@settings(max_examples=60, deadline=None)
@given(st.binary(min_size=64, max_size=64), st.lists(st.integers(0, 1 << 20), max_size=40))
def test_s12_3_recovery_of_any_memory_restores_the_invariant(seed: bytes, spots: list[int]) -> None:
    """Whatever the table and rings hold (bytes overwritten anywhere outside the pool),
    recovery never raises and leaves every block bound once or free once."""
    h = Harness(default_config(pool_blocks=10))
    for session, identity, handle in ((1, b"a", 0), (2, b"b", 16), (3, b"c", 32)):
        h.connect(session, identity, DIRECT if identity == b"c" else Capability.NONE)
        _sealed(h, session, handle, identity * 5)
        _sealed(h, session, handle + 1, identity * 3)
    core = h.core
    lay, mem = core.layout, core.memory
    pool_start, pool_len = lay.pool_region
    writable = [i for i in range(lay.size) if not pool_start <= i < pool_start + pool_len]
    for n, spot in enumerate(spots):
        mem[writable[spot % len(writable)]] = seed[n % len(seed)]
    table = read_table(mem, lay)
    plan = plan_recovery(core.config, lay, table, lay.base_to, read_ring_blocks(mem, lay))
    apply_recovery(mem, lay, plan)
    again = TargetCore(core.config, mem, recovered=True)
    after = check_pool(mem, core.config, lay)
    assert (after.repaired, after.reclaimed, after.unsealed) == (0, 0, 0), after.line()
    assert after.sealed == plan.report.sealed and after.free == 10 - after.sealed
    free = free_blocks(again)
    assert len(free) == len(set(free)) == 10 - after.sealed
    if not spots:  # nothing overwritten: the six sealed blocks are all kept
        assert after.sealed == 6 and again.block_bytes(again.entry(16).block_offset, 5) == b"b" * 5
    for ini in core.config.initiators:
        assert again.usage(ini.identity) == sum(
            again.entry(h).valid for h in range(ini.handle_base, ini.handle_base + ini.handle_count)
        )
