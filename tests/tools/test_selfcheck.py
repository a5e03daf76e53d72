"""``iwarp selfcheck`` runs end to end and reports every check."""

from __future__ import annotations

from pathlib import Path

import pytest

from stack.cli.iwarp import main


def test_selfcheck_passes_and_keeps_captures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["selfcheck", "--keep", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "0 failed" in out and "FAIL" not in out
    assert (tmp_path / "ops-rev2-crc.pcap").stat().st_size > 1000


def test_bad_subcommand_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["no-such-command"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
