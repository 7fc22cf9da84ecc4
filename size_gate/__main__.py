"""``python -m size_gate``: see :mod:`size_gate.cli`."""

from .cli import main

raise SystemExit(main())
