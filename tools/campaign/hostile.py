"""Part 2: hostile peers against each server process over loopback TCP.

The attacks (:mod:`tools.campaign.attacks`, the generic ones; :mod:`tools.campaign.forgeries`,
those specific to the KBTP target and the bench server) run here against the KBTP target
(software and offloaded), the rping server and the bench server.  After each attack: the
server is alive, a good client completes real work, blocks stored before the attacks load
byte-identical, and the server's descriptor count returns near its baseline.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from stack.transport.cm import MAX_STARTUPS
from stack.transport.startup_slots import STARTUP_STALE_AFTER
from tools.campaign.attacks import (
    Attack,
    emfile,
    garbage,
    half_open_flood,
    rst_storm,
    slowloris,
    terminate_storm,
)
from tools.campaign.forgeries import _forged_bench, _forged_kbtp
from tools.campaign.servers import (
    BenchClient,
    KbtpKeeper,
    Server,
    bench_server,
    block_data,
    kbtp_target,
    rping_ping,
    rping_server,
    run_trio,
)

EMFILE_LIMIT = 32
"""RLIMIT_NOFILE of the servers of the EMFILE attack (about 3 x their baseline)."""


@dataclass
class HostileFigures:
    attacks: list[Attack] = field(default_factory=list)


# -- the part ----------------------------------------------------------------------------


def _during(ok: bool) -> str:
    return f"good client during the flood: {'ok' if ok else 'refused'}"


def _slow_note(closed: int, n: int) -> str:
    return f"{closed}/{n} closed by the server before the Request was complete"


def _kbtp_specs() -> list[str]:
    return ["keeper:quota=16", "mallory:quota=16,direct=both"]


def _attack_server(
    server: Server,
    check: Callable[[], tuple[bool, int]],
    rng: random.Random,
    scale: int,
    progress: Callable[[str], None],
    extra: Callable[[int], tuple[int, int, str]] | None = None,
    *,
    port: int | None = None,
    where: str = "",
    extra_name: str = "forged BIND / one-sided ops / malformed requests",
) -> list[Attack]:
    """Every attack in turn against one running server (on ``port``, by default its own;
    ``where`` prefixes the attacks' names), ``check`` after each."""
    attacks: list[Attack] = []

    def after(name: str, tried: int, note: str = "", ok: bool = True) -> None:
        name = where + name
        attack = Attack(server.name, name, tried, fds_before=server.baseline_fds, note=note)
        attack.fds_after = server.fds_settle()
        attack.alive = server.alive()
        attack.served, attack.lost = check() if attack.alive else (False, 0)
        attack.served = attack.served and ok
        attacks.append(attack)
        progress(
            f"hostile {server.name}: {name}: tried {tried}, alive {attack.alive}, served "
            f"{attack.served}, lost {attack.lost}, fds {attack.fds_before}->{attack.fds_after}"
            f"{', ' + note if note else ''}"
        )

    port = port or server.port
    after("garbage", garbage(port, rng, 40 * scale))
    after("RST storm", rst_storm(port, rng, 200 * scale))
    made, ok, within = half_open_flood(port, 100 * scale, lambda: check()[0])
    after("half-open flood", made, _during(ok), ok)
    if scale > 1:  # beyond the listener's bound in all: the good client takes a flood's slot
        made, ok, within = half_open_flood(port, 100 * scale, lambda: check()[0], sources=6)
        note = _during(ok) + ("" if within else f" (flood beyond MAX_STARTUPS {MAX_STARTUPS})")
        after("half-open flood beyond the bound", made, note, ok)
        spread = 60 * scale  # one connection per address: no busiest address to take from
        settle = STARTUP_STALE_AFTER + 0.5
        made, ok, within = half_open_flood(port, spread, lambda: check()[0], spread, settle)
        note = _during(ok) + ("" if within else f" (one per address, beyond {MAX_STARTUPS})")
        after("half-open flood from many addresses", made, note, ok)
    n, closed = slowloris(port, 8 * scale, 0.1)
    after("slowloris", n, _slow_note(closed, n), closed == n)
    after("Terminate storm", terminate_storm(port, 10 * scale))
    if extra is not None:
        try:
            tried, accepted, more = extra(port)
            note, ok = f"{accepted} forged requests or forbidden operations accepted", not accepted
            note += f"; {more}" if more else ""
        except Exception as exc:  # the attack itself could not go on: report, never crash
            tried, note, ok = 0, f"attack failed: {type(exc).__name__}: {exc}", False
        after(extra_name, tried, note, ok)
    return attacks


def _hostile_kbtp(
    full: bool, seed: int, progress: Callable[[str], None], offload: bool = False
) -> list[Attack]:
    """The attacks on ``kbtp target``; with ``offload``, on ``kbtp target --offload``, whose
    chains answer the requests (mallory's ALLOC_STORE and FREE too, DIRECT_ALLOC) without
    the target application (docs/kbtp.md §8.1); its listener is the same, so the EMFILE
    attack runs once, on the software target."""
    scale = 5 if full else 1
    stream = "kbtp-target-offload" if offload else "kbtp"  # the software's seeds as before
    rng = random.Random(f"{seed}:hostile:{stream}")

    def factory(nofile: int | None) -> Server:
        extra = ["--hello-timeout", "3", "--idle-timeout", "20"]
        return kbtp_target(_kbtp_specs(), pool=64, extra=extra, nofile=nofile, offload=offload)

    low = None if offload else factory(EMFILE_LIMIT)  # starts while the other is attacked
    try:
        with factory(None) as server:
            keeper = KbtpKeeper(server.port)
            keeper.store_all()

            def forged(port: int) -> tuple[int, int, str]:
                result = [(0, 0)]

                async def body() -> None:
                    result[0] = await _forged_kbtp(port, rng, 6 * scale)

                run_trio(body, timeout=300)
                return (*result[0], "")

            attacks = _attack_server(server, keeper.check, rng, scale, progress, forged)
        if low is not None:
            fresh = lambda s: KbtpKeeper(s.port, "keeper", 2).check()[0]  # noqa: E731
            attacks.append(emfile(low, fresh, EMFILE_LIMIT, 60 * scale))
            progress(f"hostile {low.name}: {attacks[-1].name}: served {attacks[-1].served}")
    finally:
        if low is not None:
            low.stop()
    return attacks


def _hostile_rping(full: bool, seed: int, progress: Callable[[str], None]) -> list[Attack]:
    scale = 5 if full else 1
    rng = random.Random(f"{seed}:hostile:rping")
    low = rping_server(EMFILE_LIMIT)
    try:
        with rping_server() as server:
            attacks = _attack_server(
                server, lambda: (rping_ping(server.port), 0), rng, scale, progress
            )
        attacks.append(emfile(low, lambda s: rping_ping(s.port), EMFILE_LIMIT, 60 * scale))
        progress(f"hostile rping: {attacks[-1].name}: served {attacks[-1].served}")
    finally:
        low.stop()
    return attacks


def _hostile_bench(full: bool, seed: int, progress: Callable[[str], None]) -> list[Attack]:
    """The generic attacks on the bench server's trio iWARP port and on its blocking-driver
    iWARP port, then hostile session requests and raw-TCP headers (:func:`_forged_bench`)."""
    scale = 5 if full else 1
    rng = random.Random(f"{seed}:hostile:bench")
    low = bench_server(EMFILE_LIMIT)
    try:
        with bench_server() as server:
            client = BenchClient(server)
            if not client.check()[0]:
                raise RuntimeError(f"bench-server does not serve: {server.stderr()}")
            forged = lambda _port: _forged_bench(server, client, rng, scale)  # noqa: E731
            attacks = _attack_server(
                server, client.check, rng, scale, progress, forged,
                extra_name="hostile session requests / pingers / raw headers",
            )  # fmt: skip
            attacks += _attack_server(
                server, client.check, rng, scale, progress,
                port=client.blocking_port, where="blocking iWARP port: ",
            )  # fmt: skip
        attacks.append(emfile(low, lambda s: BenchClient(s).check()[0], EMFILE_LIMIT, 60 * scale))
        progress(f"hostile bench-server: {attacks[-1].name}: served {attacks[-1].served}")
    finally:
        low.stop()
    return attacks


def run_hostile(full: bool, seed: int, progress: Callable[[str], None]) -> HostileFigures:
    """The attacks on the KBTP target (software and offloaded), the rping server and the
    bench server, the four in parallel."""
    with ThreadPoolExecutor(4) as pool:
        kbtp = pool.submit(_hostile_kbtp, full, seed, progress)
        offload = pool.submit(_hostile_kbtp, full, seed, progress, True)
        rping = pool.submit(_hostile_rping, full, seed, progress)
        bench = pool.submit(_hostile_bench, full, seed, progress)
        results = (kbtp, offload, rping, bench)
        return HostileFigures([a for r in results for a in r.result()])


__all__ = [
    "Attack",
    "HostileFigures",
    "block_data",
    "run_hostile",
]
