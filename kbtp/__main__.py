"""``python -m kbtp``: the ``kbtp`` command."""

from kbtp.cli import main

raise SystemExit(main())
