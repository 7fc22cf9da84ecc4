"""KV-cache reference kernels: ONNX Attention, contiguous and paged (quantized) caches.

``attention`` is the dense oracle; ``contiguous.append`` / ``ContiguousKVCache`` write only new tokens
into fixed-capacity storage; ``PagedKVCache`` holds per-block encoded K/V and ``paged_attention``
walks it block by block. ``kernels.kv_kernels()`` plugs them into the reference executor; ``qwen``
builds the end-to-end decoder fixture and ``measure`` reports per-token bytes. See docs/kv.md.
"""

from reference_impl.kv.attention import AttentionAttrs, AttentionOutputs, attention
from reference_impl.kv.contiguous import (
    CapacityPolicy,
    ContiguousKVCache,
    append,
    capacity_policy,
    empty_cache,
    tensor_scatter,
)
from reference_impl.kv.formats import BlockFormat, encode_block, kv_catalogue, kv_registry, kv_struct_types
from reference_impl.kv.paged import KVBlock, PagedKVCache
from reference_impl.kv.paged_attention import paged_attention
from reference_impl.kv.storage import KVCounters, KVStorage, counting

__all__ = [
    "AttentionAttrs", "AttentionOutputs", "BlockFormat", "CapacityPolicy", "ContiguousKVCache", "KVBlock",
    "KVCounters", "KVStorage", "PagedKVCache", "append", "attention", "capacity_policy", "counting",
    "empty_cache", "encode_block", "kv_catalogue", "kv_registry", "kv_struct_types", "paged_attention",
    "tensor_scatter",
]
