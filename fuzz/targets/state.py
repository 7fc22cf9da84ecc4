"""State operation scripts: every run, values, reset and close (and every broken rule) checked
against NumPy, the manual output-to-input loop and the state rules; each script runs twice, on two
states over one loaded model (generated and loaded once). The bytes after the script drive a generated
model (catalogue with shared, deep and diamond-shaped references, external payloads) that is loaded
into the executor and run as a state once."""

from __future__ import annotations

from fuzz.invariants import Finding, guarded
from fuzz.source import ByteSource, RandomSource, RecordingSource

INSTRUMENT = ("reference_impl.state", "reference_impl.executor", "reference_impl.values",
              "reference_impl.bindings", "reference_impl.structs", "reference_impl.payload", "fuzz.statescript",
              "fuzz.gen", "fuzz.layouts")
DICTIONARY = None
MAX_LEN = 4096


def _generate(data: bytes):
    """The script, the state model loaded into the executor, and the generated model the input's bytes
    drive, made once: both runs of the script use the same objects, so a run that altered what it was
    given (the caller's model, values or the loaded executor) also shows as a difference."""
    from fuzz import models, statescript

    src = ByteSource(data)
    script = statescript.gen_script(src)
    return script, statescript.LoadedModel(script.sm), models.gen_model(src, max_values=2)


def _run(script, loaded) -> list[str]:
    from fuzz import statescript

    try:
        return statescript.run_script(script, loaded)
    except statescript.Mismatch as mismatch:
        raise Finding("state-mismatch", str(mismatch), f"state:{str(mismatch).split('(', 1)[0]}") from None


def _check_typed_model(generated) -> None:
    """The generated model (catalogue-typed values) loads, makes a state and runs it; its checks raise,
    so they run once per input."""
    from fuzz import checks
    from fuzz.cases import scratch

    try:
        checks.check_runtime(generated, scratch().populate(generated.files))
    except checks.Mismatch as mismatch:
        raise Finding("state-mismatch", str(mismatch), "state:typed-model") from None


def one_input(data: bytes) -> None:
    script, loaded, generated = guarded(lambda: _generate(data), what="state-script")
    first = guarded(lambda: _run(script, loaded), what="state-script")
    second = guarded(lambda: _run(script, loaded), what="state-script")
    if first != second:
        raise Finding("nondeterministic", f"outcomes {first} then {second}", "state-script")
    guarded(lambda: _check_typed_model(generated), what="state-model")


def seeds(count: int = 80) -> list[bytes]:
    from fuzz import models, statescript

    streams = []
    for seed in range(count):
        recorder = RecordingSource(RandomSource(f"state-{seed}"))
        statescript.gen_script(recorder)
        models.gen_model(recorder, max_values=2)
        streams.append(bytes(recorder.recorded))
    return streams
