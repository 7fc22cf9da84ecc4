"""The KV executor kernels inside stateful models (``make_state`` over ``Executor(model, kernels=...)``):
errors are classified on the offending input at the first call that can detect them, and a failed
or cancelled run leaves the retained cache exactly as it was."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper

from reference_impl import schema
from reference_impl.errors import ContractError, ErrorCode
from reference_impl.executor import Executor
from reference_impl.kv import formats, paged
from reference_impl.kv.formats import KV_PAGED_CACHE, kv_struct_types
from reference_impl.kv.kernels import KV_DOMAIN, kv_kernels
from reference_impl.kv.storage import counting
from reference_impl.state import make_state

F32 = np.float32


def _info(name: str, shape: list) -> schema.ValueInfoProto:
    return schema.from_onnx(helper.make_tensor_value_info(name, T.FLOAT, shape))


def paged_model(block_size: int, key_format: str = "dense", value_format: str = "dense") -> schema.ModelProto:
    """PagedAttention(q, k, v, cache) -> (y, next_cache) with ``cache <- next_cache``; any 4-D q/k/v."""
    model = schema.ModelProto(ir_version=10)
    model.opset_import.add(domain="", version=24)
    model.opset_import.add(domain=KV_DOMAIN, version=1)
    model.struct_types.extend(kv_struct_types())
    graph = model.graph
    graph.name = "paged"
    node = graph.node.add(op_type="PagedAttention", domain=KV_DOMAIN, input=["q", "k", "v", "cache"],
                          output=["y", "next_cache"])
    node.attribute.add(name="block_size", type=schema.AttributeProto.INT, i=block_size)
    node.attribute.add(name="key_format", type=schema.AttributeProto.STRING, s=key_format.encode())
    node.attribute.add(name="value_format", type=schema.AttributeProto.STRING, s=value_format.encode())
    for name in ("q", "k", "v"):
        graph.input.append(_info(name, ["b", "h", "s", "d"]))
    graph.output.append(_info("y", ["b", "h", "s", "d"]))
    graph.input.add(name="cache").type.struct_type.type_ref = KV_PAGED_CACHE
    graph.output.add(name="next_cache").type.struct_type.type_ref = KV_PAGED_CACHE
    graph.persistent_bindings.add(input_name="cache", output_name="next_cache")
    return model


def paged_state(block_size: int, key_format: str = "dense", value_format: str = "dense"):
    empty = paged.empty(1, 1, block_size).to_struct()  # geometry lives in the blocks; none yet
    return make_state(Executor(paged_model(block_size, key_format, value_format), kernels=kv_kernels()),
                      {"cache": empty})


def _tokens(rng, heads: int, size: int, count: int = 1) -> np.ndarray:
    return rng.standard_normal((1, heads, count, size)).astype(F32)


def _run_fails(state, feeds: dict, code: ErrorCode, path: str) -> None:
    """The run fails with ``code`` (as the cause of STATE_RUN_FAILED) at ``path``; the state is unchanged."""
    before = state.values
    with pytest.raises(ContractError) as info:
        state.run(feeds)
    assert info.value.code == ErrorCode.STATE_RUN_FAILED
    cause = info.value.__cause__
    assert isinstance(cause, ContractError) and cause.code == code and cause.path == path, cause
    assert state.values is before


# ----------------------------------------------------------------------------- paged kernel
@pytest.mark.clause("KV-PAGED-FORMATS")
def test_codebook_geometry_fails_the_first_run_not_the_sealing_one():
    """2 heads of 4 with 3-token blocks: 24 values per block, not whole 32-value codebook records."""
    rng = np.random.default_rng(1)
    state = paged_state(3, key_format="codebook2")
    q, k, v = (_tokens(rng, 2, 4) for _ in range(3))
    with counting() as counters:
        _run_fails(state, {"q": q, "k": k, "v": v}, ErrorCode.KV_BLOCK_INVALID, "PagedAttention.key_format")
    assert counters.appended_bytes == 0
    ok = paged_state(4, key_format="codebook2")  # 4 x 2 x 4 = 32: seals into one record per block
    for _ in range(5):
        ok.run({"q": q, "k": k, "v": v})
    assert int(ok.values["cache"]["length"]) == 5


def _kept_paged_state(rng, heads: int = 2, size: int = 4, block_size: int = 4):
    """A paged state that already holds two tokens of ``heads`` x ``size``."""
    state = paged_state(block_size)
    for _ in range(2):
        state.run({"q": _tokens(rng, heads, size), "k": _tokens(rng, heads, size), "v": _tokens(rng, heads, size)})
    return state


@pytest.mark.clause("KV-PAGED-RANGE", "KV-APPEND-EQUIV", "ZC-FAILURE")
@pytest.mark.parametrize("bad, shape, code", [
    ("k", (1, 3, 1, 4), ErrorCode.KV_SHAPE_MISMATCH),          # new K has 3 heads; the cache holds 2
    ("k", (1, 2, 1, 8), ErrorCode.KV_SHAPE_MISMATCH),          # new K head size 8; the cache holds 4
    ("v", (1, 2, 1, 5), ErrorCode.KV_SHAPE_MISMATCH),          # new V head size 5
    ("q", (1, 3, 1, 4), ErrorCode.ATTENTION_INPUT_INVALID),    # 3 query heads over 2 key/value heads
    ("q", (1, 2, 1, 8), ErrorCode.ATTENTION_INPUT_INVALID),    # query head size differs from the keys'
    ("v", (1, 2, 2, 4), ErrorCode.ATTENTION_INPUT_INVALID),    # V token count differs from K's
])
def test_new_tokens_are_checked_against_the_kept_cache(bad, shape, code):
    """The cache's own blocks fix its geometry: a wrong new K/V is a shape mismatch on that input (not a
    broken block 0 of the kept cache), a query that does not fit is an invalid Attention input."""
    rng = np.random.default_rng(2)
    state = _kept_paged_state(rng)
    feeds = {name: _tokens(rng, 2, 4) for name in ("q", "k", "v")}
    feeds[bad] = rng.standard_normal(shape).astype(F32)
    _run_fails(state, feeds, code, f"PagedAttention.{bad.upper()}")
    out = state.run({name: _tokens(rng, 2, 4) for name in ("q", "k", "v")})  # the kept cache still works
    assert int(out["next_cache"]["length"]) == 3


@pytest.mark.clause("KV-PAGED-RANGE", "KV-ATTENTION")
@pytest.mark.parametrize("bad, shape", [
    ("k", (1, 3, 1, 4)),   # 4 query heads are not a multiple of 3 key heads
    ("k", (1, 2, 1, 8)),   # key head size 8, query head size 4
    ("v", (1, 1, 1, 4)),   # V heads differ from K heads
    ("k", (1, 0, 1, 4)),   # no key heads at all
])
def test_the_first_tokens_of_an_empty_cache_are_checked_against_the_queries(bad, shape):
    rng = np.random.default_rng(3)
    state = paged_state(4)
    feeds = {"q": _tokens(rng, 4, 4), "k": _tokens(rng, 2, 4), "v": _tokens(rng, 2, 4)}
    feeds[bad] = rng.standard_normal(shape).astype(F32)
    _run_fails(state, feeds, ErrorCode.ATTENTION_INPUT_INVALID, f"PagedAttention.{bad.upper()}")
    assert int(state.values["cache"]["length"]) == 0 and not state.values["cache"]["blocks"]


@pytest.mark.clause("KV-PAGED-RANGE")
def test_a_kept_cache_with_a_broken_first_block_is_still_a_block_error():
    rng = np.random.default_rng(4)
    state = _kept_paged_state(rng)
    cache = state.values["cache"]
    block = cache["blocks"][0]
    broken = type(block)({**dict(block.items()), "key": np.zeros((4, 0, 4), F32)}, block.type_id)  # zero heads
    state.reset({"cache": type(cache)({"blocks": [broken], "length": cache["length"]}, cache.type_id)})
    feeds = {name: _tokens(rng, 2, 4) for name in ("q", "k", "v")}
    _run_fails(state, feeds, ErrorCode.KV_BLOCK_INVALID, "PagedAttention.past.blocks[0].key.logical_type")


@pytest.mark.clause("KV-PAGED-RANGE")
def test_a_first_block_whose_key_and_value_heads_differ_is_a_block_error():
    rng = np.random.default_rng(5)
    state = _kept_paged_state(rng)
    cache = state.values["cache"]
    block = cache["blocks"][0]
    key = formats.encode_block(rng.standard_normal((4, 3, 4)).astype(F32), "dense")  # 3 heads, value has 2
    broken = type(block)({**dict(block.items()), "key": key}, block.type_id)
    state.reset({"cache": type(cache)({"blocks": [broken], "length": cache["length"]}, cache.type_id)})
    feeds = {name: _tokens(rng, 2, 4) for name in ("q", "k", "v")}
    _run_fails(state, feeds, ErrorCode.KV_BLOCK_INVALID, "PagedAttention.past.blocks[0].value.logical_type")


# ----------------------------------------------------------------------------- attention kernel
def attention_model(heads: int, size: int, q_heads: int | None = None, causal: bool = False) -> schema.ModelProto:
    """Standard Attention with past/present bound: ``past_key <- present_key``, ``past_value <- present_value``
    in the standard (B, H, S, D) layout (``q_heads`` query heads over ``heads`` key/value heads)."""
    q_heads = heads if q_heads is None else q_heads
    node = helper.make_node("Attention", ["Q", "K", "V", "", "past_key", "past_value"],
                            ["Y", "present_key", "present_value"], is_causal=int(causal))
    info = helper.make_tensor_value_info
    graph = helper.make_graph(
        [node], "mha",
        [info("Q", T.FLOAT, [1, q_heads, "s", size]), info("K", T.FLOAT, [1, heads, "s", size]),
         info("V", T.FLOAT, [1, heads, "s", size]), info("past_key", T.FLOAT, [1, heads, "p", size]),
         info("past_value", T.FLOAT, [1, heads, "p", size])],
        [info("Y", T.FLOAT, [1, q_heads, "s", size]), info("present_key", T.FLOAT, [1, heads, "t", size]),
         info("present_value", T.FLOAT, [1, heads, "t", size])])
    model = schema.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)]))
    for name in ("key", "value"):
        model.graph.persistent_bindings.add(input_name=f"past_{name}", output_name=f"present_{name}")
    return model


def _attention_feeds(rng, heads: int, size: int, count: int = 1) -> dict:
    return {name: _tokens(rng, heads, size, count) for name in ("Q", "K", "V")}


class _CancelOnRead:
    """A cancel token that turns (and stays) cancelled at its n-th read."""

    def __init__(self, n: int):
        self.n, self.reads = n, 0

    @property
    def cancelled(self) -> bool:
        self.reads += 1
        return self.reads >= self.n


@pytest.mark.clause("ZC-FAILURE", "KV-MUTATION-FAILED")
@pytest.mark.parametrize("cancel_at", range(1, 6))
def test_a_cancelled_run_leaves_the_attention_cache_and_its_reservations_as_they_were(cancel_at):
    """Whichever check sees the cancellation (before the node, between the key and value writes, before
    publication), the next run appends both K and V in place behind the kept past: nothing the
    cancelled run reserved or wrote is left standing."""
    from reference_impl.kv import contiguous

    rng = np.random.default_rng(6)
    heads, size = 1, 4
    empty = {f"past_{n}": contiguous.empty_cache(1, heads, size, 16) for n in ("key", "value")}
    state = make_state(Executor(attention_model(heads, size), kernels=kv_kernels()), empty)
    first = _attention_feeds(rng, heads, size)
    state.run(first)
    before = state.values
    with pytest.raises(ContractError) as info:
        state.run(_attention_feeds(rng, heads, size), cancel=_CancelOnRead(cancel_at))
    assert info.value.code == ErrorCode.STATE_CANCELLED and state.values is before
    del info
    second = _attention_feeds(rng, heads, size)
    with counting() as counters:
        out = state.run(second)
    assert (counters.in_place_appends, counters.relocated_bytes) == (2, 0)
    for name in ("key", "value"):
        expected = np.concatenate([first[name[0].upper()], second[name[0].upper()]], axis=2)
        np.testing.assert_array_equal(out[f"present_{name}"], expected)


@pytest.mark.clause("KV-MUTATION-FAILED", "ZC-FAILURE")
def test_a_fixed_capacity_kernel_fails_the_run_that_exceeds_it_and_keeps_the_state():
    """``kv_kernels(capacity=4, fixed=True)``: the plain zero-length pasts move into one 4-token
    allocation at the first run, later runs append in place, and the run that would need a fifth slot
    fails with KV_CAPACITY_EXCEEDED while the state keeps its values (the default kernel grows)."""
    rng = np.random.default_rng(7)
    heads, size = 2, 4
    empty = np.zeros((1, heads, 0, size), F32)
    runs = [_attention_feeds(rng, heads, size, 3), _attention_feeds(rng, heads, size),
            _attention_feeds(rng, heads, size)]
    growing = make_state(Executor(attention_model(heads, size), kernels=kv_kernels(capacity=4)),
                         {"past_key": empty, "past_value": empty})
    for feeds in runs:
        growing.run(feeds)
    assert growing.values["past_key"].shape[2] == 5
    state = make_state(Executor(attention_model(heads, size), kernels=kv_kernels(capacity=4, fixed=True)),
                       {"past_key": empty, "past_value": empty})
    with counting() as counters:
        state.run(runs[0])
        state.run(runs[1])
    assert counters.allocated_bytes == 2 * 4 * heads * size * 4 and counters.in_place_appends == 2
    before = state.values
    saved = {name: np.array(value) for name, value in before.items()}
    for _ in range(2):
        _run_fails(state, runs[2], ErrorCode.KV_CAPACITY_EXCEEDED, "Attention.key")
    assert all(np.array_equal(state.values[name], saved[name]) for name in saved)
    state.reset({"past_key": empty, "past_value": empty})
    assert state.run(runs[2])["present_key"].shape[2] == 1


@pytest.mark.clause("KV-CAPACITY-INVALID")
@pytest.mark.parametrize("capacity", [0, -1, 2.5, True, 2**40])
def test_invalid_kernel_capacities_are_rejected_when_the_kernels_are_made(capacity):
    with pytest.raises(ContractError) as info:
        kv_kernels(capacity=capacity, fixed=True)
    assert info.value.code == ErrorCode.KV_CAPACITY_INVALID
