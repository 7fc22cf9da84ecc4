#!/usr/bin/env python3
"""OSS-Fuzz entry point for the ``statediff`` target (see fuzz/targets/statediff.py)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fuzz.harness import fuzz_main  # noqa: E402


def main() -> None:
    fuzz_main("statediff")


if __name__ == "__main__":
    main()
