"""``python -m stack``: the ``iwarp`` command."""

from stack.cli.iwarp import main

raise SystemExit(main())
