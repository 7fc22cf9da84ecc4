"""Seed material shared by the targets' ``seeds()``: the conformance cases' models, generated valid and
near-valid models, and recorded choice streams that replay into them. Kept apart from ``fuzz/corpus.py``
(which writes every target's seeds) so targets and the corpus writer never import each other."""

from __future__ import annotations

from fuzz import models, mutators
from fuzz.source import RandomSource, RecordingSource

GENERATED_SEEDS = 120


def conformance_models(corpus: str | None = None) -> list[bytes]:
    """Model bytes of every conformance case. A case that cannot be built is a defect of the suite, not
    a seed to leave out: every such case is reported in one ``SuiteError``."""
    from conformance.adapters import SuiteError
    from conformance.cases import load_cases

    models, problems = [], []
    for case in load_cases(corpus):
        try:
            models.append(case.model_bytes())
        except Exception as error:  # noqa: BLE001 - any builder error is reported below, with its case
            problems.append(f"{case.id}: {type(error).__name__}: {error}")
    if problems:
        raise SuiteError(f"{len(problems)} conformance case(s) cannot be built as seeds:\n  "
                         + "\n  ".join(problems))
    return models


def generated_models(count: int = GENERATED_SEEDS) -> list[bytes]:
    """Valid models and one near-valid model per error code, serialized."""
    from reference_impl import examples

    blobs = [examples.spec_example_model().SerializeToString()]
    for seed in range(count):
        blobs.append(models.gen_model(RandomSource(f"valid-{seed}")).model.SerializeToString())
    for code in sorted(mutators.MUTATORS, key=lambda c: c.value):
        src = RandomSource(f"near-{code.value}")
        case = mutators.near_valid(src, models.gen_model(src), code)
        blobs.append(case.model_bytes())
    return blobs


def structured_streams(count: int = GENERATED_SEEDS, prefix: bytes = b"") -> list[bytes]:
    """Choice streams that replay (through ByteSource) into valid and near-valid cases."""
    streams = []
    for seed in range(count):
        recorder = RecordingSource(RandomSource(f"structured-{seed}"))
        mode = recorder.integer(0, 3)
        generated = models.gen_model(recorder, max_values=4)
        if mode:
            mutators.near_valid(recorder, generated)
        streams.append(prefix + bytes(recorder.recorded))
    codes = sorted(mutators.MUTATORS, key=lambda c: c.value)
    for index, code in enumerate(codes):  # one stream per code: mode byte, model, code index, mutation
        recorder = RecordingSource(RandomSource(f"structured-{code.value}"))
        recorder.recorded += b"\x01"
        generated = models.gen_model(recorder, max_values=4)
        recorder.recorded += index.to_bytes(((len(codes) - 1).bit_length() + 7) // 8, "little")
        mutators.MUTATORS[code](recorder, generated)
        streams.append(prefix + bytes(recorder.recorded))
    return streams
