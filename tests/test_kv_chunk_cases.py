"""Sizes past any internal chunk, KV caches (corpus/cases/kv/chunks.toml): the reference passes every case
within its tolerance by a wide margin, and each case fails a runtime that tiles or pages attention with one
realistic bug: the partial last key tile dropped (tiles of 256 and of 2^16 tokens), the partial last block
of a paged cache skipped."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest

from conformance.adapters.reference import ReferenceAdapter
from conformance.audit.fault import Fault, wrap
from conformance.cases import load_cases
from conformance.execute import FAILED, PASSED, run_case
from reference_impl.kv import kernels as kv_kernels
from reference_impl.kv import paged

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

PREFIX = "Required.KV.Chunks."


@functools.cache
def _cases() -> dict:
    return {case.id: case for case in load_cases() if case.source == "cases/kv/chunks.toml"}


class TailTileDropped(Fault):
    """Attention reads the keys and values in tiles of ``tile`` tokens with ``for start in range(0, n - tile
    + 1, tile)``: the partial last tile, which holds the newest tokens, is never attended to."""

    def __init__(self, tile: int):
        super().__init__()
        self.tile, self.fault_id = tile, f"KV-ATTENTION.tail-tile-dropped-{tile}"

    def patches(self):
        def make(original):
            def attention(q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, **kwargs):
                out = original(q, k, v, attn_mask, past_key, past_value, nonpad_kv_seqlen, **kwargs)
                total = out.present_key.shape[2]
                kept = total - total % self.tile
                if kept in (0, total):
                    return out
                kwargs.pop("append_kv", None)  # the presents stay those of the call above
                keys, values = np.asarray(out.present_key)[:, :, :kept], np.asarray(out.present_value)[:, :, :kept]
                return out._replace(y=original(q, keys, values, attn_mask, None, None, nonpad_kv_seqlen, **kwargs).y)
            return attention
        return [wrap(kv_kernels, "attention", make)]


class PartialLastBlockDropped(Fault):
    """Paged attention walks ``length // block_size`` whole blocks, taking the block size from the first
    block: a partial last block, which holds the newest tokens, is never attended to."""

    fault_id = "KV-PAGED-RANGE.partial-last-block-dropped"

    def patches(self):
        def make(original):
            def block_groups(blocks, *args, **kwargs):
                blocks = tuple(blocks)
                if len(blocks) > 1 and blocks[-1].valid < blocks[0].valid:
                    blocks = blocks[:-1]
                return original(blocks, *args, **kwargs)
            return block_groups
        return [wrap(paged, "block_groups", make)]


CATCHERS = [
    (TailTileDropped(256), (PREFIX + "ContiguousContextPast2To16",)),
    (TailTileDropped(1 << 16), (PREFIX + "ContiguousContextPast2To16",)),
    (PartialLastBlockDropped(), (PREFIX + "PagedDenseContextPast2To14", PREFIX + "PagedInt4KeysUint8ValuesPast2To12",
                                 PREFIX + "PagedInt8KeysUint2ValuesPast2To11")),
]


def _tightened(case, atol: float):
    """The case's trace with every run's tolerance set to ``atol``."""
    steps = [dict(step, atol=atol, rtol=0.0) if step.get("op") == "run" else step for step in case.state_steps()]
    return steps


@pytest.mark.parametrize("case_id", sorted(_cases()))
def test_the_reference_passes_within_a_hundredth_of_the_tolerance(case_id):
    case = _cases()[case_id]
    assert run_case(case, ReferenceAdapter(), timeout=120).verdict == PASSED
    tolerance = min(step["atol"] for step in case.state_steps() if step.get("op") == "run")
    tight = dataclasses.replace(case, steps=_tightened(case, tolerance / 100), _built=None)
    result = run_case(tight, ReferenceAdapter(), timeout=120)
    assert result.verdict == PASSED, result.message


@pytest.mark.parametrize(("fault", "case_ids"), CATCHERS, ids=[fault.fault_id for fault, _ in CATCHERS])
def test_a_tiling_bug_fails_its_cases(fault, case_ids):
    for case_id in case_ids:
        result = run_case(_cases()[case_id], fault, timeout=120)
        assert result.verdict == FAILED, f"{fault.fault_id} passes {case_id}"
        assert not result.traceback and "differs" in result.message, result.message


def test_every_case_fails_some_tiling_bug():
    assert set(_cases()) == {case_id for _, case_ids in CATCHERS for case_id in case_ids}


def test_the_contexts_are_odd_and_the_last_blocks_partial():
    for case in _cases().values():
        args = case.args
        if "block_size" in args:
            assert args["context"] % args["block_size"] and args["context"] > 2048
            assert (args["context"] + 1) % 2  # the first call's total is odd
        else:
            assert args["context"] > 1 << 16
            totals = np.cumsum([args["context"], *args["calls"]])[1:]
            assert all(totals % 2)
