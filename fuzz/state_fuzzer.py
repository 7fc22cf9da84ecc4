#!/usr/bin/env python3
"""OSS-Fuzz entry point for the ``state`` target (see fuzz/targets/state.py)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fuzz.harness import fuzz_main  # noqa: E402


def main() -> None:
    fuzz_main("state")


if __name__ == "__main__":
    main()
