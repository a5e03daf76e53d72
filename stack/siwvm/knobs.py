"""siw's knobs, exposed as module parameters by ``files/siw-modparams.sh``.

Each knob is read by siw per connection, so a test sets it through
``/sys/module/siw/parameters/<name>`` between cases (siw-vm spec §3d):

=================  =======  ==========================================================
parameter          default  effect
=================  =======  ==========================================================
mpa_crc_required   N        send C=1; as initiator refuse a Reply without C
mpa_crc_strict     N        with crc_required N: refuse a peer that sets C
peer_to_peer       N        initiator asks for RFC 6581 P2P and offers Write|Read RTR
mpa_version        2        Rev of the MPA Request (1: no IRD/ORD word)
try_gso            N        sets siw's private flag 0x08 in Request/Reply
zcopy_tx           Y        sendpage TX (tcpdump may miss its payloads); N: complete captures
tcp_nagle          N        N sets TCP_NODELAY
loopback_enabled   Y        allow siw links on lo
=================  =======  ==========================================================
"""

from __future__ import annotations

from stack.siwvm.errors import SiwVmError

SIW_PARAM_DIR = "/sys/module/siw/parameters"

SIW_DEFAULTS: dict[str, str] = {
    "mpa_crc_required": "N",
    "mpa_crc_strict": "N",
    "peer_to_peer": "N",
    "mpa_version": "2",
    "try_gso": "N",
    "zcopy_tx": "Y",
    "tcp_nagle": "N",
    "loopback_enabled": "Y",
}
"""Upstream siw's values (as sysfs prints them)."""

ALIASES: dict[str, str] = {
    "crc_required": "mpa_crc_required",
    "crc_strict": "mpa_crc_strict",
    "p2p": "peer_to_peer",
    "gso": "try_gso",
    "version": "mpa_version",
    "nagle": "tcp_nagle",
}

INT_PARAMS = frozenset({"mpa_version"})


def param_name(knob: str) -> str:
    """The sysfs parameter name of ``knob`` (full name or short alias)."""
    name = ALIASES.get(knob, knob)
    if name not in SIW_DEFAULTS:
        raise SiwVmError(f"unknown siw knob {knob!r}; known: {sorted(SIW_DEFAULTS)}")
    return name


def encode(name: str, value: bool | int | str) -> str:
    """The text sysfs prints for ``value`` of parameter ``name`` (Y/N, or a number)."""
    if name in INT_PARAMS:
        if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).isdigit():
            raise SiwVmError(f"siw {name} takes a number, not {value!r}")
        return str(int(value))
    if isinstance(value, bool):
        return "Y" if value else "N"
    text = str(value).strip().upper()
    if text in ("Y", "1", "YES", "TRUE", "ON"):
        return "Y"
    if text in ("N", "0", "NO", "FALSE", "OFF"):
        return "N"
    raise SiwVmError(f"siw {name} takes a boolean, not {value!r}")


def normalize(knobs: dict[str, bool | int | str]) -> dict[str, str]:
    """Map ``{knob or alias: value}`` to ``{param name: sysfs text}``."""
    out: dict[str, str] = {}
    for knob, value in knobs.items():
        name = param_name(knob)
        out[name] = encode(name, value)
    return out


def parse_kv(items: list[str]) -> dict[str, bool | int | str]:
    """Parse CLI ``KNOB=VALUE`` items (values stay text; :func:`normalize` checks them)."""
    knobs: dict[str, bool | int | str] = {}
    for item in items:
        knob, sep, value = item.partition("=")
        if not sep:
            raise SiwVmError(f"expected KNOB=VALUE, got {item!r}")
        knobs[knob.strip()] = value.strip()
    return knobs
