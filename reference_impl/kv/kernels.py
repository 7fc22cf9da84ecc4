"""KV kernels for the reference executor (``Executor(model, kernels=kv_kernels())``).

* ``Attention`` (standard domain): ONNX Attention whose past/present update is the contiguous cache
  append, so a decode step writes only the new tokens when the past is the claimed prefix of a cache
  allocation (e.g. an ``empty_cache`` initial value). Results equal the functional operator. A plain
  past moves into an allocation sized by the kernels' cache configuration (``kv_kernels(capacity=...,
  fixed=True)`` makes it a fixed capacity: exceeding it is KV_CAPACITY_EXCEEDED).
* ``ai.rt::PagedAttention`` (the default of the suite's ``paged_attention`` operator role, and the operator
  onnx-light registers): inputs (Q, K, V, past[, attn_mask]), outputs (Y, present), where the caches are
  KV_PAGED_CACHE struct values. The new K/V are appended (sealing full blocks in ``key_format`` /
  ``value_format``) and the queries attend over the blocks.

Kernels never create a second state system: the caches are ordinary values carried by the graph's
persistent bindings.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation
from reference_impl.kv import contiguous
from reference_impl.kv.attention import AttentionAttrs, attention, check_mask
from reference_impl.kv.paged import PagedKVCache, struct_geometry
from reference_impl.kv.paged_attention import paged_attention
from reference_impl.kv.storage import MAX_STORAGE_BYTES, check_capacity

#: Where the paged attention kernel is registered: the operator onnx-light registers (ai.rt::PagedAttention).
KV_DOMAIN = "ai.rt"
_ATTRS = set(AttentionAttrs.__dataclass_fields__)


def _attrs(attrs: dict, path: str, ignore: tuple[str, ...] = ()) -> AttentionAttrs:
    unknown = set(attrs) - _ATTRS - set(ignore)
    if unknown:
        raise violation(E.ATTENTION_INPUT_INVALID, path, f"unknown attributes {sorted(unknown)}")
    values = {name: value for name, value in attrs.items() if name in _ATTRS}
    for name in ("scale", "softcap"):
        if name in values:
            values[name] = float(values[name])
    return AttentionAttrs(**values)


def attention_kernel(args: list, attrs: dict, ctx, policy: contiguous.CapacityPolicy | None = None) -> list:
    """Standard Attention with the in-place cache append as its past/present update. ``policy`` sizes
    the allocation a plain past moves into (default: ``contiguous.capacity_policy``)."""
    args = list(args) + [None] * (7 - len(args))
    q, k, v, mask, past_key, past_value, nonpad = args[:7]
    append_kv = partial(contiguous.append_kv, cancel=getattr(ctx, "cancel", None), path="Attention", policy=policy)
    out = attention(q, k, v, mask, past_key, past_value, nonpad, attrs=_attrs(attrs, "Attention"),
                    append_kv=append_kv)
    return [out.y, out.present_key, out.present_value, out.qk_matmul_output]


def paged_attention_kernel(args: list, attrs: dict, ctx) -> list:
    """PagedAttention(Q, K, V, past[, attn_mask]) -> (Y, present) over a KV_PAGED_CACHE struct value.

    The signature of the ``paged_attention`` operator role (docs/testee-protocol.md): ``is_causal``
    defaults to 1 and ``max_tokens`` (default 4096) bounds past plus new tokens, as onnx-light's
    ai.rt::PagedAttention does. The kept cache's blocks fix its geometry; the new K/V must match it
    (KV_SHAPE_MISMATCH) and the queries must fit it (ATTENTION_INPUT_INVALID). An empty cache takes its
    geometry from the new K/V once they agree with Q. Everything is checked before the first write.
    """
    if len(args) not in (4, 5):
        raise violation(E.ATTENTION_INPUT_INVALID, "PagedAttention", "inputs are (Q, K, V, past[, attn_mask])")
    q, k, v, value = args[:4]
    mask = args[4] if len(args) == 5 else None
    for name, x in (("Q", q), ("K", k), ("V", v)):
        if not isinstance(x, np.ndarray) or x.ndim != 4 or x.shape[0] != 1 or x.dtype != np.float32 \
                or min(x.shape[1], x.shape[3]) < 1:
            raise violation(E.ATTENTION_INPUT_INVALID, f"PagedAttention.{name}",
                            "expected a float32 (1, heads, S, size) tensor with at least one head of size >= 1")
    block_size = _int_attribute(attrs, "block_size", 16)
    max_tokens = _int_attribute(attrs, "max_tokens", 4096)
    settings = _attrs({"is_causal": 1, **attrs}, "PagedAttention",
                      ignore=("block_size", "key_format", "value_format", "max_tokens"))
    geometry = struct_geometry(value, "PagedAttention.past")
    if geometry is None:
        _check_fit(q, k.shape[1], k.shape[3], settings, "K")
        geometry = (k.shape[1], k.shape[3], v.shape[3])
    else:
        for name, x, size in (("K", k, geometry[1]), ("V", v, geometry[2])):
            if x.shape[1] != geometry[0] or x.shape[3] != size:
                raise violation(E.KV_SHAPE_MISMATCH, f"PagedAttention.{name}",
                                f"new tokens {list(x.shape)} do not fit the cache's {geometry[0]} heads of {size}")
        _check_fit(q, geometry[0], geometry[1], settings, "Q")
    if k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2]:
        raise violation(E.ATTENTION_INPUT_INVALID, "PagedAttention.V",
                        f"V {list(v.shape)} and K {list(k.shape)} disagree on heads or token count")
    cache = PagedKVCache.from_struct(value, *geometry, block_size, "PagedAttention.past")
    if max_tokens <= 0:
        raise violation(E.KV_CAPACITY_INVALID, "PagedAttention.max_tokens",
                        f"max_tokens must be positive, got {max_tokens}")
    if cache.count + k.shape[2] > max_tokens:
        raise violation(E.KV_CAPACITY_EXCEEDED, "PagedAttention.max_tokens",
                        f"{cache.count} + {k.shape[2]} tokens exceed max_tokens {max_tokens}")
    if q.shape[2] > cache.count + k.shape[2]:
        raise violation(E.ATTENTION_INPUT_INVALID, "PagedAttention.Q",
                        f"{q.shape[2]} queries but only {cache.count + k.shape[2]} tokens")
    if mask is not None:
        mask = check_mask(mask, q.dtype, q.shape[:3] + (cache.count + k.shape[2],))
    formats = cache.check_formats(attrs.get("key_format", "dense"), attrs.get("value_format", "dense"),
                                  "PagedAttention")
    cache = cache.append(k[0], v[0], *formats, cancel=getattr(ctx, "cancel", None))
    return [paged_attention(q, cache, mask, attrs=settings), cache.to_struct()]


def _int_attribute(attrs: dict, name: str, default: int) -> int:
    value = attrs.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise violation(E.KV_CAPACITY_INVALID, f"PagedAttention.{name}",
                        f"{name} must be an INT attribute, got {type(value).__name__}")
    return int(value)


def _check_fit(q: np.ndarray, kv_heads: int, head_size: int, settings: AttentionAttrs, blame: str) -> None:
    """Queries fit keys of ``kv_heads`` x ``head_size`` (GQA grouping, equal head sizes, head attributes);
    ``blame`` names the input reported when they do not."""
    if q.shape[1] % kv_heads or q.shape[3] != head_size:
        raise violation(E.ATTENTION_INPUT_INVALID, f"PagedAttention.{blame}",
                        f"{q.shape[1]} query heads of size {q.shape[3]} do not fit {kv_heads} key/value heads of "
                        f"size {head_size}")
    for name, given, actual in (("q_num_heads", settings.q_num_heads, q.shape[1]),
                                ("kv_num_heads", settings.kv_num_heads, kv_heads)):
        if given is not None and given != actual:
            raise violation(E.ATTENTION_INPUT_INVALID, f"PagedAttention.{name}",
                            f"{given} contradicts the {actual} heads")


def kv_kernels(capacity: int | None = None, fixed: bool = False) -> dict:
    """Executor kernels keyed by (domain, op_type).

    The cache configuration applies to the allocations the Attention kernel makes when a past is a plain
    array (e.g. a zero-length initial value): ``capacity`` tokens (default 256), head-major, and with
    ``fixed`` never grown, so a run that needs more fails with KV_CAPACITY_EXCEEDED and leaves the state
    as it was. An allocation keeps its own policy when it moves (``empty_cache(..., fixed=...)``).
    """
    policy = None
    if capacity is not None or fixed:
        initial = contiguous.CapacityPolicy().initial if capacity is None else \
            check_capacity(capacity, "kv_kernels.capacity")
        if initial > MAX_STORAGE_BYTES:  # at least one byte per token: no allocation could hold it
            raise violation(E.KV_CAPACITY_INVALID, "kv_kernels.capacity",
                            f"{initial} tokens exceed the {MAX_STORAGE_BYTES}-byte allocation limit")
        policy = contiguous.CapacityPolicy(initial, bool(fixed))
    return {("", "Attention"): partial(attention_kernel, policy=policy),
            (KV_DOMAIN, "PagedAttention"): paged_attention_kernel}
