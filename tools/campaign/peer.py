"""A KBTP initiator process for the fault part: busy until it is killed with SIGKILL.

``python -m tools.campaign.peer PORT IDENTITY``: connects with both direct modes, then
loops taking tickets (DIRECT_ALLOC reserve without BIND), ALLOC_STOREs of whole blocks
(read by the target over RDMA) and BINDs, printing ``ready`` once work is in flight.
"""

from __future__ import annotations

import sys

import trio

from kbtp import Capability, KbtpInitiator


async def hog(port: int, identity: str) -> None:
    caps = Capability.DIRECT_LOAD | Capability.DIRECT_ALLOC
    async with KbtpInitiator.connect("127.0.0.1", port, identity, capabilities=caps) as ini:
        assert ini.ack is not None
        base, count, size = ini.ack.handle_base, ini.ack.handle_count, ini.ack.block_size
        n = 0
        said = False
        while True:
            handle = base + n % count
            try:
                if n % 3 == 0:
                    await ini.reserve(b"t" * (size // 2))  # a ticket, never bound
                elif n % 3 == 1:
                    await ini.alloc_store(handle, b"s" * size, check=False)
                else:
                    await ini.direct_alloc(handle, b"d" * 100)
            except Exception:
                pass  # quota reached and the like: keep the target busy regardless
            n += 1
            if not said and n >= 3:
                print("ready", flush=True)
                said = True


def main() -> None:
    trio.run(hog, int(sys.argv[1]), sys.argv[2])


if __name__ == "__main__":
    main()
