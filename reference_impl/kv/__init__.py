"""KV-cache reference kernels: Attention, contiguous and paged (quantized) caches."""
