"""The statediff and differential generators make each dimension of fuzz.dimensions a deliberate choice, and
the planted faults of fuzz.planted_faults are real: each disagrees with the reference on some generated
scenario or input carrying its dimension, and the reference agrees with itself on the same inputs.

Counts are over a fixed number of seeded draws (``RandomSource``), and each dimension is checked on the
generated data itself (an array's layout read off the array, a size's remainder, a twin's one difference),
not only on the tag the generator attached.
"""

from __future__ import annotations

import collections
import functools

import numpy as np
import pytest

from conformance.adapters.reference import ReferenceAdapter
from fuzz import (
    bindscript,
    dimensions,
    gen,
    kvscript,
    models,
    mutators,
    planted_faults,
    statediff,
    statescript,
    subjects,
)
from fuzz.cases import scratch
from fuzz.source import RandomSource, RecordingSource
from fuzz.targets import differential
from fuzz.targets.statediff import build
from reference_impl import schema
from reference_impl.errors import ErrorCode

DRAWS = 400


@functools.cache
def scenarios() -> list:
    """DRAWS scenarios as the target builds them (recorded bytes replayed, values frozen)."""
    built = []
    for seed in range(DRAWS):
        recorder = RecordingSource(RandomSource(f"dimensions-{seed}"))
        statediff.scenario(recorder, True)
        built.append(build(bytes(recorder.recorded), True))
    return built


def tag_counts() -> collections.Counter:
    return collections.Counter(tag for scn in scenarios() for tag in set(scn.tags))


def test_every_position_occurs():
    counts = tag_counts()
    assert all(counts[f"position:{where}"] >= 20 for where in dimensions.POSITIONS), counts


def test_place_puts_the_item_first_middle_or_last():
    seen = collections.Counter(dimensions.place(RandomSource(seed), 5) for seed in range(60))
    assert {index for index, _ in seen} == {0, 2, 4}
    assert all(index == {"first": 0, "middle": 2, "last": 4}[where] for index, where in seen)


def test_a_twist_lands_on_a_binding_that_is_not_the_first():
    """The twisted binding (its input and output types differ, or it holds a string) is not always s0."""
    positions = collections.Counter()
    for seed in range(300):
        bm = bindscript.gen_binding_model(RandomSource(f"bind-{seed}"))
        graph = bm.model.graph
        inputs = {vi.name: vi.type for vi in graph.input}
        outputs = {vi.name: vi.type for vi in graph.output}
        differ = [index for index, (name, out) in enumerate(sorted(bm.bound.items()))
                  if inputs[name] != outputs[out]]
        for index in differ:
            positions["first" if index == 0 else "last" if index == len(bm.bound) - 1 else "middle"] += 1
    assert positions["middle"] >= 5 and positions["last"] >= 5 and positions["first"] >= 5, positions


def test_large_sizes_leave_a_partial_tile():
    sizes = [statescript.gen_state_model(RandomSource(f"size-{seed}")).n for seed in range(200)]
    large = [n for n in sizes if n > max(dimensions.TILES[0], 4)]
    assert len(large) >= 20
    assert all(n <= dimensions.MAX_LARGE for n in sizes)
    assert all(any(n > tile and n % tile for tile in dimensions.TILES) for n in large)
    assert any(n > 64 and n % 64 for n in large)
    assert tag_counts()["size:remainder"] >= 20


def test_paged_prefill_crosses_block_sizes():
    assert tag_counts()["size:remainder"] >= 20
    crossed = [op for scn in scenarios() if scn.family == "paged" for op in scn.ops if "size:remainder" in op.tags]
    assert crossed and all(op.feeds["k"].shape[2] > 1 for op in crossed)


def _twin_difference(a, b) -> list[str]:
    """The parts in which two state models differ: declared size, bias constant, update operators."""
    parts = []
    if a.graph.output[1].type != b.graph.output[1].type:
        parts.append("dim")
    if list(a.graph.initializer[0].float_data) != list(b.graph.initializer[0].float_data):
        parts.append("constant")
    if [n.op_type for n in a.graph.node] != [n.op_type for n in b.graph.node] or \
            [list(n.input) for n in a.graph.node] != [list(n.input) for n in b.graph.node]:
        parts.append("update")
    return parts


def test_state_twins_differ_in_exactly_one_part():
    found = collections.Counter()
    for scn in scenarios():
        if scn.family == "state" and scn.twins:
            parts = _twin_difference(scn.model, scn.twins[0])
            assert len(parts) == 1, (parts, scn.tags)
            assert f"twin:{parts[0]}" in scn.tags
            found[parts[0]] += 1
            assert [op.kind for op in scn.ops].count("reopen") == 1
    assert all(found[part] >= 5 for part in statescript.TWIN_PARTS), found


def _attributes(model) -> dict:
    node = next(n for n in model.graph.node if n.op_type in ("Attention", "PagedAttention"))
    return {a.name: (a.f, a.i, a.s) for a in node.attribute}


def test_decode_twins_differ_in_exactly_one_attribute():
    found = collections.Counter()
    for scn in scenarios():
        if scn.family in ("paged", "contiguous") and scn.twins:
            a, b = _attributes(scn.model), _attributes(scn.twins[0])
            changed = {name for name in set(a) | set(b) if a.get(name) != b.get(name)}
            # a format set where none was also spells out the other side's default ("dense")
            changed -= {name for name in changed if name in ("key_format", "value_format") and
                        b.get(name) == (0.0, 0, b"dense") and name not in a}
            assert len(changed) == 1, (changed, scn.tags)
            found[changed.pop()] += 1
    assert len(found) >= 4, found
    counts = tag_counts()
    assert counts["twin:after_reset"] >= 20


def test_odd_layouts_reach_the_caller_buffers():
    layouts = collections.Counter()
    for scn in scenarios():
        for op in scn.ops:
            for value in list(op.feeds.values()) + list(op.initial.values()):
                if isinstance(value, np.ndarray):
                    layouts[dimensions.layout_of(value)] += 1
    for layout in ("strided", "misaligned", "view_of_view", "zero_size"):
        assert layouts[layout] >= 20, layouts
    resets = collections.Counter()
    for seed in range(300):
        src = RandomSource(f"layout-{seed}")
        sm = statescript.gen_state_model(src, statescript.HOLD)
        op = statescript.odd_layouts(src, statescript.gen_op(src, sm, "reset"))
        resets.update(dimensions.layout_of(value) for value in op.initial.values())
    assert resets["big_endian"] >= 5 and resets["misaligned"] >= 5, resets


def test_lay_out_keeps_the_values():
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    for layout in dimensions.LAYOUTS:
        laid = dimensions.lay_out(array, layout)
        assert dimensions.layout_of(laid) == layout
        if layout != "zero_size":
            assert np.array_equal(laid, array) and not np.shares_memory(laid, array) or layout == "plain"


def test_attention_attributes_meet_every_block_format():
    combos = collections.Counter()
    for seed in range(700):
        dm = kvscript.gen_decode_model(RandomSource(f"combo-{seed}"))
        focus, form = dm.tags[0].split(":")[1].split("*")
        combos[(focus, form)] += 1
        attrs, formats = dm.attrs, (dm.attrs.get("key_format", "dense"), dm.attrs.get("value_format", "dense"))
        assert {"scale": "scale" in attrs, "softcap": bool(attrs.get("softcap")), "causal": attrs["is_causal"] == 1,
                "window": "left_window_size" in attrs, "mask_bool": dm.mask == "bool",
                "mask_float": dm.mask == "float", "gqa": dm.q_heads > dm.heads, "padding": dm.padding,
                "mqa": dm.heads == 1 and dm.q_heads > 1}.get(focus, True)
        if form == "mixed":
            assert formats[0] != formats[1]
        elif form == "unsigned":
            assert all(f.startswith("uint") for f in formats)
        elif form == "struct":
            assert formats[0] == "codebook2"
        elif form != "dense":
            assert formats == (form, form)
    paged_forms = [form for form in kvscript.BLOCK_FORMS if form != "dense"]
    for focus in ("scale", "softcap", "mask_bool", "mask_float", "causal", "gqa", "mqa", "padding", "window"):
        assert sum(combos[(focus, form)] > 0 for form in paged_forms) >= 3, (focus, combos)
    assert tag_counts()["phase:prefill"] >= 20 and tag_counts()["phase:decode"] >= 20


# ------------------------------------------------------------------------------------------ planted faults
def _first_disagreement(subject, limit: int = 600):
    oracle = ReferenceAdapter()
    for seed in range(limit):
        recorder = RecordingSource(RandomSource(f"planted-{seed}"))
        statediff.scenario(recorder, True)
        scn = build(bytes(recorder.recorded), True)
        problems = statediff.compare(scn, statediff.play(oracle, scn), statediff.play(subject, scn))
        if problems:
            reference = statediff.compare(scn, statediff.play(oracle, scn), statediff.play(ReferenceAdapter(), scn))
            return scn, problems[0], reference
    return None, None, None


@pytest.mark.parametrize("name", sorted(planted_faults.PLANTED))
def test_planted_fault_disagrees_with_the_reference(name):
    spec = planted_faults.PLANTED[name][0]
    subject = getattr(planted_faults, spec.split(":")[1])()
    scn, problem, reference = _first_disagreement(subject)
    assert problem is not None, f"{spec} agreed with the reference on every scenario"
    assert reference == [], f"the reference disagrees with itself: {reference}"
    needs = {"first item only": "position:", "dropped remainder": "size:remainder", "stale cache": "twin:",
             "odd layout copied": "layout:", "attribute x format": "attention:"}[name]
    assert any(tag.startswith(needs) for tag in scn.tags), (scn.tags, problem)


# ------------------------------------------------------------------------------- the differential target
DIFFERENTIAL_DRAWS = 400


def _stream(label: str, seed: int) -> bytes:
    """A structure-aware differential input as the seed corpus records them: valid one time in four."""
    recorder = RecordingSource(RandomSource(f"{label}-{seed}"))
    mode = recorder.integer(0, 3)
    generated = models.gen_model(recorder, max_values=4)
    if mode:
        mutators.near_valid(recorder, generated)
    return b"\x00" + bytes(recorder.recorded)


@functools.cache
def differential_inputs() -> list:
    """(case, buffer layouts) of DIFFERENTIAL_DRAWS inputs as the differential target builds them."""
    return [differential.prepared(_stream("differential", seed)) for seed in range(DIFFERENTIAL_DRAWS)]


@functools.cache
def valid_models() -> list:
    return [models.gen_model(RandomSource(f"valid-dims-{seed}"), max_values=4) for seed in range(DIFFERENTIAL_DRAWS)]


def differential_tags() -> collections.Counter:
    return collections.Counter(tag for case, _ in differential_inputs() for tag in set(case.tags))


def test_differential_inputs_place_the_bad_item_first_middle_or_last():
    counts = differential_tags()
    assert all(counts[f"position:{where}"] >= 5 for where in dimensions.POSITIONS), counts


def _bad_components(model) -> list[tuple[int, int]]:
    """(index, count) of every bit-packing component whose width is outside 1..64."""
    from conformance.audit.fault import struct_types

    return [(index, len(st.bit_packing.component)) for st, _ in struct_types(model)
            if st.WhichOneof("kind") == "bit_packing"
            for index, component in enumerate(st.bit_packing.component) if not 1 <= component.bit_width <= 64]


def test_a_bad_component_is_not_always_the_first():
    where = collections.Counter()
    for seed in range(150):
        src = RandomSource(f"component-{seed}")
        case = mutators.MUTATORS[ErrorCode.BIT_WIDTH_INVALID](src, models.gen_model(src, max_values=4))
        (index, count), = _bad_components(schema.parse_model(case.model_bytes()))
        if count > 1:
            where["first" if index == 0 else "last" if index == count - 1 else "middle"] += 1
    assert where["first"] >= 5 and where["last"] >= 5 and where["middle"] >= 3, where


def test_large_affine_values_and_records_leave_a_partial_tile():
    kinds = collections.Counter()
    for generated in valid_models():
        protos = {value.name: value for value in generated.model.graph.encoded_initializer}
        for name, expected in generated.values.items():
            if not expected.large:
                continue
            if expected.affine is not None:
                parts = expected.affine
                along = parts["shape"][parts["axis"] if parts["axis"] is not None else -1]
                assert along > dimensions.TILES[0] and along <= dimensions.MAX_LARGE
                assert any(along % tile for tile in dimensions.TILES if tile < along)
                if parts["block"]:
                    assert along > parts["block"] and along % parts["block"], parts  # a partial last block
                kinds[parts["granularity"]] += 1
            else:
                assert expected.records > dimensions.TILES[0]
                assert expected.records * expected.record_bytes <= gen.MAX_LARGE_PAYLOAD
                kinds["records"] += 1
            kinds["external"] += protos[name].data_location == 1
    assert all(kinds[kind] >= 10 for kind in ("tensor", "axis", "blocked", "records", "external")), kinds
    tags = collections.Counter(tag for generated in valid_models() for tag in set(generated.tags))
    assert all(tags[f"size:{kind}"] == sum(f"size:{kind}" in g.tags for g in valid_models()) for kind in kinds)


def _twin_parts(original, twin, model) -> list[str]:
    """The parts of identity in which a twin differs from its original, read off the protos."""
    parts = []
    if original.WhichOneof("layout") == "affine":
        if original.affine.scale.SerializeToString() != twin.affine.scale.SerializeToString():
            parts.append("constant")
        if original.affine.axis != twin.affine.axis:
            parts.append("axis")
        if original.logical_type.SerializeToString() != twin.logical_type.SerializeToString():
            parts.append("dim")
        return parts
    if original.struct_type.WhichOneof("kind") == "type_ref":
        declarations = {decl.type_id: decl for decl in model.struct_types}
        a, b = declarations[original.struct_type.type_ref], declarations[twin.struct_type.type_ref]
        if a.type_id != b.type_id:
            parts.append("type_id")
        b = type(b).FromString(b.SerializeToString())
        b.type_id = a.type_id
        assert a == b, "the copied declaration differs beyond its type_id"
        return parts
    st_a, st_b = original.struct_type, twin.struct_type
    items_a = st_a.structure.field if st_a.WhichOneof("kind") == "structure" else st_a.bit_packing.component
    items_b = st_b.structure.field if st_b.WhichOneof("kind") == "structure" else st_b.bit_packing.component
    parts += ["field"] * sum(x.name != y.name for x, y in zip(items_a, items_b))
    return parts


def test_twins_differ_from_an_earlier_value_in_exactly_one_part():
    found = collections.Counter()
    for generated in valid_models():
        values = list(generated.model.graph.encoded_initializer)
        for index, twin in enumerate(values):
            if not twin.name.endswith("_twin"):
                continue
            original = next(value for value in values[:index] if value.name == twin.name[:-len("_twin")])
            parts = _twin_parts(original, twin, generated.model)
            assert len(parts) == 1 and f"twin:{parts[0]}" in generated.tags, (parts, generated.tags)
            found[parts[0]] += 1
    assert found["axis"] >= 1 and all(found[part] >= 8 for part in ("constant", "dim", "type_id", "field")), found


def test_values_are_decoded_into_caller_buffers_of_every_layout():
    layouts = collections.Counter()
    for _, buffers in differential_inputs():
        for layout in buffers.values():
            buffer = subjects._buffer(np.arange(6, dtype=np.float32).reshape(2, 3), layout)
            assert dimensions.layout_of(buffer) == layout
            layouts[layout] += 1
    assert all(layouts[layout] >= 10 for layout in dimensions.LAYOUTS), layouts
    # the reference takes a caller buffer, and refuses the ones the contract refuses
    oracle = ReferenceAdapter()
    outcomes = collections.Counter()
    for case, buffers in differential_inputs()[:120]:
        seen = subjects.observe(oracle, case.model_bytes(), scratch().populate(case.files), buffers)
        outcomes.update((key.rsplit(":", 1)[1], outcome.kind) for key, outcome in seen.items()
                        if key.startswith("decode-out:"))
    assert outcomes[("strided", "reject")] and outcomes[("plain", "ok")] and outcomes[("misaligned", "ok")], outcomes
    assert not outcomes[("strided", "ok")] and not outcomes[("readonly", "ok")], outcomes


def _differential_disagreement(subject, limit: int = 1500):
    oracle = ReferenceAdapter()
    for seed in range(limit):
        data = _stream("planted-differential", seed)
        case, problems = differential.disagreements(oracle, subject, data)
        if problems:
            return case, problems, differential.disagreements(oracle, ReferenceAdapter(), data)[1]
    return None, None, None


def _blocked_with_partial_tail(model) -> bool:
    for value in model.graph.encoded_initializer:
        if value.WhichOneof("layout") == "affine" and value.affine.HasField("block_size"):
            dims = [d.dim_value for d in value.logical_type.tensor_type.shape.dim]
            length = dims[value.affine.axis % len(dims)]
            if length >= planted_faults.WHOLE_BLOCK_PATH and length % value.affine.block_size:
                return True
    return False


def _shares_a_key(model) -> bool:
    keys = [planted_faults.shared_key(value) for value in model.graph.encoded_initializer]
    keys = [key for key in keys if key is not None]
    return len(keys) != len(set(keys))


@pytest.mark.parametrize("name", sorted(planted_faults.DIFFERENTIAL_PLANTED))
def test_differential_planted_fault_disagrees_with_the_reference(name):
    spec = planted_faults.DIFFERENTIAL_PLANTED[name][0]
    subject = getattr(planted_faults, spec.split(":")[1])()
    case, problems, reference = _differential_disagreement(subject)
    assert problems is not None, f"{spec} agreed with the reference on every input"
    assert reference == [], f"the reference disagrees with itself: {reference}"
    model = schema.parse_model(case.model_bytes())
    if name == "first component only":
        assert any(index > 0 for index, _ in _bad_components(model)), problems
        assert {"position:middle", "position:last"} & set(case.tags), case.tags
    elif name == "dropped partial block":
        assert _blocked_with_partial_tail(model) and "size:blocked" in case.tags, case.tags
    elif name == "shared decode":
        assert _shares_a_key(model) and any(tag.startswith("twin:") for tag in case.tags), case.tags
    else:
        assert any(key.startswith("decode-out:") and key.endswith((":strided", ":view_of_view"))
                   for key, _, _ in problems), problems
