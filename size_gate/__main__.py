"""``python -m size_gate``: see :mod:`size_gate.cli`."""

from size_gate.cli import main

raise SystemExit(main())
