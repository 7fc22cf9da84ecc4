"""``python -m fuzz``: see fuzz/cli.py."""

from fuzz.cli import main

raise SystemExit(main())
