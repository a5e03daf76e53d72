"""``python -m kbtp.cli``: the ``kbtp`` command."""

from kbtp.cli import main

raise SystemExit(main())
