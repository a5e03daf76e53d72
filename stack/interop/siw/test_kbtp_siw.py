"""A second KBTP initiator, on pyverbs + librdmacm over Linux siw, against ``kbtp target``.

``kbtp target`` (the CLI, a subprocess on the host's 127.0.0.1) serves the guest, whose
``kbtp_pyverbs_initiator.py`` (written from docs/kbtp.md alone) connects to 10.0.2.2 over
siw and runs a plan: HELLO, STORE and ALLOC_STORE mapped (the target RDMA-reads the guest's
memory) and INLINE, LOAD (the target RDMA-writes it), FREE, requests up to the credits in
flight, DIRECT_LOAD (two entry Reads and a block Read), BIND without DIRECT_ALLOC (siw has
no atomics, so the HELLO omits MASKED_FETCH_ADD and the target grants only DIRECT_LOAD),
every documented refusal, INVALIDATE, and last a STORE from the buffer the target
invalidated: siw fails the Read Response, Terminates and closes without flushing the QP,
which only rdma_cm's DISCONNECTED event reports.  A second session and a host-side
initiator then load what the guest stored, byte for byte.  Each run is captured at the
guest's NIC and decoded with ``iwarp dissect --ulp kbtp``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from kbtp.constants import Capability, Status
from kbtp.initiator import KbtpInitiator
from stack.interop.peers import REPO, host_listening, no_guest_oops  # noqa: F401 - fixture
from stack.interop.siw import kbtp_pyverbs_initiator as guest
from stack.siwvm import GUEST_ADDR, HOST_ADDR, SiwVM, free_port

SCRIPT = Path(guest.__file__)
GUEST_SCRIPT = "/tmp/kbtp_pyverbs_initiator.py"
BLOCK = 4096
CREDITS = 8
MAX_INLINE = 1024
QUOTA = 16
IDENTITY = "siw-guest"
HOST_IDENTITY = "host-check"
H = 0x1000
"""First handle of the guest's range (32 handles)."""
IBV_WC_WITH_INV = 1 << 3
"""rdma-core's ibv_wc_flags bit for a completion that invalidated an STag remotely."""
TARGET_ARGS = [
    "--block-size", str(BLOCK), "--pool-blocks", "64", "--credits", str(CREDITS),
    "--max-inline", str(MAX_INLINE),
    "--initiator", f"{IDENTITY}:handles={H:#x}+32,quota={QUOTA},direct=both",
    "--initiator", f"{HOST_IDENTITY}:handles=0x2000+8,quota=4",
]  # fmt: skip


class TargetProcess:
    """``kbtp target`` on the host's 127.0.0.1, its output in a file."""

    def __init__(self, port: int, *extra: str) -> None:
        self.out = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kbtp", "target", "-p", str(port), *TARGET_ARGS, *extra],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdin=subprocess.DEVNULL,
            stdout=self.out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while not host_listening(port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"kbtp target did not listen on {port}:\n{self.stop()}")
            time.sleep(0.05)

    def stop(self) -> str:
        """SIGTERM (a clean stop), then its output."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.out.seek(0)
        return self.out.read()


def run_guest(vm: SiwVM, port: int, steps: list[dict[str, Any]], **plan: Any) -> dict[str, Any]:
    """Run the initiator in the guest with ``steps``; its JSON result."""
    full = {"host": HOST_ADDR, "port": port, "identity": IDENTITY, "timeout": 10, **plan}
    full["steps"] = steps
    vm.write_file(GUEST_SCRIPT, SCRIPT.read_bytes())
    vm.write_file("/tmp/kbtp-plan.json", json.dumps(full).encode())
    res = vm.run(f"python3 {GUEST_SCRIPT} < /tmp/kbtp-plan.json", timeout=90)
    assert res.rc == 0 and res.stdout.strip(), res.output[-3000:]
    out: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def by_name(out: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in out["results"]}


def alloc(name: str, handle: int, length: int, seed: int, *flags: str, **kw: Any) -> dict[str, Any]:
    return {"op": "alloc_store", "name": name, "handle": handle, "length": length,
            "seed": seed, "flags": list(flags), **kw}  # fmt: skip


def load(name: str, handle: int, length: int, seed: int, *flags: str, **kw: Any) -> dict[str, Any]:
    return {"op": "load", "name": name, "handle": handle, "length": length, "seed": seed,
            "flags": list(flags), **kw}  # fmt: skip


BATCH = [(H + 4 + i, 1024 + 300 * i, 20 + i) for i in range(CREDITS)]
"""(handle, length, seed) of the ALLOC_STOREs sent together, one per credit."""
STORED = {  # handle -> (length, seed) after the main session, all sealed
    H: (BLOCK, 10),
    H + 1: (2000, 12),
    H + 3: (900, 15),
    **{h: (n, s) for h, n, s in BATCH},
    H + 14: (BLOCK, 40),
}
UNSEALED = (H + 13, 300, 30)


def main_steps() -> list[dict[str, Any]]:
    """The first session: every operation, every documented refusal, then the failure."""
    h13, n13, s13 = UNSEALED
    return [
        alloc("alloc-mapped-seal", H, BLOCK, 10, "SEAL"),
        alloc("alloc-mapped", H + 1, 100, 11),
        {"op": "store", "name": "store-mapped-seal", "handle": H + 1, "gen": 2, "length": 2000,
         "seed": 12, "flags": ["SEAL"]},
        alloc("alloc-inline-seal", H + 2, 700, 13, "INLINE", "SEAL"),
        alloc("alloc-inline", H + 3, 10, 14, "INLINE"),
        {"op": "store", "name": "store-inline-seal", "handle": H + 3, "length": 900,
         "seed": 15, "flags": ["INLINE", "SEAL"]},
        load("load-0", H, BLOCK, 10, gen=2),
        load("load-1", H + 1, 2000, 12),
        load("load-2", H + 2, 700, 13),
        load("load-3", H + 3, 900, 15),
        {"op": "batch", "steps": [
            alloc(f"batch-alloc-{h:#x}", h, n, s, "SEAL", slot=i)
            for i, (h, n, s) in enumerate(BATCH)
        ]},
        {"op": "batch", "steps": [
            load(f"batch-load-{h:#x}", h, n, s, slot=i)
            for i, (h, n, s) in enumerate([*BATCH, (H, BLOCK, 10), (H + 1, 2000, 12)])
        ]},
        {"op": "direct_load", "name": "direct-0", "handle": H, "length": BLOCK, "seed": 10},
        {"op": "direct_load", "name": "direct-5", "handle": H + 5, "length": 1324, "seed": 21},
        {"op": "free", "name": "free-2", "handle": H + 2, "gen": 2},
        load("load-freed", H + 2, 0, 0),
        {"op": "direct_load", "name": "direct-freed", "handle": H + 2},
        {"op": "bind", "name": "bind-no-direct-alloc", "handle": H + 12, "ticket": 0,
         "length": 16, "block": 0},
        # refusals (docs/kbtp.md §6, §7): none of them changes anything
        load("bad-unserved", 0xFFFF0000, 0, 0),
        alloc("bad-other-range", 0x2000, 16, 1, "INLINE"),
        load("bad-flags", H, 0, 0, "SEAL"),
        load("bad-generation", H, 0, 0, gen=7),
        alloc("bad-already-valid", H, 16, 1, "INLINE"),
        {"op": "store", "name": "bad-sealed", "handle": H, "length": 16, "seed": 1,
         "flags": ["INLINE"]},
        load("bad-not-valid", H + 12, 0, 0),
        load("bad-short-descriptor", H, 0, 0, desc_len=100),
        alloc("bad-inline-too-long", H + 12, MAX_INLINE + 1, 1, "INLINE"),
        alloc("bad-too-long-for-block", H + 12, BLOCK + 1, 1),
        alloc("bad-inline-invalidate", H + 12, 16, 1, "INLINE", "INVALIDATE", inline_stag=7),
        load("bad-record", H, 0, 0, "RECORD", record=True),
        load("bad-status-field", H, 0, 0, status_field=3),
        {"op": "free", "name": "bad-free-generation", "handle": H, "gen": 9},
        {"op": "raw", "name": "bad-length", "hex": f"01130000 {0x7777:016x} {H:016x} 0000 0000 00"},
        alloc("alloc-unsealed", h13, n13, s13),
        load("load-unsealed", h13, 0, 0),
        load("load-allow-unsealed", h13, n13, s13, "ALLOW_UNSEALED"),
        # INVALIDATE (§6.8 item 1): the COMPLETION is a Send with Invalidate of the STag
        alloc("alloc-invalidate", H + 14, BLOCK, 40, "SEAL", "INVALIDATE", mr="fresh"),
        load("load-invalidate", H + 14, BLOCK, 40, "INVALIDATE", mr="fresh"),
        alloc("fill-15", H + 15, 8, 2, "INLINE", "SEAL"),
        alloc("fill-16", H + 16, 8, 3, "INLINE", "SEAL"),
        alloc("fill-17", H + 17, 8, 4, "INLINE", "SEAL"),
        alloc("bad-no-space", H + 18, 8, 5, "INLINE", "SEAL"),
        # the STag the target invalidated: siw fails the Read Response (module docstring)
        {"op": "expect_disconnect", "name": "store-invalidated", "request": "store",
         "handle": h13, "length": 64, "seed": 9, "mr": "last_fresh", "timeout": 15},
    ]  # fmt: skip


def second_steps() -> list[dict[str, Any]]:
    """A new session: what the first stored is still there; the failed STORE changed
    nothing (the handle keeps its unsealed data)."""
    h13, n13, s13 = UNSEALED
    steps = [load(f"again-{h:#x}", h, n, s) for h, (n, s) in STORED.items()]
    steps.append(load("again-unsealed", h13, n13, s13, "ALLOW_UNSEALED"))
    steps.append({"op": "direct_load", "name": "again-direct", "handle": H + 4,
                  "length": 1024, "seed": 20})  # fmt: skip
    return steps


def host_loads(port: int, handles: list[int]) -> dict[int, bytes]:
    """The host's own initiator (this project's) loads ``handles``."""

    async def go() -> dict[int, bytes]:
        async with KbtpInitiator.connect(
            "127.0.0.1", port, HOST_IDENTITY, capabilities=Capability.NONE
        ) as ini:
            return {h: await ini.load(h) for h in handles}

    return trio.run(go)


def dissect_json(pcap: Path) -> list[dict[str, Any]]:
    """``iwarp dissect --ulp kbtp --json`` of a capture, one record per PDU."""
    res = subprocess.run(
        [sys.executable, "-m", "stack", "dissect", str(pcap), "--ulp", "kbtp", "--json"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]


def findings(records: list[dict[str, Any]]) -> list[tuple[str, str, list[str]]]:
    """(direction, KBTP or RDMAP message, rules) of every PDU with a finding, except
    MPA-04 on siw's FPDUs (siw may pad with buffer bytes)."""
    out = []
    for r in records:
        rules = [f for f in r.get("findings", []) if not _siw_pad(r, f)]
        if rules:
            what = r.get("kbtp_opcode_name") or r.get("opcode_name") or r["type"]
            out.append((r["direction"], what, rules))
    return out


def _siw_pad(record: dict[str, Any], rule: str) -> bool:
    return rule == "MPA-04" and str(record.get("src", "")).startswith(GUEST_ADDR + ":")


def check_common(out: dict[str, Any], *, caps: int) -> dict[str, dict[str, Any]]:
    assert out["error"] is None, out
    ack = out["hello_ack"]
    assert ack["status"] == Status.SUCCESS, ack
    # DIRECT_ALLOC was asked without MASKED_FETCH_ADD: refused cleanly (§4.3)
    assert ack["capabilities"] == caps & Capability.DIRECT_LOAD
    assert ack["partition_stag"] == ack["head_stag"] == ack["ring_stag"] == 0
    assert (ack["block_size"], ack["credits"], ack["quota"]) == (BLOCK, CREDITS, QUOTA)
    return by_name(out)


ASKED = int(Capability.DIRECT_LOAD | Capability.DIRECT_ALLOC)


@pytest.mark.interop
@pytest.mark.usefixtures("no_guest_oops")
def test_kbtp_siw_active_pyverbs_every_operation(vm: SiwVM, case: str) -> None:
    """The whole plan with the target's CRC on (module docstring), a second session and
    the host's loads after it."""
    port = free_port()
    target = TargetProcess(port, "--crc")
    try:
        with vm.capture(case, ports=(port,)) as pcap:
            first = run_guest(vm, port, main_steps(), capabilities=ASKED)
            second = run_guest(vm, port, second_steps(), capabilities=ASKED)
        loaded = host_loads(port, sorted(STORED))
    finally:
        log = target.stop()
    r = check_common(first, caps=ASKED)
    ok = Status.SUCCESS
    for name in ("alloc-mapped-seal", "alloc-mapped", "store-mapped-seal", "alloc-inline-seal",
                 "alloc-inline", "store-inline-seal"):  # fmt: skip
        assert r[name]["status"] == ok and r[name]["echo_ok"], r[name]
    assert (
        r["alloc-mapped-seal"]["generation"] == 2 and r["alloc-mapped-seal"]["data_length"] == BLOCK
    )
    assert r["store-mapped-seal"]["data_length"] == 2000
    assert r["store-mapped-seal"]["block_offset"] == r["alloc-mapped"]["block_offset"]
    for name, n in (("load-0", BLOCK), ("load-1", 2000), ("load-2", 700), ("load-3", 900)):
        assert r[name]["status"] == ok and r[name]["bytes_verified"] == n, r[name]
        assert r[name]["data_ok"], r[name]
    batch = [r[f"batch-alloc-{h:#x}"] for h, _, _ in BATCH]
    assert all(b["status"] == ok for b in batch), batch
    assert batch[0]["peak_outstanding"] == CREDITS
    assert len({b["block_offset"] for b in batch}) == CREDITS
    for h, n, _ in [*BATCH, (H, BLOCK, 10), (H + 1, 2000, 12)]:
        res = r[f"batch-load-{h:#x}"]
        assert res["status"] == ok and res["bytes_verified"] == n and res["data_ok"], res
    for name, n in (("direct-0", BLOCK), ("direct-5", 1324)):
        assert r[name]["entries_identical"] and r[name]["bytes_verified"] == n, r[name]
        assert r[name]["data_ok"] and r[name]["entry_flags"] == 3, r[name]
    assert r["direct-0"]["block_offset"] == r["load-0"]["block_offset"]
    assert r["free-2"]["status"] == ok and r["free-2"]["generation"] == 3
    assert r["free-2"]["block_offset"] == r["alloc-inline-seal"]["block_offset"]
    assert r["load-freed"]["status"] == Status.NOT_VALID and r["load-freed"]["generation"] == 3
    assert r["direct-freed"]["valid"] is False and r["direct-freed"]["entry_flags"] == 0
    assert r["bind-no-direct-alloc"]["status"] == Status.NOT_OFFERED
    expected = {
        "bad-unserved": Status.HANDLE_OUT_OF_RANGE,
        "bad-other-range": Status.HANDLE_OUT_OF_RANGE,
        "bad-flags": Status.BAD_FLAGS,
        "bad-generation": Status.WRONG_GENERATION,
        "bad-already-valid": Status.ALREADY_VALID,
        "bad-sealed": Status.SEALED,
        "bad-not-valid": Status.NOT_VALID,
        "bad-short-descriptor": Status.TOO_LONG_FOR_DESCRIPTOR,
        "bad-inline-too-long": Status.INLINE_TOO_LONG,
        "bad-too-long-for-block": Status.TOO_LONG_FOR_BLOCK,
        "bad-inline-invalidate": Status.BAD_FLAGS,
        "bad-record": Status.NOT_OFFERED,
        "bad-status-field": Status.MALFORMED,
        "bad-free-generation": Status.WRONG_GENERATION,
        "bad-length": Status.MALFORMED,
        "load-unsealed": Status.NOT_SEALED,
        "bad-no-space": Status.NO_SPACE,
    }
    got = {name: r[name]["status_name"] for name in expected}
    assert got == {name: s.name for name, s in expected.items()}
    # §5.8: an error names no block; §6.8 item 7: Generation 0 when refused while decoding
    # or not served, else the entry's current one; Handle and Opcode always echoed
    assert all(r[name]["block_offset"] == guest.ALL_ONES_64 for name in expected)
    assert all(r[name]["echo_ok"] for name in expected if name != "bad-length")
    assert (r["bad-length"]["request_id"], r["bad-length"]["handle"]) == (0x7777, H)
    assert r["bad-length"]["request_opcode"] == 0x13
    generations = {name: r[name]["generation"] for name in expected}
    assert generations == {
        **{name: 0 for name in ("bad-unserved", "bad-flags", "bad-inline-invalidate")},
        **{name: 0 for name in ("bad-status-field", "bad-length")},
        **{name: 1 for name in ("bad-other-range", "bad-not-valid", "bad-inline-too-long")},
        **{name: 1 for name in ("bad-too-long-for-block", "bad-no-space")},
        **{name: 2 for name in ("bad-generation", "bad-already-valid", "bad-sealed")},
        **{name: 2 for name in ("bad-short-descriptor", "bad-record", "bad-free-generation")},
        "load-unsealed": 2,
    }
    assert r["load-allow-unsealed"]["status"] == ok and r["load-allow-unsealed"]["data_ok"]
    for name in ("alloc-invalidate", "load-invalidate", "fill-15", "fill-16", "fill-17"):
        assert r[name]["status"] == ok, r[name]
    assert r["load-invalidate"]["data_ok"], r["load-invalidate"]
    # siw's user-space completion does not say the STag was invalidated (§6.8 item 13) ...
    assert not r["load-invalidate"]["wc_flags"] & IBV_WC_WITH_INV
    # ... but it was: the target's RDMA Read of it makes siw Terminate, unflushed
    fail = r["store-invalidated"]
    assert fail["outcome"] == "disconnected", fail
    assert fail["completions_after"] == 0 and fail["receives_posted"] > 0, fail
    assert first["disconnected"] and first["wc_errors"] == []

    r2 = check_common(second, caps=ASKED)
    for h, (n, _) in STORED.items():
        res = r2[f"again-{h:#x}"]
        assert res["status"] == ok and res["bytes_verified"] == n and res["data_ok"], res
    assert r2["again-unsealed"]["data_ok"] and r2["again-unsealed"]["data_length"] == UNSEALED[1]
    assert r2["again-direct"]["data_ok"]
    assert loaded == {h: guest.pattern(s, n) for h, (n, s) in STORED.items()}

    # §6.8 item 2: the failed RDMA Read is the first session's close reason at the target
    assert re.search(r"session 1 \(siw-guest\): ended .*: REMOTE_ACCESS_ERROR", log), log
    assert re.search(r"session 2 \(siw-guest\): ended .*closed by the initiator", log), log
    records = dissect_json(pcap)
    kbtp_ops = {r.get("kbtp_opcode_name") for r in records} - {None}
    assert kbtp_ops == {"HELLO", "HELLO_ACK", "LOAD", "STORE", "ALLOC_STORE", "FREE", "BIND",
                        "COMPLETION"}  # fmt: skip
    assert all(r["crc_ok"] is True for r in records if r["type"] == "fpdu")
    assert [r["type"] for r in records].count("mpa_req") == 2
    # the dissector flags exactly the requests sent to be refused while decoding (KBTP-5,
    # §5.1) and siw's Terminate, in siw's own control-word layout (RDMAP-11)
    # the wire did carry the invalidations siw's completions kept quiet about, and siw's
    # Terminate (RDMAP, Remote Protection Error, Invalid STag) names the invalidated STag
    stags = [r[name]["desc_stag"] for name in ("alloc-invalidate", "load-invalidate")]
    inval = [r for r in records if r.get("opcode_name") == "Send with Invalidate"]
    assert [int(x["inval_stag"], 16) for x in inval] == stags
    assert all(x["kbtp_opcode_name"] == "COMPLETION" for x in inval)
    [term] = [r for r in records if r.get("opcode_name") == "Terminate"]
    assert term["direction"] == "i2r" and fail["desc_stag"] == stags[1]
    assert (term["term_layer"], term["term_etype"], term["term_errcode"]) == (0, 1, 0)
    assert f"{stags[1]:08x}" in term["term_rdmap_hdr"]
    assert findings(records) == [
        ("i2r", "LOAD", ["KBTP-5"]),  # bad-flags
        ("i2r", "ALLOC_STORE", ["KBTP-5.1"]),  # bad-inline-invalidate
        ("i2r", "LOAD", ["KBTP-5.1"]),  # bad-status-field
        ("i2r", "FREE", ["KBTP-5"]),  # bad-length
        ("i2r", "Terminate", ["RDMAP-11"]),  # store-invalidated: siw's Read Response failed
    ]


@pytest.mark.interop
@pytest.mark.usefixtures("no_guest_oops")
@pytest.mark.parametrize(
    "target_crc, siw_crc, crc_on",
    [(False, False, False), (False, True, True)],
    ids=["crc-off", "siw-asks-crc"],
)
def test_kbtp_siw_active_pyverbs_crc_settings(
    vm: SiwVM, case: str, target_crc: bool, siw_crc: bool, crc_on: bool
) -> None:
    """Mapped and inline stores, loads and a direct load with the MPA CRC on or off: on
    when either side asks (RFC 5044 §7.1, siw's mpa_crc_required)."""
    vm.set_siw(crc_required=siw_crc)
    port = free_port()
    target = TargetProcess(port, "--crc" if target_crc else "--no-crc")
    steps = [
        alloc("alloc", H + 20, 3000, 50, "SEAL"),
        alloc("alloc-inline", H + 21, 500, 51, "INLINE", "SEAL"),
        load("load", H + 20, 3000, 50),
        load("load-inline", H + 21, 500, 51),
        {"op": "direct_load", "name": "direct", "handle": H + 20, "length": 3000, "seed": 50},
        {"op": "free", "name": "free", "handle": H + 20},
        {"op": "free", "name": "free-inline", "handle": H + 21},
    ]
    try:
        with vm.capture(case, ports=(port,)) as pcap:
            out = run_guest(vm, port, steps, capabilities=ASKED)
    finally:
        target.stop()
    r = check_common(out, caps=ASKED)
    statuses = [res["status"] for res in out["results"] if res["op"] != "direct_load"]
    assert statuses == [Status.SUCCESS] * 6, out["results"]
    assert r["load"]["data_ok"] and r["load-inline"]["data_ok"] and r["direct"]["data_ok"]
    records = dissect_json(pcap)
    rep = next(rec for rec in records if rec["type"] == "mpa_rep")
    assert rep["crc_flag"] is crc_on
    fpdus = [rec for rec in records if rec["type"] == "fpdu"]
    assert fpdus and all(rec["crc_ok"] is (True if crc_on else None) for rec in fpdus)
    assert findings(records) == []
