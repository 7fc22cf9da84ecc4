"""Paged caches with per-block formats: paged attention equals dense Attention over the dequantized
cache, appends write only new tokens, blocks are validated, and the workspace does not grow with the
context. Dequantized references come from the oracle's independent ``decode_value`` path."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_impl import decode_value, schema
from reference_impl.errors import ContractError, ErrorCode
from reference_impl.kv import formats, paged
from reference_impl.kv.attention import attention
from reference_impl.kv.measure import peak_traced_bytes
from reference_impl.kv.paged_attention import paged_attention
from reference_impl.kv.storage import counting
from reference_impl.values import EncodedValue, StructValue
from reference_impl.verifier import verify_encoded_value, verify_model

F32 = np.float32
CATALOGUE, REGISTRY = formats.kv_catalogue(), formats.kv_registry()
#: Paged attention over quantized blocks vs dense Attention over the same dequantized values: only
#: float32 summation order differs (online softmax, blockwise matmuls), for every format.
DEQUANTIZED_ATOL = 2e-6
#: Quantized vs the original float cache (unit-normal K and V, D=32): a regression bound per format,
#: about 3x the worst error seen over many seeds. Codebook and 2-bit formats are deliberately coarse.
FIDELITY_ATOL = {"dense": 1e-6, "int8": 0.03, "uint8": 0.03, "int4": 0.35, "uint4": 0.35, "int4/8": 0.3,
                 "int2": 1.5, "uint2": 1.5, "codebook2": 1.5}


def _kv(rng, heads, count, head=32):
    return (rng.standard_normal((heads, count, head)).astype(F32),
            rng.standard_normal((heads, count, head)).astype(F32))


def _decoded(block_value):
    """A dense block as it is; an encoded one through decode_value (the verifier + registry path)."""
    if isinstance(block_value, np.ndarray):
        return block_value
    return decode_value(block_value.to_proto(), CATALOGUE, registry=REGISTRY)


def _dense_reference(cache: paged.PagedKVCache):
    """Decode every block independently of the kernel, then concatenate."""
    keys, values = [], []
    for block in cache.blocks:
        keys.append(_decoded(block.key)[: block.valid])
        values.append(_decoded(block.value)[: block.valid])
    return (np.concatenate(keys).transpose(1, 0, 2)[None], np.concatenate(values).transpose(1, 0, 2)[None])


def _dense_attention(q, k_all, v_all, mask=None, **attrs):
    """ONNX Attention with the last Sq cached tokens as the new K/V (causal offset = past length)."""
    sq = q.shape[2]
    return attention(q, k_all[:, :, -sq:], v_all[:, :, -sq:], mask, k_all[:, :, :-sq], v_all[:, :, :-sq],
                     **attrs).y


# ----------------------------------------------------------------------------- paged == dense
@pytest.mark.clause("KV-PAGED-FORMATS", "KV-ATTENTION")
@settings(max_examples=50, deadline=None, database=None)
@given(block=st.integers(1, 9), kv_heads=st.sampled_from([1, 2]), group=st.sampled_from([1, 3]),
       chunks=st.lists(st.integers(1, 7), min_size=1, max_size=6), q_len=st.integers(1, 3),
       causal=st.booleans(), softcap=st.sampled_from([0.0, 1.5]), window=st.sampled_from([-1, 3]),
       mask=st.sampled_from([None, "bool", "float"]), seed=st.integers(0, 1000))
def test_paged_equals_dense(block, kv_heads, group, chunks, q_len, causal, softcap, window, mask, seed):
    rng = np.random.default_rng(seed)
    cache = paged.empty(kv_heads, 8, block, v_head_size=6)
    keys, values = np.zeros((kv_heads, 0, 8), F32), np.zeros((kv_heads, 0, 6), F32)
    for n in chunks:
        k, v = rng.standard_normal((kv_heads, n, 8)).astype(F32), rng.standard_normal((kv_heads, n, 6)).astype(F32)
        cache = cache.append(k, v)
        keys, values = np.concatenate([keys, k], 1), np.concatenate([values, v], 1)
    total = keys.shape[1]
    q_len = min(q_len, total)
    q = rng.standard_normal((1, kv_heads * group, q_len, 8)).astype(F32)
    attn_mask = None
    if mask == "bool":
        attn_mask = rng.random((q_len, total)) > 0.3
    elif mask == "float":
        attn_mask = rng.standard_normal((q_len, total)).astype(F32)
    attrs = {"is_causal": int(causal), "softcap": softcap, "left_window_size": window}
    got = paged_attention(q, cache, attn_mask, **attrs)
    want = _dense_attention(q, keys[None], values[None], attn_mask, **attrs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=DEQUANTIZED_ATOL)


@pytest.mark.clause("KV-PAGED-FORMATS", "KV-ATTENTION")
@pytest.mark.parametrize("key_format, value_format", [(f, g) for f, g in zip(
    list(FIDELITY_ATOL), list(FIDELITY_ATOL)[::-1])] + [("int4", "int8"), ("codebook2", "dense")])
def test_quantized_pages_match_dense_attention_over_the_dequantized_cache(key_format, value_format):
    rng = np.random.default_rng(hash((key_format, value_format)) % 2**32)
    keys, values = _kv(rng, 2, 70)
    cache = paged.empty(2, 32, 16).append(keys, values, key_format, value_format)
    assert cache.formats[0] == (key_format.split("/")[0], value_format.split("/")[0])
    q = rng.standard_normal((1, 4, 2, 32)).astype(F32)
    got = paged_attention(q, cache, is_causal=1)
    k_dq, v_dq = _dense_reference(cache)
    np.testing.assert_allclose(got, _dense_attention(q, k_dq, v_dq, is_causal=1), rtol=1e-5, atol=DEQUANTIZED_ATOL)
    exact = _dense_attention(q, keys[None], values[None], is_causal=1)
    bound = max(FIDELITY_ATOL[key_format], FIDELITY_ATOL[value_format])
    assert np.max(np.abs(got - exact)) <= bound


@pytest.mark.clause("KV-PAGED-FORMATS")
def test_every_block_value_verifies_as_an_encoded_value():
    rng = np.random.default_rng(1)
    keys, values = _kv(rng, 2, 32)
    dense = paged.empty(2, 32, 32).append(keys, values).blocks[0]
    assert isinstance(dense.key, np.ndarray) and dense.key.dtype == F32 and dense.key.shape == (32, 2, 32)
    np.testing.assert_array_equal(dense.key, keys.transpose(1, 0, 2))
    for name in [name for name in FIDELITY_ATOL if name != "dense"]:
        block = paged.empty(2, 32, 32).append(keys, values, name, name).blocks[0]
        for value, ref in ((block.key, keys), (block.value, values)):
            proto = value.to_proto()
            info = verify_encoded_value(proto, "block", CATALOGUE)
            assert info.extent.length == value.nbytes
            decoded = decode_value(proto, CATALOGUE, registry=REGISTRY)
            assert decoded.shape == (32, 2, 32)
            assert np.max(np.abs(decoded - ref.transpose(1, 0, 2))) <= FIDELITY_ATOL[name] * 4 + 1e-6


# ----------------------------------------------------------------------------- append and sealing
@pytest.mark.clause("KV-PAGED-RANGE", "KV-APPEND-INPLACE")
def test_append_fills_the_last_block_writes_only_new_tokens_and_seals():
    rng = np.random.default_rng(2)
    cache = paged.empty(2, 32, 8)
    history, keys = [], np.zeros((2, 0, 32), F32)
    for step in range(40):
        k, v = _kv(rng, 2, 1)
        with counting() as counters:
            cache = cache.append(k, v, "int4", "int8")
        keys = np.concatenate([keys, k], 1)
        assert counters.appended_bytes == k.nbytes + v.nbytes and counters.relocated_bytes == 0
        sealed_now = (step + 1) % 8 == 0
        assert (counters.encoded_bytes > 0) == sealed_now
        history.append((cache, keys.copy()))
    assert [(b.start, b.valid) for b in cache.blocks] == [(8 * i, 8) for i in range(5)]
    assert cache.formats == [("int4", "int8")] * 5
    # Every earlier cache value still reads what it held (appends never touched a visible byte).
    for old, old_keys in history[::7]:
        assert old.count == old_keys.shape[1]
        last = old.blocks[-1]
        if last.key_codec.kind == "dense":
            k_last, _ = last.decode()
            np.testing.assert_array_equal(k_last.transpose(1, 0, 2), old_keys[:, last.start:])


@pytest.mark.clause("KV-PAGED-RANGE", "KV-APPEND-EQUIV")
@settings(max_examples=40, deadline=None, database=None)
@given(block=st.integers(1, 6), chunks=st.lists(st.integers(1, 9), min_size=1, max_size=8), seed=st.integers(0, 99))
def test_append_then_read_equals_concatenation(block, chunks, seed):
    rng = np.random.default_rng(seed)
    cache = paged.empty(1, 4, block)
    keys, values = np.zeros((1, 0, 4), F32), np.zeros((1, 0, 4), F32)
    for n in chunks:
        k, v = _kv(rng, 1, n, 4)
        cache = cache.append(k, v)
        keys, values = np.concatenate([keys, k], 1), np.concatenate([values, v], 1)
        k_all, v_all = cache.dequantized()
        np.testing.assert_array_equal(k_all[0], keys)
        np.testing.assert_array_equal(v_all[0], values)
        assert all(b.valid == block for b in cache.blocks[:-1]) and cache.end == keys.shape[1]


@pytest.mark.clause("KV-PAGED-RANGE", "ZC-NO-INPLACE")
def test_branching_from_an_old_cache_value_leaves_both_branches_intact():
    rng = np.random.default_rng(3)
    base = paged.empty(1, 4, 8).append(*_kv(rng, 1, 3, 4))
    first = base.append(*_kv(rng, 1, 2, 4))
    first_keys = first.dequantized()[0].copy()
    with counting() as counters:
        second = base.append(*_kv(rng, 1, 2, 4))  # the slots behind base's open block are taken
    assert counters.relocated_bytes == 2 * 3 * 4 * 4  # K and V of the 3 tokens, once: bounded by a block
    np.testing.assert_array_equal(first.dequantized()[0], first_keys)
    np.testing.assert_array_equal(second.dequantized()[0][:, :, :3], base.dequantized()[0])


@pytest.mark.clause("KV-PAGED-FORMATS")
def test_convert_reencodes_selected_blocks_and_shares_the_rest():
    rng = np.random.default_rng(4)
    cache = paged.empty(2, 32, 8).append(*_kv(rng, 2, 30))
    converted = cache.convert([0, 2], key_format="int4/8", value_format="codebook2")
    converted = converted.convert([1], value_format="uint2")
    assert converted.formats == [("int4", "codebook2"), ("dense", "uint2"), ("int4", "codebook2"),
                                 ("dense", "dense")]
    assert converted.blocks[3] is cache.blocks[3] and converted.blocks[1].key is cache.blocks[1].key
    q = rng.standard_normal((1, 2, 1, 32)).astype(F32)
    np.testing.assert_allclose(paged_attention(q, converted), _dense_attention(q, *_dense_reference(converted)),
                               rtol=1e-5, atol=DEQUANTIZED_ATOL)
    with pytest.raises(ContractError) as info:
        cache.convert([7], key_format="int8")
    assert info.value.code == ErrorCode.KV_BLOCK_INVALID


@pytest.mark.clause("KV-PAGED-FORMATS")
def test_converting_a_block_of_a_remembered_group_regroups_the_new_block():
    """A closed group is remembered on its first block for the next call; when a later member is replaced
    (here re-encoded by ``convert``), the next call groups the new block, and attention reads it (found by
    the KV state machine: the remembered group was compared field by field, arrays included)."""
    rng = np.random.default_rng(9)
    keys, values = _kv(rng, 1, paged.SLAB_TOKENS + 6, head=2)
    cache = paged.empty(1, 2, 2).append(keys, values)
    assert [len(g.blocks) for g in paged.block_groups(cache.blocks)] == [paged.SLAB_TOKENS // 2, 3]
    converted = cache.convert([1], value_format="int8")
    groups = list(paged.block_groups(converted.blocks))
    assert [block for group in groups for block in group.blocks] == list(converted.blocks)
    assert all(group.blocks[0] is not cache.blocks[0] or len(group.blocks) == 1 for group in groups)
    q = rng.standard_normal((1, 1, 1, 2)).astype(F32)
    np.testing.assert_allclose(paged_attention(q, converted), _dense_attention(q, *_dense_reference(converted)),
                               rtol=1e-5, atol=DEQUANTIZED_ATOL)


# ----------------------------------------------------------------------------- bounded workspace
#: Peak extra memory of one paged attention call, in groups of blocks decoded together (paged.GROUP_BYTES
#: of decoded keys): one decoded side of a group (K, then V) with its decoding temporaries, scores and
#: weights; dense blocks are read in place (scores only); the codebook's groups are a quarter as large
#: (its decoder gathers through wide bit windows).
WORKSPACE_GROUPS = {"dense": 1, "int4": 3, "codebook2": 3.5}


@pytest.mark.clause("KV-BOUNDED", "KV-PAGED-FORMATS")
@pytest.mark.parametrize("fmt", list(WORKSPACE_GROUPS))
def test_workspace_is_bounded_by_a_group_not_the_context(fmt):
    """tracemalloc records NumPy allocations: the peak extra memory of paged attention is a fixed number
    of block groups, the same at 4096 tokens as at 1024 (dense K and V would be 8 MiB at 4096), and the
    workspace the kernel reports to the KV counters does not grow with the context either."""
    rng = np.random.default_rng(5)
    heads, head, block = 2, 128, 64
    block_bytes = block * heads * head * 4  # one decoded K block in float32: 64 KiB
    q = rng.standard_normal((1, 4, 1, head)).astype(F32)
    peaks, reported = {}, {}
    for context in (1024, 4096):
        cache = paged.empty(heads, head, block)
        for _ in range(context // 256):
            cache = cache.append(*_kv(rng, heads, 256, head), fmt, fmt)
        peaks[context] = peak_traced_bytes(partial(paged_attention, q, cache))
        with counting() as counters:
            paged_attention(q, cache)
        reported[context] = counters.workspace_peak
    dense_cache_bytes = 2 * 4096 * heads * head * 4
    assert peaks[4096] < WORKSPACE_GROUPS[fmt] * paged.GROUP_BYTES < dense_cache_bytes / 4
    # 4x the blocks, and the peak moves by less than one block (Python object churn, not arrays).
    assert peaks[4096] - peaks[1024] < block_bytes
    assert 0 < reported[4096] == reported[1024] <= peaks[4096]


# ----------------------------------------------------------------------------- struct form and validation
def test_struct_round_trip_keeps_payloads_and_continues_in_place():
    rng = np.random.default_rng(6)
    cache = paged.empty(2, 32, 8).append(*_kv(rng, 2, 13), "int8", "dense")
    value = cache.to_struct()
    assert value.type_id == formats.KV_PAGED_CACHE and int(value["length"]) == 13
    again = paged.PagedKVCache.from_struct(value, 2, 32, 32, 8)
    assert all(a.key is b.key and a.value is b.value for a, b in zip(again.blocks, cache.blocks))
    with counting() as counters:
        again.append(*_kv(rng, 2, 1))
    assert counters.in_place_appends == 2 and counters.relocated_bytes == 0


def test_catalogue_declarations_verify_in_a_model():
    model = schema.ModelProto(ir_version=10)
    model.opset_import.add(domain="", version=24)
    model.struct_types.extend(formats.kv_struct_types())
    graph = model.graph
    graph.name = "paged"
    for name in ("cache", "next_cache"):
        vi = schema.ValueInfoProto(name=name)
        vi.type.struct_type.type_ref = formats.KV_PAGED_CACHE
        (graph.input if name == "cache" else graph.output).append(vi)
    graph.node.add(op_type="Identity", input=["cache"], output=["next_cache"])
    verify_model(model)


def _block_struct(start, valid, key, value):
    return StructValue({"start": np.array(start, np.int64), "valid_length": np.array(valid, np.int64),
                        "key": key, "value": value}, formats.KV_BLOCK)


def _cache_struct(blocks, length):
    return StructValue({"blocks": blocks, "length": np.array(length, np.int64)}, formats.KV_PAGED_CACHE)


@pytest.mark.clause("KV-PAGED-RANGE")
def test_invalid_blocks_are_rejected():
    rng = np.random.default_rng(7)
    good = formats.encode_block(rng.standard_normal((4, 2, 8)).astype(F32), "int4")
    dense = formats.encode_block(rng.standard_normal((4, 2, 8)).astype(F32), "dense")
    wrong_heads = formats.encode_block(rng.standard_normal((4, 3, 8)).astype(F32), "dense")
    truncated = EncodedValue(good.header, good.payload[:-1])
    unknown = EncodedValue(schema.EncodedValueProto(), good.payload)
    unknown.header.CopyFrom(good.header)
    unknown.header.ClearField("affine")
    unknown.header.struct_type.type_ref = 4242
    cases = [
        (_cache_struct([_block_struct(0, 4, good, dense), _block_struct(5, 4, good, dense)], 8),
         ErrorCode.KV_BLOCK_INVALID),  # a gap between token ranges
        (_cache_struct([_block_struct(0, 5, good, dense)], 5), ErrorCode.KV_BLOCK_INVALID),  # valid > slots
        (_cache_struct([_block_struct(0, 4, good, dense)], 3), ErrorCode.KV_BLOCK_INVALID),  # wrong length
        (_cache_struct([_block_struct(0, 4, wrong_heads, dense)], 4), ErrorCode.KV_BLOCK_INVALID),
        (_cache_struct([_block_struct(0, 4, truncated, dense)], 4), ErrorCode.AFFINE_PAYLOAD_SIZE),
        (_cache_struct([_block_struct(0, 4, unknown, dense)], 4), ErrorCode.TYPE_REF_UNRESOLVED),
        (_cache_struct([_block_struct(0, 4, good.payload, dense)], 4), ErrorCode.KV_BLOCK_INVALID),
        (_cache_struct([_block_struct(0, 4, good, dense.astype(np.float16))], 4), ErrorCode.KV_BLOCK_INVALID),
        (_cache_struct([_block_struct(0, 4, good, dense.reshape(4, 16))], 4), ErrorCode.KV_BLOCK_INVALID),
        (StructValue({"blocks": [], "length": np.array(0, np.int64)}, 9999), ErrorCode.KV_BLOCK_INVALID),
    ]
    for value, code in cases:
        with pytest.raises(ContractError) as info:
            paged.PagedKVCache.from_struct(value, 2, 8, 8, 4)
        assert info.value.code == code, info.value
    with pytest.raises(ContractError) as info:
        paged.PagedKVCache.from_struct(_cache_struct([_block_struct(0, 4, good, dense)], 4), 2, 8, 8, 2)
    assert info.value.code == ErrorCode.KV_BLOCK_INVALID  # 4 slots exceed a block size of 2


@pytest.mark.clause("KV-CAPACITY-INVALID", "KV-PAGED-RANGE")
@pytest.mark.parametrize("block_size", [0, -1, 2.5, True])
def test_invalid_block_sizes_are_rejected(block_size):
    with pytest.raises(ContractError) as info:
        paged.empty(1, 4, block_size)
    assert info.value.code == ErrorCode.KV_CAPACITY_INVALID


def test_invalid_formats_and_shapes_are_rejected():
    cache = paged.empty(2, 8, 4)
    tokens = np.zeros((2, 1, 8), F32)
    for fmt in ("int3", "dense/4", "int4/0", "codebook2/32"):
        with pytest.raises(ContractError) as info:
            cache.append(tokens, tokens, key_format=fmt)
        assert info.value.code == ErrorCode.KV_BLOCK_INVALID
    with pytest.raises(ContractError) as info:
        paged.empty(1, 3, 1).append(np.zeros((1, 1, 3), F32), np.zeros((1, 1, 3), F32), "codebook2")
    assert info.value.code == ErrorCode.KV_BLOCK_INVALID  # 3 values are not whole 32-value records
    for bad in (np.zeros((3, 1, 8), F32), np.zeros((2, 1, 8), np.float64), np.zeros((2, 8), F32)):
        with pytest.raises(ContractError) as info:
            cache.append(bad, tokens)
        assert info.value.code == ErrorCode.KV_SHAPE_MISMATCH
    with pytest.raises(ContractError) as info:
        paged_attention(np.zeros((1, 3, 1, 8), F32), cache.append(tokens, tokens))
    assert info.value.code == ErrorCode.ATTENTION_INPUT_INVALID
    with pytest.raises(ContractError) as info:
        paged_attention(np.zeros((1, 2, 1, 8), F32), cache.append(tokens, tokens), qk_matmul_output_mode=1)
    assert info.value.code == ErrorCode.ATTENTION_INPUT_INVALID


def test_stored_bytes_count_codes_and_parameters():
    rng = np.random.default_rng(8)
    keys, values = _kv(rng, 2, 32)
    dense = paged.empty(2, 32, 32).append(keys, values)
    int4 = paged.empty(2, 32, 32).append(keys, values, "int4/16", "uint4")
    assert dense.stored_bytes() == dense.payload_bytes() == 2 * keys.nbytes
    codes = keys.size // 2  # two INT4 codes per byte
    key_scales = 32 * 2 * 2 * 4  # (tokens, heads, 32 / 16 groups) float32
    value_params = 32 * 2 * 1 * 4 + 32 * 2 // 2  # one scale and one UINT4 zero point per row
    assert int4.payload_bytes() == 2 * codes
    assert int4.stored_bytes() == 2 * codes + key_scales + value_params


# ----------------------------------------------------------------------------- format geometry up front
@pytest.mark.clause("KV-PAGED-FORMATS")
@pytest.mark.parametrize("key_format, value_format, v_head, bad", [
    ("codebook2", "dense", 4, "key_format"),     # 3 tokens x 2 heads x 4 = 24 key values per block
    ("dense", "codebook2", 4, "value_format"),
    ("int8", "codebook2", 16, None),              # 3 x 2 x 16 = 96 value values: whole records
])
def test_codebook_block_geometry_is_checked_at_the_first_append(key_format, value_format, v_head, bad):
    """A block format that cannot encode a full block fails before anything is written, not when the
    block is sealed two appends later (after which every append from the kept cache would fail)."""
    rng = np.random.default_rng(9)
    cache = paged.empty(2, 4, 3, v_head_size=v_head)
    k, v = rng.standard_normal((2, 1, 4)).astype(F32), rng.standard_normal((2, 1, v_head)).astype(F32)
    if bad is None:
        for _ in range(4):
            cache = cache.append(k, v, key_format, value_format)
        assert cache.formats[0] == (key_format, value_format)
        return
    with counting() as counters:
        with pytest.raises(ContractError) as info:
            cache.append(k, v, key_format, value_format)
    assert info.value.code == ErrorCode.KV_BLOCK_INVALID and info.value.path.endswith(bad)
    assert counters.appended_bytes == 0 and counters.allocations == 0


@pytest.mark.clause("KV-MUTATION-FAILED", "ZC-FAILURE")
@pytest.mark.parametrize("fires", [True, False])
def test_a_paged_append_observes_cancellation_once_before_it_writes(fires):
    """A multi-block append asks once; cancelled, the kept cache's open block still appends in place."""
    rng = np.random.default_rng(10)
    base = paged.empty(1, 4, 4).append(*_kv(rng, 1, 2, 4))
    calls = []

    def cancel():
        calls.append(1)
        return fires

    grown = None
    with counting() as counters:
        if fires:
            with pytest.raises(ContractError) as info:
                base.append(*_kv(rng, 1, 9, 4), cancel=cancel)
            assert info.value.code == ErrorCode.STATE_CANCELLED
        else:
            grown = base.append(*_kv(rng, 1, 9, 4), cancel=cancel)
            assert grown.count == 11
    assert len(calls) == 1 and counters.appended_bytes == (0 if fires else 2 * 9 * 4 * 4)
    with counting() as counters:
        base.append(*_kv(rng, 1, 1, 4))
    # Only a completed (and still held) append has taken the slots behind base's open block.
    assert (counters.in_place_appends, counters.relocated_bytes) == ((2, 0) if fires else (0, 2 * 2 * 4 * 4))
    del grown
