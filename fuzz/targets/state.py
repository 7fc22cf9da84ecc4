"""State operation scripts: every run, values, reset and close (and every broken rule) checked
against NumPy, the manual output-to-input loop and the state rules; each script runs twice."""

from __future__ import annotations

from fuzz.invariants import Finding, guarded
from fuzz.source import ByteSource, RandomSource, RecordingSource

INSTRUMENT = ("reference_impl.state", "reference_impl.executor", "reference_impl.values",
              "reference_impl.bindings", "fuzz.statescript")
DICTIONARY = None
MAX_LEN = 4096


def _run(data: bytes) -> list[str]:
    from fuzz import statescript

    script = statescript.gen_script(ByteSource(data))
    try:
        return statescript.run_script(script)
    except statescript.Mismatch as mismatch:
        raise Finding("state-mismatch", str(mismatch), f"state:{str(mismatch).split('(', 1)[0]}") from None


def one_input(data: bytes) -> None:
    first = guarded(lambda: _run(data), what="state-script")
    second = guarded(lambda: _run(data), what="state-script")
    if first != second:
        raise Finding("nondeterministic", f"outcomes {first} then {second}", "state-script")


def seeds(count: int = 80) -> list[bytes]:
    from fuzz import statescript

    streams = []
    for seed in range(count):
        recorder = RecordingSource(RandomSource(f"state-{seed}"))
        statescript.gen_script(recorder)
        streams.append(bytes(recorder.recorded))
    return streams
