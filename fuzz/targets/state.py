"""State operation scripts: every run, values, reset and close (and every broken rule) checked
against NumPy, the manual output-to-input loop and the state rules; each script runs twice. The bytes
after the script drive a generated model (catalogue with shared, deep and diamond-shaped references,
external payloads) that is loaded into the executor and run as a state."""

from __future__ import annotations

from fuzz.invariants import Finding, guarded
from fuzz.source import ByteSource, RandomSource, RecordingSource

INSTRUMENT = ("reference_impl.state", "reference_impl.executor", "reference_impl.values",
              "reference_impl.bindings", "reference_impl.structs", "reference_impl.payload", "fuzz.statescript",
              "fuzz.gen", "fuzz.layouts")
DICTIONARY = None
MAX_LEN = 4096


def _run(data: bytes) -> list[str]:
    from fuzz import checks, gen, statescript
    from fuzz.cases import scratch

    src = ByteSource(data)
    script = statescript.gen_script(src)
    try:
        outcomes = statescript.run_script(script)
    except statescript.Mismatch as mismatch:
        raise Finding("state-mismatch", str(mismatch), f"state:{str(mismatch).split('(', 1)[0]}") from None
    generated = gen.gen_model(src, max_values=2)
    try:
        checks.check_runtime(generated, scratch().populate(generated.files))
    except checks.Mismatch as mismatch:
        raise Finding("state-mismatch", str(mismatch), "state:typed-model") from None
    return outcomes


def one_input(data: bytes) -> None:
    first = guarded(lambda: _run(data), what="state-script")
    second = guarded(lambda: _run(data), what="state-script")
    if first != second:
        raise Finding("nondeterministic", f"outcomes {first} then {second}", "state-script")


def seeds(count: int = 80) -> list[bytes]:
    from fuzz import gen, statescript

    streams = []
    for seed in range(count):
        recorder = RecordingSource(RandomSource(f"state-{seed}"))
        statescript.gen_script(recorder)
        gen.gen_model(recorder, max_values=2)
        streams.append(bytes(recorder.recorded))
    return streams
