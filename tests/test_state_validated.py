"""A retained struct that comes back unchanged is not walked again, and nothing slips through: the very
same object with the same metadata only. Any change to what the checks read (an array reshaped, re-typed
or made writable, a field or type id replaced, an encoded header edited) is checked in full again."""

from __future__ import annotations

from types import MappingProxyType

import numpy as np
import pytest
from onnx import helper
from test_state_models import CACHE_TYPE, D, cache_declaration, empty_cache, opsets, set_struct

from reference_impl import schema
from reference_impl import state as state_module
from reference_impl.errors import ContractError, ErrorCode
from reference_impl.executor import Executor
from reference_impl.kv import qwen
from reference_impl.kv.kernels import kv_kernels
from reference_impl.state import make_state


def passthrough_model():
    """cache (a Cache struct) -> Identity -> next_cache, bound back: the same struct comes back each call."""
    graph = helper.make_graph([helper.make_node("Identity", ["cache"], ["next_cache"])], "pass",
                              [helper.make_tensor_value_info("cache", 1, None)],
                              [helper.make_tensor_value_info("next_cache", 1, None)])
    model = schema.from_onnx(helper.make_model(graph, opset_imports=opsets()))
    model.struct_types.append(cache_declaration())
    set_struct(model.graph.input[0])
    set_struct(model.graph.output[0])
    model.graph.persistent_bindings.add(input_name="cache", output_name="next_cache")
    return model


def _count_adoptions(monkeypatch) -> list:
    adopted = []
    original = state_module._adopt_array

    def counting(array, path, counters, persistent, owned):
        adopted.append(path)
        return original(array, path, counters, persistent, owned)

    monkeypatch.setattr(state_module, "_adopt_array", counting)
    return adopted


@pytest.mark.clause("STATE-VALIDATE-METADATA", "ZC-RETAIN")
def test_an_unchanged_retained_struct_is_taken_as_it_is(monkeypatch):
    state = make_state(passthrough_model(), {"cache": empty_cache(2)})
    state.run({})  # the first retained struct: published once (a value replaced every call is never recorded)
    state.run({})  # ... and again, unchanged: recorded
    retained = state.values["cache"]
    adopted = _count_adoptions(monkeypatch)
    leaves = state.counters.adopted_leaves
    for _ in range(3):
        assert state.run({})["next_cache"] is retained
    assert adopted == []  # not walked again ...
    assert state.counters.adopted_leaves == leaves + 3 * 3  # ... and still counted as retained


@pytest.mark.clause("STATE-VALIDATE-METADATA")
@pytest.mark.parametrize("change", ["reshape", "retype", "field", "type_id"])
def test_a_changed_retained_struct_is_checked_again(change):
    state = make_state(passthrough_model(), {"cache": empty_cache(2)})
    state.run({})
    cache = state.values["cache"]
    keys = cache["keys"]
    if change == "reshape":
        keys.shape = (2, 1, D)  # allowed on a read-only view: same size, other dimensions
    elif change == "retype":
        keys.dtype = np.int32  # same item size, another element type
    elif change == "field":
        cache._fields = MappingProxyType({**cache, "keys": np.zeros((3, 3), np.float32)})
    else:
        cache.type_id = CACHE_TYPE + 1
    with pytest.raises(ContractError) as info:
        state.run({})
    assert info.value.code is ErrorCode.STATE_VALUE_INCOMPATIBLE


@pytest.mark.clause("ZC-READ-ONLY")
def test_a_retained_array_made_writable_again_is_frozen_again(monkeypatch):
    caller = empty_cache(2)
    state = make_state(passthrough_model(), {"cache": caller})
    state.run({})
    keys = state.values["cache"]["keys"]
    assert not keys.flags.writeable and keys.base is caller["keys"]
    keys.flags.writeable = True  # its base, the caller's array, is writable
    adopted = _count_adoptions(monkeypatch)
    state.run({})
    assert not state.values["cache"]["keys"].flags.writeable
    assert any(path.endswith(".keys") for path in adopted)


def _paged_state():
    config = qwen.QwenConfig()
    executor = Executor(qwen.build(config, "paged"), kernels=kv_kernels())
    state = make_state(executor, qwen.initial_values(config, "paged", capacity=128))
    rng = np.random.default_rng(3)
    state.run({"input_ids": rng.integers(0, config.vocab, (1, 8))})
    return state, rng, config


@pytest.mark.clause("STATE-VALIDATE-METADATA", "KV-PAGED-FORMATS")
def test_sealed_blocks_are_not_walked_again_however_long_the_context(monkeypatch):
    """The work per call stays that of the new tokens: sealed blocks come back unchanged, and after the call
    that first sees one come back they are not walked again."""
    state, rng, config = _paged_state()
    adopted = _count_adoptions(monkeypatch)
    per_call = []
    for _ in range(40):  # 8 -> 48 tokens: one to three sealed blocks of 16 per layer
        adopted.clear()
        state.run({"input_ids": rng.integers(0, config.vocab, (1, 1))})
        per_call.append(len(adopted))
    sealed = [len([b for b in state.values[name]["blocks"] if b.block.valid == config.block_size])
              for name in state.values]
    assert min(sealed) >= 2
    # The open block and the cache's own fields, and once per block sealed (calls 8 and 24, when a block
    # sealed the call before comes back for the first time) its fields: the same at 28-48 tokens as at 8-28.
    assert max(per_call) - min(per_call) == 4 * config.layers
    assert sorted(per_call[:20]) == sorted(per_call[20:])


@pytest.mark.clause("STATE-VALIDATE-METADATA", "KV-PAGED-FORMATS")
def test_an_edited_header_of_a_sealed_block_is_checked_again():
    state, rng, config = _paged_state()
    for _ in range(12):  # a sealed block in every layer
        state.run({"input_ids": rng.integers(0, config.vocab, (1, 1))})
    name = next(iter(state.values))
    sealed = state.values[name]["blocks"][0]
    header = sealed["key"].header
    header.logical_type.tensor_type.elem_type = 10  # FLOAT16: no longer the declared FLOAT block
    with pytest.raises(ContractError) as info:
        state.run({"input_ids": rng.integers(0, config.vocab, (1, 1))})
    assert info.value.code is ErrorCode.STATE_VALUE_INCOMPATIBLE


@pytest.mark.clause("STATE-EQUIV-LOOP", "ZC-RETAIN")
def test_the_same_outputs_values_and_counters_as_checking_everything_every_call(monkeypatch):
    def decode(trust: bool):
        if not trust:
            monkeypatch.setattr(state_module._Entry, "unchanged", lambda self: False)
        state, rng, config = _paged_state()
        outputs = [state.run({"input_ids": rng.integers(0, config.vocab, (1, 1))})["logits"] for _ in range(24)]
        monkeypatch.undo()
        return outputs, state.counters.snapshot()

    trusted, checked = decode(True), decode(False)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(trusted[0], checked[0]))
    assert trusted[1] == checked[1]


@pytest.mark.clause("STATE-VALIDATE-METADATA", "KV-PAGED-FORMATS")
def test_a_remembered_logical_type_accepts_only_the_same_type():
    """Encoded tensors whose logical type was accepted for a declared tensor are remembered by their
    serialized logical type: the same type passes without the walk, any other (another shape, element
    type, or the remembered header edited in place) is checked in full and refused."""
    from reference_impl.values import EncodedValue, TensorSpec, check_value

    def encoded(elem_type: int, dims: tuple) -> EncodedValue:
        header = schema.EncodedValueProto()
        header.logical_type.MergeFromString(helper.make_tensor_type_proto(elem_type, dims).SerializeToString())
        return EncodedValue(header, np.zeros(4, np.uint8))

    spec = TensorSpec(1, (2, "n", 4))
    accepted = encoded(1, (2, 3, 4))
    check_value(accepted, spec, "v")
    check_value(encoded(1, (2, 3, 4)), spec, "v")  # the same type again: remembered
    assert len(spec._logical_ok) == 1
    for other in (encoded(1, (2, 3, 5)), encoded(10, (2, 3, 4)), encoded(1, (2, 4))):
        with pytest.raises(ContractError) as info:
            check_value(other, spec, "v")
        assert info.value.code is ErrorCode.STATE_VALUE_INCOMPATIBLE
    accepted.header.logical_type.tensor_type.shape.dim[2].dim_value = 8
    with pytest.raises(ContractError):
        check_value(accepted, spec, "v")
    assert len(spec._logical_ok) == 1


@pytest.mark.clause("STATE-VALIDATE-METADATA")
@pytest.mark.parametrize("header, payload, part", [
    ("not a message", np.zeros(4, np.uint8), "header"),
    (None, np.zeros(4, np.uint8), "header"),
    (schema.StructTypeProto(), np.zeros(4, np.uint8), "header"),
    (schema.EncodedValueProto(), b"\0\0\0\0", "payload")])
def test_an_encoded_value_with_foreign_parts_is_classified(header, payload, part):
    """Header and payload are plain attributes: anything else than an EncodedValueProto and a NumPy array
    is refused with a code and the path of the part, by the state's adoption and by the type check."""
    from reference_impl.values import EncodedValue, StructValue, TensorSpec, check_value

    value = EncodedValue(header, payload)
    with pytest.raises(ContractError) as info:
        make_state(passthrough_model(), {"cache": StructValue({**empty_cache(2), "keys": value}, CACHE_TYPE)})
    assert info.value.code is ErrorCode.STATE_UNRETAINABLE and info.value.path.endswith(f".keys.{part}")
    with pytest.raises(ContractError) as info:
        check_value(value, TensorSpec(1, (1, 2, D)), "v")
    assert info.value.code is ErrorCode.STATE_VALUE_INCOMPATIBLE and info.value.path == f"v.{part}"
