"""State, binding and KV scripts on the oracle and a subject: verdicts, values, retained values, counters
and buffer identity relations must agree (``fuzz.statediff``).

The subject is the differential target's (``FUZZ_SUBJECT`` adapter or ``FUZZ_TESTEE`` subprocess). The
input drives the generators (``ByteSource``): the first choice picks a family (the state script of
``fuzz.statescript`` with held, cancelled and concurrent calls; a decode model of ``fuzz.kvscript`` over a
contiguous or paged cache with Attention variants; a binding declaration of ``fuzz.bindscript``). Held
operations are generated only for subjects that support held runs. The subject plays each scenario twice
and must answer the same both times.
"""

from __future__ import annotations

from fuzz.invariants import Finding, guarded
from fuzz.source import ByteSource, RandomSource, RecordingSource

INSTRUMENT = ("reference_impl.state", "reference_impl.bindings", "reference_impl.values", "reference_impl.kv",
              "conformance.adapters", "fuzz.statediff", "fuzz.statescript", "fuzz.kvscript", "fuzz.bindscript")
DICTIONARY = None
MAX_LEN = 4096


def _holds(subject) -> bool:
    return bool(getattr(subject, "supports_hold", False))


def _by_value(subject) -> bool:
    from conformance.adapters.testee_client import TesteeAdapter

    return isinstance(subject, TesteeAdapter)


def build(data: bytes, held: bool):
    from fuzz import statediff

    scn = statediff.scenario(ByteSource(data), held)
    statediff.freeze(scn.initial)
    for op in scn.ops:
        for part in (op, op.second) if op.second is not None else (op,):
            statediff.freeze(part.feeds)
            statediff.freeze(part.initial)
    return scn


def one_input(data: bytes) -> None:
    from fuzz import statediff
    from fuzz.subjects import end_case
    from fuzz.targets.differential import adapters

    oracle, subject = adapters()
    scn = guarded(lambda: build(data, _holds(subject)), what="generate")
    by_value = _by_value(subject)
    try:
        want = guarded(lambda: statediff.play(oracle, scn, by_value), what="oracle")
        got = guarded(lambda: statediff.play(subject, scn, by_value), what="subject")
        again = guarded(lambda: statediff.play(subject, scn, by_value), what="subject")
        if statediff.digest(got) != statediff.digest(again):
            raise Finding("nondeterministic",
                          f"the subject answered a scenario differently twice: {scn.describe()}",
                          f"{getattr(subject, 'name', 'subject')}:{scn.family}")
        problems = statediff.compare(scn, want, got)
    finally:
        end_case(subject)
    if problems:
        key, kind, message = problems[0]
        raise Finding("disagreement", f"{message} [{scn.describe()}]",
                      f"{getattr(subject, 'name', 'subject')}:{statediff.where(scn, key)}:{kind}")


def seeds(count: int = 120) -> list[bytes]:
    from fuzz import statediff

    streams = []
    for seed in range(count):
        recorder = RecordingSource(RandomSource(f"statediff-{seed}"))
        statediff.scenario(recorder, held=True)
        streams.append(bytes(recorder.recorded))
    return streams
