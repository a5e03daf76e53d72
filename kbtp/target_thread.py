"""A KBTP target served from its own RNIC thread, for synchronous programs and tests.

:class:`TargetThread` runs a :class:`~kbtp.target.KbtpTarget` on a
:class:`~stack.verbs_sync.RnicThread` (the background trio loop of the synchronous verbs),
so a program without a trio loop of its own can serve blocks next to a
:class:`~kbtp.client_sync.KbtpClient` (docs/kbtp.md §13.5).
"""

from __future__ import annotations

from typing import Any

from kbtp.target import KbtpTarget
from kbtp.target_config import TargetConfig
from stack.rnic import Rnic
from stack.verbs_sync import Closing, RnicThread
from stack.verbs_sync.portal import CALL_TIMEOUT, STOP_TIMEOUT

__all__ = ["TargetThread"]


class TargetThread(Closing):
    """``config`` served on ``host``:``port`` (0: any free port; the bound one is ``port``)
    until :meth:`close`; ``target_options`` go to :class:`~kbtp.target.KbtpTarget`."""

    def __init__(
        self,
        config: TargetConfig,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        name: str = "kbtp-target",
        timeout: float = CALL_TIMEOUT,
        **target_options: Any,
    ) -> None:
        self.thread = RnicThread(Rnic(name))
        try:
            self.target = KbtpTarget(config, rnic=self.thread.rnic, **target_options)
            self.port: int = self.thread.run(self._start, host, port, timeout=timeout)
        except BaseException:
            self.thread.stop()
            raise
        self.host = host

    async def _start(self, host: str, port: int) -> int:
        bound: int = await self.thread.cm.nursery.start(self.target.serve, host, port)
        return bound

    def close(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop serving (idempotent): every session is torn down and the thread ends."""
        self.thread.stop(timeout)
