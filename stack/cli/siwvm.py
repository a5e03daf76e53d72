"""``iwarp siwvm``: build and drive the Linux siw guest used for interop tests.

Actions:
  build       build the guest from Debian packages into $SIWVM_CACHE (root; idempotent)
  info        show the cache and the built artifacts
  boot-check  boot once, show boot time, the siw device and its knobs, power off
  shell-run   boot, run one shell command in the guest (optionally forwarding ports, setting
              siw knobs and capturing the traffic), print its output, exit with its status

All guest traffic stays on loopback and QEMU user networking: the guest reaches the host's
127.0.0.1 as 10.0.2.2, and ``-f HOST:GUEST`` forwards 127.0.0.1:HOST to the guest.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from stack.cli import CliError, counted, one_line_errors, positive_seconds
from stack.cli.json_report import check_outputs
from stack.siwvm import (
    GUEST_ADDR,
    HOST_ADDR,
    SiwVM,
    SiwVmError,
    build,
    cache_dir,
    find_artifacts,
)
from stack.siwvm.image import print_progress
from stack.siwvm.knobs import SIW_DEFAULTS, normalize, parse_kv

MAX_SMP = 255
"""Most guest vCPUs (``--smp``): QEMU's default x86 machine, ``pc`` (i440fx), which the
guest boots on, takes at most 255."""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "siwvm",
        help="build/boot the Linux siw QEMU guest for interop tests",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    one_line_errors(parser)
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True

    p_build = actions.add_parser("build", help="build the guest image (cold 1-4 min, warm <1 s)")
    p_build.add_argument("--refresh", action="store_true", help="re-resolve the kernel from apt")
    p_build.add_argument(
        "--timeout", type=positive_seconds, default=900.0, help="seconds (default 900)"
    )
    p_build.set_defaults(func=run_build)
    one_line_errors(p_build)

    p_info = actions.add_parser("info", help="show the cache and the built artifacts")
    p_info.set_defaults(func=run_info)
    one_line_errors(p_info)

    for name, func, text in (
        ("boot-check", run_boot_check, "boot, show the siw device and knobs, power off"),
        ("shell-run", run_shell, "boot, run CMD in the guest, print its output"),
    ):
        p = actions.add_parser(name, help=text)
        p.add_argument(
            "--boot-timeout", type=positive_seconds, default=180.0, help="seconds (default 180)"
        )
        p.add_argument(
            "--smp",
            type=counted(MAX_SMP),
            default=None,
            help=f"guest vCPUs (default 1, at most {MAX_SMP})",
        )
        p.add_argument(
            "--accel",
            choices=("auto", "tcg", "kvm"),
            default="auto",
            help="auto: KVM when usable, else TCG (default auto)",
        )
        p.add_argument("--console", action="store_true", help="echo the guest console")
        p.add_argument(
            "--siw",
            action="append",
            default=[],
            metavar="KNOB=VALUE",
            help=f"set a siw knob first ({', '.join(SIW_DEFAULTS)}; aliases crc_required, ...)",
        )
        p.set_defaults(func=func)
        one_line_errors(p)
        if name == "shell-run":
            p.add_argument(
                "-f",
                "--forward",
                action="append",
                default=[],
                metavar="HOST:GUEST",
                help="forward 127.0.0.1:HOST to guest port GUEST (repeatable)",
            )
            p.add_argument(
                "--timeout",
                type=positive_seconds,
                default=120.0,
                help="command timeout in seconds (default 120)",
            )
            p.add_argument("--capture", metavar="PCAP", help="capture the command's traffic here")
            p.add_argument(
                "--iface", default="eth0", help="capture interface, eth0 or lo (default eth0)"
            )
            p.add_argument(
                "--via",
                choices=("netdev", "tcpdump"),
                help="netdev: QEMU's dump of the guest NIC (eth0 only, lossless; the default"
                " for eth0); tcpdump: in the guest (the default for lo)",
            )
            p.add_argument("cmd", nargs=argparse.REMAINDER, help="shell command (after --)")


def _forwards(items: list[str]) -> list[tuple[int, int]]:
    out = []
    for item in items:
        host, sep, guest = item.partition(":")
        ports = (int(host), int(guest)) if sep and host.isdigit() and guest.isdigit() else (0, 0)
        if not all(0 < port < 65536 for port in ports):
            raise CliError(f"--forward wants HOST:GUEST ports (1 to 65535), got {item!r}")
        out.append(ports)
    return out


def run_build(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    try:
        arts = build(refresh=args.refresh, timeout=args.timeout, progress=print_progress)
    except SiwVmError as exc:
        raise CliError(str(exc)) from None
    print(f"siw VM ready in {time.monotonic() - t0:.1f} s: kernel {arts.kver}, {arts.rootfs}")
    return 0


def run_info(args: argparse.Namespace) -> int:
    print(f"cache: {cache_dir()}")
    try:
        arts = find_artifacts()
    except SiwVmError as exc:
        print(f"not built: {exc}")
        return 1
    print(f"kernel: {arts.kver}")
    for path in (arts.kernel, arts.initrd, arts.rootfs, arts.siw_ko):
        size = path.stat().st_size if path.exists() else 0
        print(f"  {path} ({size / 1e6:.1f} MB)")
    print(f"guest address {GUEST_ADDR}; the host is {HOST_ADDR} inside the guest")
    return 0


def _boot(args: argparse.Namespace, forwards: list[tuple[int, int]] | None = None) -> SiwVM:
    try:
        knobs = parse_kv(args.siw)
        normalize(knobs)  # bad --siw items are refused before the boot, not after it
    except SiwVmError as exc:
        raise CliError(f"--siw: {exc}") from None
    try:
        vm = SiwVM(
            forwards=forwards or (),
            smp=args.smp,
            accel=args.accel,
            boot_timeout=args.boot_timeout,
            echo_console=args.console,
        )
        vm.start()
        if knobs:
            vm.set_siw(**knobs)
    except SiwVmError as exc:
        raise CliError(str(exc)) from None
    return vm


def run_boot_check(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    vm = _boot(args)
    try:
        print(f"booted in {vm.boot_seconds:.1f} s (accel {vm.accel}, {vm.smp} vCPU)")
        links = vm.run("rdma link show; ibv_devices", timeout=30)
        print(links.output.rstrip())
        for name, value in vm.siw_params().items():
            print(f"siw.{name} = {value}")
        ok = links.ok and "siw0" in links.stdout
    except SiwVmError as exc:
        raise CliError(str(exc)) from None
    finally:
        vm.stop()
    print(f"boot-check {'passed' if ok else 'FAILED'} in {time.monotonic() - t0:.1f} s")
    return 0 if ok else 1


def run_shell(args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise CliError("shell-run needs a command, e.g. iwarp siwvm shell-run -- rdma link")
    check_outputs(("--capture", args.capture))
    vm = _boot(args, _forwards(args.forward))
    try:
        if args.capture:
            name = Path(args.capture).stem
            with vm.capture(name, iface=args.iface, via=args.via, dest=args.capture):
                result = vm.run(" ".join(cmd), timeout=args.timeout)
            print(f"capture: {args.capture}", file=sys.stderr)
        else:
            result = vm.run(" ".join(cmd), timeout=args.timeout)
    except SiwVmError as exc:
        raise CliError(str(exc)) from None
    finally:
        vm.stop()
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    if result.timed_out:
        print(f"siwvm: command timed out after {args.timeout} s", file=sys.stderr)
        return 124
    return result.rc or 0
