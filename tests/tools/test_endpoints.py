"""``HOST:PORT`` read in one place (:mod:`stack.cli.endpoints`) for every command."""

from __future__ import annotations

import argparse

import pytest

from stack.bench.cli import parse_host_port
from stack.cli import CliError, port_number
from stack.cli.conform import parse_endpoint as conform_endpoint
from stack.cli.endpoints import EndpointError, looks_like_endpoint, parse_endpoint
from stack.cli.iwarp import main as iwarp_main


@pytest.mark.parametrize(
    "text, defaults, expected",
    [
        ("dut:7174", {}, ("dut", 7174)),
        ("10.0.0.1:0", {}, ("10.0.0.1", 0)),
        ("[::1]:9", {}, ("::1", 9)),
        ("[::1]", {"default_port": 18515}, ("::1", 18515)),
        ("::1", {"default_port": 18515}, ("::1", 18515)),
        ("example", {"default_port": 18515}, ("example", 18515)),
        ("7000", {"default_host": "0.0.0.0"}, ("0.0.0.0", 7000)),
        ("dut:7000", {"default_host": "0.0.0.0"}, ("dut", 7000)),
    ],
)
def test_the_forms_every_command_takes(
    text: str, defaults: dict[str, object], expected: tuple[str, int]
) -> None:
    assert parse_endpoint(text, **defaults) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text, kwargs, says",
    [
        ("dut", {}, "'dut' is not HOST:PORT"),
        ("7000", {}, "'7000' is not HOST:PORT"),
        ("dut:port", {}, "invalid port 'port' in 'dut:port'"),
        ("dut:", {}, "invalid port ''"),
        ("dut:70000", {}, "port must be 0 to 65535, got 70000 in 'dut:70000'"),
        (":7174", {}, "no host"),
        ("[::1", {}, "invalid address '[::1'"),
        ("[::1]7", {}, "invalid address"),
        ("dut:0", {"connect": True}, "port must be 1 to 65535 to connect to, got 0 in 'dut:0'"),
    ],
)
def test_what_no_command_takes(text: str, kwargs: dict[str, object], says: str) -> None:
    with pytest.raises(EndpointError) as refused:
        parse_endpoint(text, **kwargs)  # type: ignore[arg-type]
    assert says in str(refused.value)


def test_an_address_is_told_from_a_name() -> None:
    assert looks_like_endpoint("[::1]:7174") and looks_like_endpoint("dut:1")
    assert not looks_like_endpoint("siw-vm") and not looks_like_endpoint(":7174")
    assert not looks_like_endpoint("dut:port") and not looks_like_endpoint("MPA-01")


def test_each_command_words_the_same_refusal_its_own_way(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The bench's argparse type, conform's CliError, the -p option's argparse type and
    dissect's --initiator all refuse with the shared reason."""
    with pytest.raises(argparse.ArgumentTypeError, match="to connect to, got 0"):
        parse_host_port("dut:0")
    with pytest.raises(CliError, match="to connect to, got 0"):
        conform_endpoint("dut:0", connect=True)
    with pytest.raises(argparse.ArgumentTypeError, match="port must be 0 to 65535, got 70000"):
        port_number("70000")
    assert iwarp_main(["dissect", "/x.pcap", "--initiator", "10.0.0.1:99999"]) == 2
    err = capsys.readouterr().err
    assert "--initiator wants IP:PORT: port must be 0 to 65535, got 99999" in err
    with pytest.raises(SystemExit) as bench:
        iwarp_main(["bench", "read", "--connect", "dut:0"])
    assert bench.value.code == 2
    assert "argument --connect: port must be 1 to 65535 to connect to" in capsys.readouterr().err
