"""KV cache operation scripts: appends that branch from old caches, held views, mixed block formats,
conversions, and broken calls with their codes.

``KVRunner`` keeps, next to every cache it creates, the plain NumPy concatenation of what was appended
to reach it, and checks after every operation that

* a contiguous present (functional ``append`` or ``ContiguousKVCache``) equals the concatenation, and
  every earlier present or view still equals its own (writes in place never reach a visible slot);
* a paged cache in dense format dequantizes to exactly the concatenation, and paged attention equals
  dense attention over the cache's dequantized K/V for every format mix;
* a rejected call raises its code and changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fuzz.source import Source
from reference_impl import ContractError
from reference_impl.errors import ErrorCode as E
from reference_impl.kv import contiguous, paged
from reference_impl.kv.attention import attention
from reference_impl.kv.paged_attention import paged_attention


def add_attributes(node, attrs: dict) -> None:
    """INT, FLOAT and STRING attributes from Python values (None: left out, the operator's default). The
    corpus builders have the same writer; the harness does not import the corpus, which an install
    carries as data inside ``conformance`` and the fuzzer executables do not bundle."""
    for name, value in attrs.items():
        if value is None:
            continue
        if isinstance(value, str):
            node.attribute.add(name=name, type=3, s=value.encode())
        elif isinstance(value, float):
            node.attribute.add(name=name, type=1, f=value)
        else:
            node.attribute.add(name=name, type=2, i=int(value))


FORMATS = ("dense", "int8", "uint8", "int4", "uint4", "int2", "uint2", "codebook2")
KV_CODES = frozenset({E.KV_CAPACITY_INVALID, E.KV_CAPACITY_EXCEEDED, E.KV_SHAPE_MISMATCH, E.KV_BLOCK_INVALID,
                      E.ATTENTION_INPUT_INVALID})


class Mismatch(AssertionError):
    """A KV kernel's result differs from the concatenation or from dense attention."""


def _floats(src: Source, shape: tuple) -> np.ndarray:
    return src.floats(shape, 32)


@dataclass
class KVRunner:
    heads: int
    head_size: int
    capacity: int
    block: int
    pasts: list = field(default_factory=list)  # (present array, expected concatenation)
    caches: list = field(default_factory=list)  # (PagedKVCache, expected K, expected V, lossless so far)
    codes: list = field(default_factory=list)

    @classmethod
    def create(cls, src: Source) -> KVRunner:
        runner = cls(src.integer(1, 2), src.choice((2, 4, 32)), src.integer(1, 6), src.integer(1, 5))
        empty = contiguous.empty_cache(1, runner.heads, runner.head_size, runner.capacity, fixed=src.boolean())
        runner.pasts.append((empty, np.zeros((1, runner.heads, 0, runner.head_size), np.float32)))
        runner.caches.append((paged.empty(runner.heads, runner.head_size, runner.block),
                              np.zeros((runner.heads, 0, runner.head_size), np.float32),
                              np.zeros((runner.heads, 0, runner.head_size), np.float32), True))
        return runner

    # ------------------------------------------------------------------------------ operations
    def step(self, src: Source) -> str:
        kind = src.choice(("append", "append", "paged", "paged", "convert", "attend", "bad_capacity",
                           "bad_shape", "bad_block", "bad_attention", "overflow"))
        try:
            getattr(self, f"_{kind}")(src)
            outcome = "ok"
        except ContractError as error:
            outcome = error.code.value
            self.codes.append(outcome)
        expected = self._expected_code
        self._expected_code = None
        if outcome != (expected or "ok"):
            raise Mismatch(f"{kind}: expected {expected or 'ok'}, got {outcome}")
        self.check()
        return outcome

    _expected_code: str | None = None

    def _append(self, src: Source, count: int | None = None) -> None:
        past, expected = src.choice(self.pasts)
        new = _floats(src, (1, self.heads, src.integer(0, 4) if count is None else count, self.head_size))
        storage = contiguous.storage_of(past)
        needed = past.shape[2] + new.shape[2]
        if storage is not None and not storage.growable and needed > storage.capacity:
            self._expected_code = E.KV_CAPACITY_EXCEEDED.value  # a fixed allocation cannot grow
        present = contiguous.append(past, new)
        self.pasts.append((present, np.concatenate([expected, new], axis=2)))

    def _overflow(self, src: Source) -> None:
        self._append(src, self.capacity + 1)

    @property
    def formats(self) -> tuple:
        """codebook2 needs whole 32-value groups: only offered when a token row is 32 values."""
        return FORMATS if self.head_size == 32 else FORMATS[:-1]

    def _paged(self, src: Source) -> None:
        cache, keys, values, exact = src.choice(self.caches)
        n = src.integer(1, 2 * self.block + 1)
        k, v = _floats(src, (self.heads, n, self.head_size)), _floats(src, (self.heads, n, self.head_size))
        formats = (src.choice(self.formats), src.choice(self.formats))
        grown = cache.append(k, v, *formats)
        self.caches.append((grown, np.concatenate([keys, k], 1), np.concatenate([values, v], 1),
                            exact and formats == ("dense", "dense")))

    def _convert(self, src: Source) -> None:
        cache, keys, values, exact = src.choice(self.caches)
        if not cache.blocks:
            return
        indices = sorted({src.integer(0, len(cache.blocks) - 1) for _ in range(src.integer(1, 3))})
        formats = (src.choice(self.formats), src.choice((None,) + self.formats))
        converted = cache.convert(indices, *formats)
        self.caches.append((converted, keys, values, exact and formats[0] == "dense" and formats[1] in (None, "dense")))

    def _attend(self, src: Source) -> None:
        cache = src.choice(self.caches)[0]
        if not cache.count:
            return
        group = src.choice((1, 2))
        q = _floats(src, (1, self.heads * group, src.integer(1, min(3, cache.count)), self.head_size))
        causal = src.integer(0, 1)
        got = paged_attention(q, cache, is_causal=causal)
        k, v = cache.dequantized()
        k, v = (k[None] if k.ndim == 3 else k), (v[None] if v.ndim == 3 else v)
        sq = q.shape[2]  # the queries are the last sq cached tokens: the rest is the past
        want = attention(q, k[:, :, -sq:], v[:, :, -sq:], None, k[:, :, :-sq], v[:, :, :-sq], is_causal=causal).y
        if not np.allclose(got, want, rtol=1e-5, atol=1e-4):  # online versus direct softmax in float32
            raise Mismatch(f"paged attention differs from dense attention over the dequantized cache by "
                           f"{np.max(np.abs(got - want))}")

    def _bad_capacity(self, src: Source) -> None:
        self._expected_code = E.KV_CAPACITY_INVALID.value
        capacity = src.choice((0, -1, 2.5, True, "4"))
        if src.boolean():
            contiguous.empty_cache(1, self.heads, self.head_size, capacity)
        else:
            paged.empty(self.heads, self.head_size, capacity)

    def _bad_shape(self, src: Source) -> None:
        self._expected_code = E.KV_SHAPE_MISMATCH.value
        wrong = src.choice(((1, self.heads + 1, 1, self.head_size), (1, self.heads, 1, self.head_size + 1),
                            (self.heads, 1, self.head_size)))
        if src.boolean():
            contiguous.append(src.choice(self.pasts)[0], np.zeros(wrong, np.float32))
        else:
            shape = wrong[1:] if len(wrong) == 4 else (self.heads, 1, self.head_size + 2)
            src.choice(self.caches)[0].append(np.zeros(shape, np.float32), np.zeros(shape, np.float32))

    def _bad_block(self, src: Source) -> None:
        self._expected_code = E.KV_BLOCK_INVALID.value
        cache = src.choice(self.caches)[0]
        cache.convert([len(cache.blocks) + src.integer(0, 3)], "int8")

    def _bad_attention(self, src: Source) -> None:
        cache = src.choice(self.caches)[0]
        self._expected_code = E.ATTENTION_INPUT_INVALID.value
        q = np.zeros((1, self.heads, 1, self.head_size + src.integer(1, 3)), np.float32)
        paged_attention(q, cache)

    # ----------------------------------------------------------------------------------- checks
    def check(self) -> None:
        for present, expected in self.pasts:
            if present.shape != expected.shape or not np.array_equal(present, expected):
                raise Mismatch(f"a contiguous present of {expected.shape[2]} tokens no longer equals the "
                               "concatenation of its appends")
        for cache, keys, values, exact in self.caches:
            if cache.count != keys.shape[1]:
                raise Mismatch(f"paged cache holds {cache.count} tokens, {keys.shape[1]} were appended")
            if exact:  # only dense appends and conversions so far: the cache is the concatenation
                if any(fmt != ("dense", "dense") for fmt in cache.formats):
                    raise Mismatch(f"dense appends produced block formats {cache.formats}")
                k, v = cache.dequantized()
                k = k[0] if k.ndim == 4 else k.transpose(1, 0, 2) if k.shape[0] != self.heads else k
                v = v[0] if v.ndim == 4 else v.transpose(1, 0, 2) if v.shape[0] != self.heads else v
                if not (np.array_equal(k, keys) and np.array_equal(v, values)):
                    raise Mismatch("a dense paged cache does not dequantize to the concatenation")


def run_kv_script(src: Source, steps: int | None = None) -> list[str]:
    runner = KVRunner.create(src)
    return [runner.step(src) for _ in range(steps if steps is not None else src.integer(1, 12))]


# ------------------------------------------------------------------- decode models carried by bindings
#: Attention variants of a generated decode model: (is_causal, scale, softcap) choices and head groupings
#: (query heads per key/value head: 1 is MHA, more is GQA, and with one key/value head MQA).
SCALES = (None, None, 0.5, 0.125, 1.0)
SOFTCAPS = (0.0, 0.0, 1.5, 30.0)
GROUPS = (1, 1, 2, 4)
MASKS = (None, None, "bool", "float")
#: Paged block sizes; 0 is an invalid capacity (KV_CAPACITY_INVALID on every run).
BLOCK_SIZES = (1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 0)
#: Tokens a contiguous cache may hold in a script: within this, every runtime appends in place when
#: ownership permits (Required.KV.CapacityReuse), so which presents share a buffer is forced.
MAX_TOKENS = 16
#: Values of a float mask: 0 and -inf (attend or not) and finite additive biases.
MASK_VALUES = np.array([0.0, 0.0, -np.inf, -1.5, 2.0], np.float32)
DECODE_KINDS = ("decode", "decode", "decode", "prefill", "values", "branch", "reset_empty", "bad_heads",
                "bad_mask", "run_cancelled", "close")
#: A decode model's deliberate attribute focus: the one the generator makes sure is set (the others are drawn
#: as before). "padding" masks the last keys of every row, as padded sequences do; "window" sets
#: left_window_size; "mqa" has one key/value head under several query heads.
ATTENTION_FOCUS = ("plain", "scale", "softcap", "mask_bool", "mask_float", "causal", "gqa", "mqa", "padding",
                   "window")
#: Block formats of a paged cache's key/value blocks: both sides one format, "unsigned" (a uint format),
#: "mixed" (key and value differ) or "struct" (codebook2 struct blocks, 32-value rows).
BLOCK_FORMS = ("dense", "int8", "int4", "int2", "unsigned", "mixed", "struct")
PHASES = ("decode", "prefill")
WINDOWS = (0, 1, 2, 3)
HELD_DECODE_KINDS = ("held_run", "held_cancel")


@dataclass
class DecodeModel:
    """A decode step whose cache the graph's persistent bindings carry: contiguous (ONNX Attention,
    ``past_key``/``past_value`` <- ``present_key``/``present_value``) or paged (the ``paged_attention``
    role, ``cache`` <- ``next_cache``). ``q`` passes a Hold node first, so a run can be held."""

    model: object
    paged: bool
    heads: int
    q_heads: int
    head_size: int
    mask: str | None
    mask_heads: int
    attrs: dict
    padding: bool = False  # masks end with padded (masked) keys
    phase: str = "decode"  # "prefill": chunks of several tokens dominate the calls
    tags: tuple[str, ...] = ()

    @property
    def bound(self) -> dict[str, str]:
        if self.paged:
            return {"cache": "next_cache"}
        return {"past_key": "present_key", "past_value": "present_value"}

    def empty(self) -> dict:
        """Initial values of an empty cache."""
        if self.paged:
            from conformance.values import Struct
            from reference_impl.kv.formats import KV_PAGED_CACHE

            return {"cache": Struct({"blocks": [], "length": np.array(0, np.int64)}, KV_PAGED_CACHE)}
        empty = np.zeros((1, self.heads, 0, self.head_size), np.float32)
        return {"past_key": empty, "past_value": empty.copy()}


    def attend_over_cache(self, feeds: dict, outputs: dict) -> np.ndarray:
        """Y of a paged step recomputed by dense attention over the K/V its returned ``next_cache`` decodes
        to (the queries are its last tokens): what any encoding of the blocks must give, within rounding."""
        from conformance.adapters.reference import to_runtime
        from reference_impl.kv.attention import AttentionAttrs

        settings = {name: self.attrs[name] for name in ("scale", "softcap", "left_window_size") if name in self.attrs}
        cache = paged.PagedKVCache.from_struct(to_runtime(outputs["next_cache"]), self.heads, self.head_size,
                                               self.head_size, max(int(self.attrs["block_size"]), 1))
        k, v = cache.dequantized()
        sq = feeds["q"].shape[2]
        return attention(feeds["q"], k[:, :, -sq:], v[:, :, -sq:], feeds.get("attn_mask"), k[:, :, :-sq],
                         v[:, :, :-sq], attrs=AttentionAttrs(is_causal=bool(self.attrs["is_causal"]),
                                                             **settings)).y


def _tensor_io(graph, name: str, dims, elem: int = 1, output: bool = False) -> None:
    from fuzz.layouts import tensor_type
    from reference_impl import schema

    info = schema.ValueInfoProto(name=name)
    info.type.CopyFrom(tensor_type(elem, dims))
    (graph.output if output else graph.input).append(info)


def _formats_of(src: Source, form: str, head_size: int) -> tuple[str, str]:
    if form == "unsigned":
        return src.choice(("uint8", "uint4", "uint2")), src.choice(("uint8", "uint4", "uint2"))
    if form == "mixed":
        pool = FORMATS if head_size == 32 else FORMATS[:-1]
        key = src.choice(pool)
        return key, src.choice([f for f in pool if f != key])
    if form == "struct":
        return "codebook2", src.choice(("codebook2", "dense", "int8"))
    return form, form


def gen_decode_model(src: Source) -> DecodeModel:
    """A decode model over a contiguous or paged cache. The attribute focus (``ATTENTION_FOCUS``), the block
    form of a paged cache (``BLOCK_FORMS``) and the phase (``PHASES``) are drawn on purpose, so every
    attribute meets every block format in prefill and decode calls."""
    paged = src.boolean()
    focus = src.choice(ATTENTION_FOCUS)
    form = src.choice(BLOCK_FORMS) if paged else "dense"
    phase = src.choice(PHASES)
    heads = src.choice((1, 1, 2))
    groups = src.choice(GROUPS)
    if focus == "gqa" and groups == 1:
        groups = src.choice((2, 4))
    if focus == "mqa":
        heads, groups = 1, src.choice((2, 4))
    q_heads = heads * groups
    head_size = 32 if form == "struct" else src.choice((2, 4, 8, 32) if paged else (2, 4, 8))
    mask = {"mask_bool": "bool", "mask_float": "float"}.get(focus) or \
        (src.choice(("bool", "float")) if focus == "padding" else src.choice(MASKS))
    mask_heads = src.choice((1, q_heads))
    attrs = {"is_causal": 1 if focus == "causal" else src.integer(0, 1)}
    scale, softcap = src.choice(SCALES), src.choice(SOFTCAPS)
    if focus == "scale" and scale is None:
        scale = src.choice((0.5, 0.125, 2.0))
    if focus == "softcap" and not softcap:
        softcap = src.choice((1.5, 30.0, 0.75))
    if scale is not None:
        attrs["scale"] = scale
    if softcap:
        attrs["softcap"] = softcap
    if focus == "window":
        attrs["left_window_size"] = src.choice(WINDOWS)
    model = schema_model()
    graph = model.graph
    graph.node.add(op_type="Hold", domain="onnx_light.conformance", input=["q"], output=["q_held"])
    _tensor_io(graph, "q", (1, q_heads, "s", head_size))
    _tensor_io(graph, "k", (1, heads, "s", head_size))
    _tensor_io(graph, "v", (1, heads, "s", head_size))
    if mask:
        _tensor_io(graph, "attn_mask", (1, mask_heads, "s", "t"), elem=9 if mask == "bool" else 1)
    _tensor_io(graph, "y", (1, q_heads, "s", head_size), output=True)
    if paged:
        attrs["block_size"] = src.choice(BLOCK_SIZES)
        if form != "dense":
            attrs["key_format"], attrs["value_format"] = _formats_of(src, form, head_size)
        elif src.chance(1, 3):
            formats = FORMATS if head_size == 32 else FORMATS[:-1]
            attrs["key_format"], attrs["value_format"] = src.choice(formats), src.choice(formats)
        if src.chance(1, 4):
            attrs["max_tokens"] = src.integer(1, MAX_TOKENS)
    tags = (f"attention:{focus}*{form}", f"phase:{phase}")
    dm = DecodeModel(model, paged, heads, q_heads, head_size, mask, mask_heads, attrs, focus == "padding", phase,
                     tags)
    _decode_graph(dm)
    return dm


def schema_model():
    from reference_impl import schema

    model = schema.ModelProto(ir_version=10, producer_name="fuzz-decode")
    model.opset_import.add(domain="", version=23)
    model.opset_import.add(domain="onnx_light.conformance", version=1)
    model.graph.name = "decode"
    return model


def _decode_graph(dm: DecodeModel) -> None:
    """The attention node, the cache's inputs and outputs and the persistent bindings of ``dm``."""
    from reference_impl.kv.formats import KV_PAGED_CACHE, kv_struct_types

    model, graph = dm.model, dm.model.graph
    if dm.paged:
        model.opset_import.add(domain="ai.rt", version=1)
        model.struct_types.extend(kv_struct_types())
        inputs = ["q_held", "k", "v", "cache"] + (["attn_mask"] if dm.mask else [])
        node = graph.node.add(op_type="PagedAttention", domain="ai.rt", input=inputs, output=["y", "next_cache"])
        graph.input.add(name="cache").type.struct_type.type_ref = KV_PAGED_CACHE
        graph.output.add(name="next_cache").type.struct_type.type_ref = KV_PAGED_CACHE
    else:
        node = graph.node.add(op_type="Attention", input=["q_held", "k", "v", "attn_mask" if dm.mask else "",
                                                          "past_key", "past_value"],
                              output=["y", "present_key", "present_value"])
        for name in ("past_key", "past_value"):
            _tensor_io(graph, name, (1, dm.heads, "p", dm.head_size))
        for name in ("present_key", "present_value"):
            _tensor_io(graph, name, (1, dm.heads, "t", dm.head_size), output=True)
    add_attributes(node, dm.attrs)
    for input_name, output_name in dm.bound.items():
        graph.persistent_bindings.add(input_name=input_name, output_name=output_name)


#: The attributes a near-duplicate decode model changes, one at a time (block ones only for paged caches).
TWIN_ATTRIBUTES = ("scale", "softcap", "is_causal", "left_window_size")
TWIN_BLOCK_ATTRIBUTES = ("block_size", "key_format", "value_format")


def twin_decode_model(src: Source, dm: DecodeModel) -> DecodeModel:
    """A decode model that differs from ``dm`` in exactly one attribute value (the same geometry, so the
    same empty cache opens both)."""
    import copy

    part = src.choice(TWIN_ATTRIBUTES + (TWIN_BLOCK_ATTRIBUTES if dm.paged else ()))
    attrs = dict(dm.attrs)
    now = attrs.get(part)
    if part == "scale":
        attrs[part] = src.choice([x for x in (0.5, 0.125, 1.0, 0.25) if x != now])
    elif part == "softcap":
        attrs[part] = src.choice([x for x in (1.5, 30.0, 0.75) if x != now])
    elif part == "is_causal":
        attrs[part] = 1 - int(now or 0)
    elif part == "left_window_size":
        attrs[part] = src.choice([x for x in WINDOWS if x != now])
    elif part == "block_size":
        attrs[part] = src.choice([x for x in (1, 2, 3, 4, 5) if x != now])
    else:
        pool = FORMATS if dm.head_size == 32 else FORMATS[:-1]
        attrs[part] = src.choice([f for f in pool if f != (now or "dense")])
        other = "value_format" if part == "key_format" else "key_format"
        attrs.setdefault(other, "dense")
    twin = copy.copy(dm)
    twin.model = schema_model()
    twin.attrs = attrs
    twin.tags = (f"twin:{part}",)
    graph = twin.model.graph
    graph.node.add(op_type="Hold", domain="onnx_light.conformance", input=["q"], output=["q_held"])
    for info in dm.model.graph.input:
        if info.name in ("q", "k", "v", "attn_mask"):
            graph.input.add().CopyFrom(info)
    graph.output.add().CopyFrom(dm.model.graph.output[0])
    _decode_graph(twin)
    return twin


def gen_decode_ops(src: Source, dm: DecodeModel, held: bool = False, max_ops: int = 10, base: int = 0,
                   origin: int | None = None) -> list:
    """Decode calls (one token, or a chunk of prefill) that grow the cache, branches back to an earlier
    cache (``reset`` to values a run returned), resets to an empty cache, broken calls (wrong head count,
    a mask of the wrong type or length), cancelled and held runs. Token counts stay within ``MAX_TOKENS``
    per branch, so a contiguous cache never needs to grow its allocation. In the prefill phase chunks come
    more often and run up to the room left, so they cross paged block sizes with a partial last block.
    ``base``: the index of the first operation in the script; ``origin``: the operation whose values the
    cache starts from (None: the scenario's initial values)."""
    from fuzz.statescript import Earlier, Op

    kinds = DECODE_KINDS + (("prefill",) * 3 if dm.phase == "prefill" else ()) + (HELD_DECODE_KINDS if held else ())
    ops: list = []
    length = 0
    lengths = {origin: 0}  # op index (None: the initial values) -> cache length after it
    for _ in range(src.integer(1, max_ops)):
        kind = src.choice(kinds)
        if kind in ("decode", "prefill", "bad_heads", "bad_mask", "run_cancelled", "held_run", "held_cancel"):
            count = 1
            if kind == "prefill":
                count = src.integer(2, max(2, MAX_TOKENS - length)) if dm.phase == "prefill" else src.integer(2, 4)
            if length + count > MAX_TOKENS:
                kind, count = "branch", 0
        if kind == "values" or kind == "close":
            ops.append(Op(kind))
        elif kind == "reset_empty":
            ops.append(Op("reset", initial=dm.empty()))
            length = 0
        elif kind == "branch":
            index = src.choice(list(lengths))
            ops.append(Op("reset", initial={name: Earlier(index, name if index == origin else output)
                                            for name, output in dm.bound.items()}))
            length = lengths[index]
        else:
            feeds = _decode_feeds(src, dm, count, length, broken=kind[4:] if kind.startswith("bad_") else "")
            block = int(dm.attrs.get("block_size", 0))
            tags = ("size:remainder",) if dm.paged and block and count > block and count % block else ()
            layout = _odd_feed(src, feeds)
            if kind == "held_run":
                ops.append(Op(kind, feeds, second=Op("run", _decode_feeds(src, dm, 1, length)),
                              inner=E.STATE_BUSY.value, tags=tags + layout))
            else:
                ops.append(Op("run" if kind in ("decode", "prefill", "bad_heads", "bad_mask") else kind, feeds,
                              tags=tags + layout))
            if kind in ("decode", "prefill", "held_run"):
                length += count
                lengths[base + len(ops) - 1] = length
    return ops


#: Caller buffer layouts of one attention feed (q, k or v).
FEED_LAYOUTS = ("strided", "readonly", "misaligned", "view_of_view")


def _odd_feed(src: Source, feeds: dict) -> tuple[str, ...]:
    """One time in four, one of q, k, v handed over in an odd caller buffer (``dimensions.lay_out``)."""
    from fuzz import dimensions

    if not src.chance(1, 4):
        return ()
    name, layout = src.choice(("q", "k", "v")), src.choice(FEED_LAYOUTS)
    feeds[name] = dimensions.lay_out(feeds[name], layout)
    return (f"layout:{layout}",)


def _varied(src: Source, shape: tuple) -> np.ndarray:
    """Float32 multiples of 1/32 that differ from head to head and token to token even when the input has
    few bytes left (a head mapping or a causal frontier is invisible over equal values): mostly a pattern
    drawn from one seed choice, sometimes the input's bytes themselves."""
    if src.chance(1, 4):
        return _floats(src, shape)
    rng = np.random.default_rng(src.integer(0, 65535))
    return ((rng.integers(0, 256, shape) - 128) / 32).astype(np.float32)


def _decode_feeds(src: Source, dm: DecodeModel, count: int, past: int, broken: str = "") -> dict:
    heads = dm.heads + (1 if broken == "heads" else 0)
    feeds = {"q": _varied(src, (1, dm.q_heads, count, dm.head_size)),
             "k": _varied(src, (1, heads, count, dm.head_size)),
             "v": _varied(src, (1, heads, count, dm.head_size))}
    if dm.mask:
        total = past + count + (src.choice((-1, 1)) if broken == "mask" else 0)
        shape = (1, dm.mask_heads, count, max(total, 1))
        if dm.mask == "bool":
            mask = src.byte_array(int(np.prod(shape))).reshape(shape) % 4 != 0
        else:
            mask = MASK_VALUES[src.byte_array(int(np.prod(shape))).reshape(shape) % len(MASK_VALUES)]
        if dm.padding and shape[-1] > 1:  # the last keys are padding: masked for every query
            pad = src.integer(1, shape[-1] - 1)
            mask[..., shape[-1] - pad:] = False if dm.mask == "bool" else -np.inf
        if broken == "mask" and src.boolean():
            mask = mask.astype(np.float64 if dm.mask == "float" else np.float32)
        feeds["attn_mask"] = mask
    return feeds
