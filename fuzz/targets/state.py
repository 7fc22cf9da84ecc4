"""State operation scripts: every run, values, reset and close (and every broken rule) checked
against NumPy, the manual output-to-input loop and the state rules; each script runs twice (it is
generated once). The bytes after the script drive a generated model (catalogue with shared, deep and
diamond-shaped references, external payloads) that is loaded into the executor and run as a state."""

from __future__ import annotations

from fuzz.invariants import Finding, guarded
from fuzz.source import ByteSource, RandomSource, RecordingSource

INSTRUMENT = ("reference_impl.state", "reference_impl.executor", "reference_impl.values",
              "reference_impl.bindings", "reference_impl.structs", "reference_impl.payload", "fuzz.statescript",
              "fuzz.gen", "fuzz.layouts")
DICTIONARY = None
MAX_LEN = 4096


def _generate(data: bytes):
    """The script and the model the input's bytes drive, generated once: both runs use the same objects,
    so a run that altered what it was given (the caller's model or values) also shows as a difference."""
    from fuzz import gen, statescript

    src = ByteSource(data)
    script = statescript.gen_script(src)
    return script, gen.gen_model(src, max_values=2)


def _run(script, generated) -> list[str]:
    from fuzz import checks, statescript
    from fuzz.cases import scratch

    try:
        outcomes = statescript.run_script(script)
    except statescript.Mismatch as mismatch:
        raise Finding("state-mismatch", str(mismatch), f"state:{str(mismatch).split('(', 1)[0]}") from None
    try:
        checks.check_runtime(generated, scratch().populate(generated.files))
    except checks.Mismatch as mismatch:
        raise Finding("state-mismatch", str(mismatch), "state:typed-model") from None
    return outcomes


def one_input(data: bytes) -> None:
    script, generated = guarded(lambda: _generate(data), what="state-script")
    first = guarded(lambda: _run(script, generated), what="state-script")
    second = guarded(lambda: _run(script, generated), what="state-script")
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
