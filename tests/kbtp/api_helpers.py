"""Shared pieces of the application-API tests: a target configuration and block contents."""

from __future__ import annotations

from kbtp.target_config import InitiatorConfig, TargetConfig

BLOCK = 8192
CREDITS = 4
MAX_INLINE = 512
A = InitiatorConfig(b"a", 0, 128, 96, "red")
B = InitiatorConfig(b"b", 128, 128, 96, "red")


def config(**overrides: object) -> TargetConfig:
    """Blocks of 8 KiB (several FPDUs each), 4 credits: batches outgrow the credits."""
    base: dict[str, object] = dict(
        block_size=BLOCK,
        pool_blocks=192,
        initiators=(A, B),
        request_credits=CREDITS,
        max_inline=MAX_INLINE,
    )
    base.update(overrides)
    return TargetConfig(**base)  # type: ignore[arg-type]


def pattern(tag: int, size: int) -> bytes:
    """``size`` octets that differ per ``tag`` and per position."""
    return bytes((tag * 131 + i * 7 + (i >> 8)) & 0xFF for i in range(size))
