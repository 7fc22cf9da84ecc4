"""Hypothesis properties driven by libFuzzer: ``fuzz_one_input`` turns the fuzzer's bytes into the
property's examples, so coverage guidance explores the same laws the test suite states.

Input format: the first byte selects a property of ``fuzz.properties.BRIDGED``; the rest is the
Hypothesis buffer.
"""

from __future__ import annotations

from fuzz.invariants import Finding, guarded

INSTRUMENT = ("reference_impl", "fuzz.gen", "fuzz.layouts")
DICTIONARY = None
MAX_LEN = 8192


def one_input(data: bytes) -> None:
    from fuzz.properties import BRIDGED

    if not data:
        return
    prop = BRIDGED[data[0] % len(BRIDGED)]

    def run() -> None:
        try:
            prop.hypothesis.fuzz_one_input(data[1:])
        except AssertionError as failure:
            raise Finding("property", f"{prop.__name__}: {failure}", f"property:{prop.__name__}") from None

    guarded(run, what=prop.__name__)


def seeds() -> list[bytes]:
    import random

    from fuzz.properties import BRIDGED

    rng = random.Random(1)
    return [bytes([index]) + rng.randbytes(rng.randint(16, 1024)) for index in range(len(BRIDGED))
            for _ in range(8)]
