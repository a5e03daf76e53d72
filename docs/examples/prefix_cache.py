"""A prefix cache on KBTP: the application-shaped example of docs/kbtp.md §13.6.

An inference server keeps the KV cache of token prefixes it has computed.  This cache names
each full block of tokens by a key chained over the whole prefix up to it (so equal
prefixes give equal keys), maps each key to a KBTP handle, stores a block's KV bytes once,
and loads the blocks of the longest cached prefix of a new request straight into a
preallocated KV arena (a numpy array when numpy is installed, else a ``bytearray``),
registered once.

Run it (a target and a client in one process, over loopback TCP)::

    python docs/examples/prefix_cache.py --block-size 64K --blocks 256 --rounds 8

It prints the hits, verifies every loaded byte, and measures load throughput two ways:
batches into the registered arena, and the per-request path (``KbtpInitiator.load_into``,
which registers and deregisters each block's buffer) on the same session as the baseline.
"""

from __future__ import annotations

import argparse
import random
import time
import uuid
from collections.abc import Sequence
from typing import Any

import trio

from kbtp import (
    Arena,
    BlockRef,
    InitiatorConfig,
    KbtpClient,
    KbtpInitiator,
    TargetConfig,
    TargetThread,
)


class PrefixCache:
    """Token prefixes to KBTP handles: each block stored once, hits loaded into the arena."""

    def __init__(self, client: KbtpClient, arena: Arena, block_tokens: int) -> None:
        self.client, self.arena, self.block_tokens = client, arena, block_tokens
        self.block_size = client.block_size
        self.handles: dict[uuid.UUID, tuple[int, int]] = {}  # key -> (handle, generation)
        self.next_handle = client.ack.handle_base

    def keys(self, tokens: Sequence[int]) -> list[uuid.UUID]:
        """One key per full block, chained over every token up to the block's end: a
        name-based (SHA-1) UUID of the previous key and the block's tokens (RFC 4122 §4.3)."""
        keys, key = [], uuid.NAMESPACE_OID
        for end in range(self.block_tokens, len(tokens) + 1, self.block_tokens):
            key = uuid.uuid5(key, ",".join(map(str, tokens[end - self.block_tokens : end])))
            keys.append(key)
        return keys

    def store(self, tokens: Sequence[int], slots: Sequence[int]) -> int:
        """Store the blocks of ``tokens`` not cached yet from arena ``slots``; returns how
        many were stored (one batch, one call)."""
        new = [
            (key, slot)
            for key, slot in zip(self.keys(tokens), slots, strict=False)
            if key not in self.handles
        ]
        refs = []
        for _, slot in new:
            refs.append(BlockRef(self.next_handle, slot * self.block_size, self.block_size))
            self.next_handle += 1
        results = self.client.store(self.arena, refs)
        for (key, _), result in zip(new, results, strict=True):
            if result.ok:
                self.handles[key] = (result.handle, result.generation)
        return sum(r.ok for r in results)

    def load(self, tokens: Sequence[int], slots: Sequence[int]) -> int:
        """Load the longest cached prefix of ``tokens`` into arena ``slots``; returns the
        number of blocks now in the arena (the prefix the server need not recompute)."""
        hits = []
        for key in self.keys(tokens):
            if key not in self.handles:
                break
            hits.append(self.handles[key])
        refs = [
            BlockRef(handle, slot * self.block_size, self.block_size, generation)
            for (handle, generation), slot in zip(hits, slots, strict=False)
        ]
        loaded = 0
        for result in self.client.load(self.arena, refs):
            if not result.ok:
                break
            loaded += 1
        return loaded


# ------------------------------------------------------------------------------------------
# the run: a target, a client, requests sharing a prefix, throughput
# ------------------------------------------------------------------------------------------
def kv_arena(blocks: int, block_size: int) -> Any:
    """The preallocated KV memory: a numpy array if numpy is there, else a bytearray."""
    try:
        import numpy as np
    except ImportError:
        return bytearray(blocks * block_size)
    return np.zeros((blocks, block_size // 2), dtype=np.float16)


def fake_kv(block: int, block_size: int) -> bytes:
    """Stand-in KV bytes of one computed block (distinct per block)."""
    return random.Random(block).randbytes(block_size)


def per_request_loads(client: KbtpClient, handles: list[int], rounds: int) -> float:
    """The baseline: the same loads through ``load_into`` (a registration per block), as
    many in flight as the credits allow; returns the seconds taken."""
    block_size, credits = client.block_size, client.request_credits
    buffers = [bytearray(block_size) for _ in range(credits)]

    async def run(initiator: KbtpInitiator) -> float:
        start = time.perf_counter()
        for _ in range(rounds):
            async with trio.open_nursery() as nursery:
                for lane in range(credits):

                    async def lane_loads(lane: int = lane) -> None:
                        for handle in handles[lane::credits]:
                            await initiator.load_into(handle, buffers[lane])

                    nursery.start_soon(lane_loads)
        return time.perf_counter() - start

    return client.context.thread.run(run, client.initiator, timeout=None)


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description="A prefix cache on KBTP, measured.")
    parser.add_argument("--block-size", default="64K", help="octets per block (K/M suffixes)")
    parser.add_argument("--blocks", type=int, default=256, help="blocks of the shared prefix")
    parser.add_argument("--credits", type=int, default=32, help="requests in flight")
    parser.add_argument("--rounds", type=int, default=8, help="timed loads of the prefix")
    args = parser.parse_args(argv)
    size = args.block_size.upper()
    block_size = int(size.rstrip("KM")) << {"K": 10, "M": 20}.get(size[-1:], 0)
    blocks, rounds = args.blocks, args.rounds
    block_tokens = 16

    config = TargetConfig(
        block_size=block_size,
        pool_blocks=blocks + 8,
        initiators=(InitiatorConfig(b"server", 0, blocks + 8, blocks + 8),),
        request_credits=args.credits,
        max_inline=512,
    )
    with TargetThread(config) as target, KbtpClient("127.0.0.1", target.port, "server") as client:
        memory = kv_arena(2 * blocks, block_size)  # the server's KV cache, preallocated
        arena = client.register(memory)
        cache = PrefixCache(client, arena, block_tokens)
        prompt = list(range(blocks * block_tokens))  # a long shared system prompt
        first, second = prompt + [7, 7, 7], prompt + [9] * (2 * block_tokens)

        # Request 1 computed its KV into slots 0..blocks-1; store every full block once.
        for slot in range(blocks):
            arena.span(slot * block_size, block_size)[:] = fake_kv(slot, block_size)
        stored = cache.store(first, range(blocks))
        again = cache.store(first, range(blocks))  # already cached: nothing is sent
        # Request 2 shares the prompt: load its cached prefix into slots blocks..2*blocks-1.
        hits = cache.load(second, range(blocks, 2 * blocks))
        wrong = [
            i
            for i in range(hits)
            if bytes(arena.span((blocks + i) * block_size, block_size)) != fake_kv(i, block_size)
        ]
        if wrong:
            raise SystemExit(f"blocks {wrong} were loaded wrong")
        print(
            f"stored {stored} blocks (then {again}), prefix hit: {hits} of "
            f"{len(cache.keys(second))} blocks, every loaded byte verified"
        )

        # Throughput: the whole prefix loaded again, `rounds` times, one batch each.
        start = time.perf_counter()
        for _ in range(rounds):
            if cache.load(second, range(blocks, 2 * blocks)) != blocks:
                raise SystemExit("a cached block failed to load")
        arena_seconds = time.perf_counter() - start
        handles = [handle for handle, _ in cache.handles.values()]
        baseline_seconds = per_request_loads(client, handles, rounds)
    octets = rounds * blocks * block_size
    report = {
        "block_size": block_size,
        "in_flight": args.credits,
        "blocks": blocks * rounds,
        "arena_gbps": octets / arena_seconds / 1e9,
        "baseline_gbps": octets / baseline_seconds / 1e9,
    }
    print(
        f"load: {blocks * rounds} blocks of {block_size} octets, {args.credits} in flight: "
        f"arena batches {report['arena_gbps']:.3f} GB/s, "
        f"per-request registration {report['baseline_gbps']:.3f} GB/s"
    )
    return report


if __name__ == "__main__":
    main()
