"""Fuzz targets: ``one_input(data: bytes)`` per target, raising ``fuzz.invariants.Finding`` on a breach.

Each module also names what atheris instruments (``INSTRUMENT``), a libFuzzer dictionary
(``DICTIONARY`` under corpus/dict) and the maximum input length (``MAX_LEN``). The ``fuzz/*_fuzzer.py``
files are the OSS-Fuzz entry points that wrap these modules.
"""

from __future__ import annotations

import importlib
from types import ModuleType

TARGETS = ("verify", "structured", "differential", "state", "properties")


def load(name: str) -> ModuleType:
    if name not in TARGETS:
        raise KeyError(f"unknown target {name!r}; targets are {', '.join(TARGETS)}")
    return importlib.import_module(f"fuzz.targets.{name}")
