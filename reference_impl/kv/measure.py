"""Per-token accounting of a stateful decode: what the state holds, what each call needed as scratch,
what state management copied, and what the caches wrote.

Kernel work (appends, block encoding) is counted by the KV counters; state management copies by the
state's own counters. The two are reported side by side and never mixed.
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from reference_impl.kv.storage import counting, storage_of
from reference_impl.values import EncodedValue, leaves


@dataclass(frozen=True)
class StepReport:
    step: int
    new_tokens: int
    context: int
    state_bytes: int  # payload bytes the retained values expose (plus encoded headers: scales, layout)
    allocated_bytes: int  # bytes of the distinct allocations behind them (spare capacity included)
    scratch_bytes: int  # peak transient memory of the call beyond what it returned or retained
    copied_bytes: int  # payload bytes copied by state management (must be 0)
    appended_bytes: int  # bytes the caches wrote for the new tokens
    relocated_bytes: int  # bytes copied when a cache moved to fresh storage
    encoded_bytes: int  # bytes of quantized blocks produced when blocks were sealed
    seconds: float


def _array(leaf: Any) -> np.ndarray | None:
    if isinstance(leaf, EncodedValue):
        return leaf.payload
    return leaf if isinstance(leaf, np.ndarray) else None


def _owner(array: np.ndarray) -> tuple[int, int]:
    """Identity and size of the allocation an array ultimately lives in."""
    storage = storage_of(array)
    if storage is not None:
        return id(storage.data), storage.nbytes
    owner: Any = array
    while isinstance(owner, np.ndarray) and owner.base is not None:
        owner = owner.base
    if isinstance(owner, np.ndarray):
        return id(owner), owner.nbytes
    if isinstance(owner, (bytes, bytearray, memoryview)):
        return id(owner), len(owner) if not isinstance(owner, memoryview) else owner.nbytes
    return id(array), array.nbytes


def state_bytes(values: Mapping[str, Any]) -> tuple[int, int]:
    """(exposed payload + encoded header bytes, bytes of the distinct allocations behind the payloads)."""
    exposed, owners = 0, {}
    for name, value in values.items():
        for _, leaf in leaves(value, name):
            array = _array(leaf)
            if array is None:
                continue
            exposed += array.nbytes + (leaf.header.ByteSize() if isinstance(leaf, EncodedValue) else 0)
            key, size = _owner(array)
            owners[key] = size
    return exposed, sum(owners.values())


def decode(state, feeds: Iterable[Mapping[str, Any]], trace_memory: bool = True,
           token_input: str = "input_ids") -> tuple[list[dict], list[StepReport]]:
    """Run ``state`` over the feeds, one call each, returning outputs and a report per call."""
    outputs, reports, context = [], [], 0
    for step, feed in enumerate(feeds):
        copied_before = state.counters.payload_bytes_copied
        if trace_memory:
            tracemalloc.start()
        start = time.perf_counter()
        with counting() as kv:
            out = state.run(feed)
        seconds = time.perf_counter() - start
        scratch = 0
        if trace_memory:
            current, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            scratch = max(peak - current, 0)
        new_tokens = int(np.asarray(feed[token_input]).shape[-1])
        context += new_tokens
        exposed, allocated = state_bytes(state.values)
        reports.append(StepReport(step, new_tokens, context, exposed, allocated, scratch,
                                  state.counters.payload_bytes_copied - copied_before, kv.appended_bytes,
                                  kv.relocated_bytes, kv.encoded_bytes, seconds))
        outputs.append(out)
    return outputs, reports


def format_reports(reports: list[StepReport], every: int = 8) -> str:
    """A fixed-width table of every ``every``-th step (and the last)."""
    header = (f"{'step':>5} {'ctx':>5} {'state B':>9} {'alloc B':>9} {'scratch B':>10} {'copied B':>9} "
              f"{'append B':>9} {'reloc B':>8} {'encoded B':>9} {'ms':>7}")
    lines = [header]
    for r in reports:
        if r.step % every == 0 or r is reports[-1]:
            lines.append(f"{r.step:>5} {r.context:>5} {r.state_bytes:>9} {r.allocated_bytes:>9} "
                         f"{r.scratch_bytes:>10} {r.copied_bytes:>9} {r.appended_bytes:>9} "
                         f"{r.relocated_bytes:>8} {r.encoded_bytes:>9} {r.seconds * 1e3:>7.2f}")
    return "\n".join(lines)


def peak_traced_bytes(fn) -> int:
    """Smallest tracemalloc peak over three calls of ``fn``: interpreter tables (protobuf wrappers, dict
    resizes) sometimes grow during a call; the minimum is the call's own working set."""
    import gc

    peaks = []
    for _ in range(3):
        gc.collect()
        tracemalloc.start()
        fn()
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    return min(peaks)
