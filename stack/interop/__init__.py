"""The Linux siw interop suite and its helpers (shipped with the wheel; ``iwarp interop``)."""

__all__: list[str] = []
