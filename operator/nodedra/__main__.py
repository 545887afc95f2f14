"""``python -m nodedra``: the same as the ``nodedra`` command."""

from nodedra.cli import main

raise SystemExit(main())
