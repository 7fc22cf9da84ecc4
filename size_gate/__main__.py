"""``python -m size_gate``: see :mod:`size_gate.cli` (and :mod:`size_gate.startup` for why the deferral)."""

from size_gate.startup import defer_imports

defer_imports()

from size_gate.cli import main  # noqa: E402 - after the deferral above

raise SystemExit(main())
