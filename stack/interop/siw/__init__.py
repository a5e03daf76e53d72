"""The siw interop suite: pytest modules run by ``iwarp interop --peer siw-vm``."""

__all__: list[str] = []
