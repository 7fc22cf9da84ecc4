"""KV-cache reference kernels: ONNX Attention, contiguous and paged (quantized) caches.

``attention.attention`` is the dense oracle (the package does not re-export it, so ``kv.attention`` stays the
module whose helpers both paths share); ``contiguous.append`` / ``ContiguousKVCache`` write only new tokens
into fixed-capacity storage; ``PagedKVCache`` holds per-block K/V in their formats and ``paged_attention``
walks it a group of blocks at a time. ``kernels.kv_kernels()`` plugs them into the reference executor; ``qwen``
builds the end-to-end decoder fixture and ``measure`` reports per-token bytes. See docs/kv.md.
"""

from reference_impl.kv.attention import AttentionAttrs, AttentionOutputs
from reference_impl.kv.contiguous import (
    CapacityPolicy,
    ContiguousKVCache,
    append,
    capacity_policy,
    empty_cache,
    tensor_scatter,
)
from reference_impl.kv.formats import BlockFormat, encode_block, kv_catalogue, kv_registry, kv_struct_types
from reference_impl.kv.kernels import kv_kernels
from reference_impl.kv.paged import KVBlock, PagedKVCache
from reference_impl.kv.paged_attention import paged_attention
from reference_impl.kv.storage import KVCounters, KVStorage, counting

__all__ = [
    "AttentionAttrs", "AttentionOutputs", "BlockFormat", "CapacityPolicy", "ContiguousKVCache", "KVBlock",
    "KVCounters", "KVStorage", "PagedKVCache", "append", "capacity_policy", "counting",
    "empty_cache", "encode_block", "kv_catalogue", "kv_kernels", "kv_registry", "kv_struct_types", "paged_attention",
    "tensor_scatter",
]
