"""The prefix-cache example (docs/examples/prefix_cache.py) runs, verifies its bytes, and
what README.md shows of it is its code (docs/kbtp.md §13.6)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from kbtp.client_sync import KbtpClient
from tests.kbtp.api_helpers import BLOCK, config
from tests.kbtp.targets import target_thread

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "prefix_cache.py"


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("prefix_cache_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_example_runs_and_reports(
    example: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    report = example.main(["--block-size", "16K", "--blocks", "12", "--rounds", "2"])
    out = capsys.readouterr().out
    assert "stored 12 blocks (then 0), prefix hit: 12 of 14 blocks" in out
    assert "every loaded byte verified" in out
    assert report["block_size"] == 16384 and report["blocks"] == 24
    assert report["arena_gbps"] > 0 and report["baseline_gbps"] > 0


@pytest.mark.both_targets
def test_prefix_cache_hits_only_the_shared_prefix(example: ModuleType) -> None:
    """A bytearray arena: keys chain over the prefix, so a change in block 1 misses blocks
    1.. even where later tokens agree; stored blocks are not stored twice."""
    with target_thread(config()) as target, KbtpClient("127.0.0.1", target.port, "a") as client:
        arena = client.register(bytearray(8 * BLOCK))
        cache = example.PrefixCache(client, arena, block_tokens=4)
        for slot in range(4):
            arena.span(slot * BLOCK, BLOCK)[:] = example.fake_kv(slot, BLOCK)
        tokens = list(range(16))
        assert cache.store(tokens, range(4)) == 4 and cache.store(tokens, range(4)) == 0
        changed = tokens[:4] + [99] + tokens[5:]
        assert cache.keys(changed)[0] == cache.keys(tokens)[0]
        assert cache.load(changed, range(4, 8)) == 1
        assert bytes(arena.span(4 * BLOCK, BLOCK)) == example.fake_kv(0, BLOCK)
        assert bytes(arena.span(5 * BLOCK, BLOCK)) == bytes(BLOCK)  # nothing loaded there
        assert cache.load(tokens + [1, 2], range(4, 8)) == 4
        for slot in range(4):
            assert bytes(arena.span((4 + slot) * BLOCK, BLOCK)) == example.fake_kv(slot, BLOCK)
        # A block freed behind the cache's back: its load fails, the prefix stops there.
        handle, _ = cache.handles[cache.keys(tokens)[2]]
        assert client.free([handle])[0].ok
        assert cache.load(tokens, range(4, 8)) == 2


def test_readme_shows_the_examples_code() -> None:
    """Every line of README.md's prefix-cache block is a line of the example."""
    readme = (ROOT / "README.md").read_text()
    [block] = re.findall(r"```python prefix-cache\n(.*?)```", readme, re.S)
    source = {line.strip() for line in EXAMPLE.read_text().splitlines()}
    shown = [line.strip() for line in block.splitlines() if line.strip()]
    assert len(shown) > 10
    assert [line for line in shown if line not in source] == []
