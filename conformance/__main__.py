"""``python -m conformance``: see ``conformance.cli``."""

import sys

from conformance.cli import main

sys.exit(main())
