"""Fuzz targets: ``one_input(data: bytes)`` per target, raising ``fuzz.invariants.Finding`` on a breach.

Each module also names what atheris instruments (``INSTRUMENT``), a libFuzzer dictionary
(``DICTIONARY`` under corpus/dict) and the maximum input length (``MAX_LEN``). The ``fuzz/*_fuzzer.py``
files are the OSS-Fuzz entry points that wrap these modules.
"""

from __future__ import annotations

import importlib
from types import ModuleType

TARGETS = ("verify", "structured", "differential", "state", "properties", "statediff")


def load(name: str) -> ModuleType:
    """The target module. Every harness path (libFuzzer, replay, campaigns) loads targets here, so this
    is where the oracle is put in safe-read mode: a payload file changing under a run cannot kill it."""
    if name not in TARGETS:
        raise KeyError(f"unknown target {name!r}; targets are {', '.join(TARGETS)}")
    from reference_impl import payload

    payload.set_external_access("read")
    return importlib.import_module(f"fuzz.targets.{name}")
