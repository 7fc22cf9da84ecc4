"""Near-valid generators: every error code is produced, exactly, by breaking one rule of a valid model."""

from __future__ import annotations

import pytest
from hypothesis import given

from fuzz import gen, models, mutators
from fuzz.cases import FuzzCase, run_case
from fuzz.source import ByteSource, RandomSource
from fuzz.strategies import near_valid_cases, profile
from reference_impl import ErrorCode, schema

REPRESENTATION_CODES = sorted(mutators.MUTATORS, key=lambda c: c.value)


def test_every_error_code_has_a_near_valid_generator():
    """Model mutators, state/graph scripts and KV scripts together produce every code, each family its own."""
    from fuzz.kvscript import KV_CODES
    from fuzz.statescript import STATE_CODES

    families = [set(mutators.MUTATORS), set(STATE_CODES), set(KV_CODES)]
    assert set.union(*families) == set(ErrorCode)
    assert sum(len(f) for f in families) == len(ErrorCode)  # disjoint


def test_model_mutators_cover_the_representation_and_binding_codes():
    layers = ("STATE_", "KV_", "EXPORT_", "EXECUTION_", "OPERATOR_", "REWRITE_", "ATTENTION_", "OWNERLESS_")
    assert {c for c in ErrorCode if not c.value.startswith(layers)} == set(mutators.MUTATORS)


@pytest.mark.parametrize("code", REPRESENTATION_CODES, ids=lambda c: c.value)
def test_near_valid_generator_produces_exactly_its_code(code):
    @profile(scale=0.5)
    @given(near_valid_cases(code))
    def check(case):
        verdict, _ = run_case(case)
        assert verdict.code == code.value, f"{case.rule}: {verdict}"

    check()


@pytest.mark.parametrize("code", REPRESENTATION_CODES, ids=lambda c: c.value)
def test_near_valid_case_keeps_its_verdict_as_bytes(code):
    """The serialized form of a near-valid model is rejected the same way (what byte-level targets see)."""
    src = RandomSource(f"bytes-{code.value}")
    case = mutators.near_valid(src, models.gen_model(src), code)
    as_bytes = FuzzCase(case.model_bytes(), case.op, case.name, case.field, case.files, case.expected, case.rule)
    assert run_case(as_bytes)[0].code == code.value


def test_generators_replay_from_recorded_bytes():
    """A RecordingSource stream makes ByteSource rebuild the identical case (seed corpora rely on it)."""
    from fuzz.source import RecordingSource

    for seed in range(5):
        recorder = RecordingSource(RandomSource(seed))
        first = mutators.near_valid(recorder, models.gen_model(recorder))
        replay = ByteSource(bytes(recorder.recorded))
        second = mutators.near_valid(replay, models.gen_model(replay))
        assert first.model_bytes() == second.model_bytes()
        assert (first.expected, first.op, first.name, first.files) == \
            (second.expected, second.op, second.name, second.files)


def test_exhausted_byte_source_still_yields_a_valid_model():
    generated = models.gen_model(ByteSource(b""))
    assert isinstance(generated.model, type(schema.ModelProto()))
    verdict, _ = run_case(FuzzCase(generated.model, "all", files=generated.files))
    assert verdict.ok


def test_generators_stay_small_when_references_fan_out():
    """Six declarations of four references each: sizes are memoized and the record layout falls back
    to a small one instead of packing 4**6 leaves (a campaign once hung here)."""
    import time

    from fuzz import layouts as L
    from reference_impl import dtypes

    catalogue = L.Catalogue()
    catalogue.declarations[1] = L.Declaration(1, L.Structure([("x", L.Tensor(dtypes.UINT8, ()))]))
    for type_id in range(2, 8):
        fields = [(f"f{i}", L.Ref(type_id - 1)) for i in range(4)]
        catalogue.declarations[type_id] = L.Declaration(type_id, L.Structure(fields))
    start = time.process_time()
    assert L.bits(L.Ref(7), catalogue) == 8 * 4**6
    fell_back = 0
    for seed in range(20):
        value, expected, payload = gen.gen_struct_value(RandomSource(f"fan-out-{seed}"), catalogue, "v")
        assert len(expected.leaves) + len(expected.constants) <= 512
        assert len(payload) == expected.records * expected.record_bytes
        fell_back += value.struct_type.WhichOneof("kind") == "bit_packing"
    assert fell_back and time.process_time() - start < 5.0


def _shaped(generated) -> tuple[int, int]:
    """(levels, fan) of the generated model's shaped block, (0, 0) without one."""
    block = [decl for decl in generated.model.struct_types if decl.type_id >= gen.SHAPED_IDS]
    if not block:
        return 0, 0
    top = max(block, key=lambda decl: decl.type_id)
    fan = sum(f.WhichOneof("content") == "type" and f.type.WhichOneof("value") == "struct_type"
              for f in top.structure.field)
    return len(block), fan


def _diamond_streams(max_values: int, wanted: int) -> list[bytes]:
    """Recorded generator choices of models whose shaped block is a diamond of 20+ levels (fan >= 2)."""
    from fuzz.source import RecordingSource

    streams = []
    for seed in range(200):
        recorder = RecordingSource(RandomSource(f"shaped-{seed}"))
        levels, fan = _shaped(models.gen_model(recorder, max_values=max_values))
        if levels >= 20 and fan >= 2:
            streams.append(bytes(recorder.recorded))
            if len(streams) == wanted:
                break
    return streams


def test_generators_produce_diamonds_the_fuzz_targets_load_and_run():
    """The generators emit deep diamond-shaped catalogues (at least 2**20 reference paths) bound as
    state, and both the structured and the state target construct executors and states from them:
    expanding such a catalogue path by path never returns, so fuzzing finds that class of bug."""
    from fuzz import statescript
    from fuzz.source import RecordingSource
    from fuzz.targets import load

    streams = _diamond_streams(4, 2)
    assert len(streams) == 2
    for stream in streams:
        levels, fan = _shaped(models.gen_model(ByteSource(stream), max_values=4))  # replays the same model
        assert levels >= 20 and fan >= 2
        load("structured").one_input(b"\x00" + stream)  # first choice 0: the valid-model path
    script = RecordingSource(RandomSource("shaped-state"))
    statescript.gen_script(script)
    load("state").one_input(bytes(script.recorded) + _diamond_streams(2, 1)[0])
