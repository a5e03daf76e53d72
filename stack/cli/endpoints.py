"""``HOST:PORT`` as every command takes it, read in one place: ``iwarp bench --connect``,
``kbtp bench --connect``, ``iwarp conform`` and ``kbtp conform`` (the device, ``--listen``),
``iwarp interop --peer`` and ``iwarp dissect --initiator`` accept and refuse the same
addresses with the same words.

The forms: ``HOST:PORT``; ``[V6]:PORT`` (an IPv6 address in brackets); ``[V6]`` or a bare
``HOST`` (a bare IPv6 address too) where the command has a default port; a bare ``PORT``
where it has a default host.  A port is 0 to 65535, and not 0 for an address to connect
to: "any port" means something only to a listener.  Each command words the error it
raises from :class:`EndpointError` its own way (argparse's, or ``<prog>: error:``).
"""

from __future__ import annotations

PORT_MAX = 0xFFFF


class EndpointError(ValueError):
    """An address a command cannot use; the message says why."""


def parse_endpoint(
    text: str,
    *,
    default_host: str | None = None,
    default_port: int | None = None,
    connect: bool = False,
) -> tuple[str, int]:
    """(host, port) of ``text`` (module docstring); ``connect``: an address to connect to,
    so not port 0.  Raises :class:`EndpointError`."""
    if text.startswith("["):
        end = text.find("]")
        host, rest = text[1:end], text[end + 1 :]
        if end < 0 or (rest and not rest.startswith(":")):
            raise EndpointError(f"invalid address {text!r}")
        port_text: str | None = rest[1:] if rest else None
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    elif ":" in text:  # a bare IPv6 address
        host, port_text = text, None
    elif default_host is not None and text.isdigit():
        host, port_text = default_host, text
    else:
        host, port_text = text, None
    if port_text is None:
        if default_port is None:
            raise EndpointError(f"{text!r} is not HOST:PORT")
        port = default_port
    else:
        port = port_number(port_text, text)
    if not host:
        raise EndpointError(f"invalid address {text!r}: no host")
    if connect and port == 0:
        raise EndpointError(f"port must be 1 to 65535 to connect to, got 0 in {text!r}")
    return host, port


def port_number(port_text: str, text: str | None = None) -> int:
    """The port ``port_text`` (of the address ``text``): 0 to 65535, else
    :class:`EndpointError`."""
    where = f" in {text!r}" if text is not None and text != port_text else ""
    if not port_text.isdigit():
        raise EndpointError(f"invalid port {port_text!r}{where}")
    port = int(port_text)
    if port > PORT_MAX:
        raise EndpointError(f"port must be 0 to 65535, got {port_text}{where}")
    return port


def looks_like_endpoint(text: str) -> bool:
    """Whether ``text`` is written as an address (``HOST:PORT``, ``[V6]:PORT``) rather
    than a name (a suite, a case): a host, a colon and a number."""
    host, sep, port = text.rpartition(":")
    return bool(sep) and bool(host.strip("[]")) and port.isdigit()


__all__ = ["EndpointError", "PORT_MAX", "looks_like_endpoint", "parse_endpoint", "port_number"]
