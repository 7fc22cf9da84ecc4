"""The cases of corpus/cases/kv/identity.toml: a KV decode model or cache differing from an accepted one in one
part is judged afresh. The reference passes every case; a runtime caching what it derived from the first
model or cache under a key missing that part fails the cases of that part: the lowered attention (attributes
and head counts) by the graph's name, the attributes by the node's name, and the cache's validated metadata
and block decoders by the cache input's name (and block position) across states."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
from test_state_identity import _validation_cached_by_path

from conformance.adapters.reference import ReferenceAdapter
from conformance.cases import load_cases
from conformance.execute import FAILED, PASSED, run_case
from corpus.builders import kv_identity
from reference_impl.executor import program
from reference_impl.kv import paged

REQ, REC = "Required.KV.Identity.", "Recommended.KV.Identity."
_ATTRIBUTE_PARTS = {REQ + f"Contiguous{p}" for p in ("Scale", "Softcap", "Causal")} | {REC + "ContiguousWindow"} \
    | {REQ + "PagedCausal"} | {REC + f"Paged{p}" for p in ("Scale", "Softcap", "Window")}
_BLOCK_FORMATS = {REQ + f"PagedBlockFormat{name}" for name in kv_identity.BLOCK_FORMATS}


@functools.cache
def _cases() -> dict:
    return {case.id: case for case in load_cases() if case.source == "cases/kv/identity.toml"}


def _failed(adapter_factory, ids, patch=None) -> set[str]:
    """The cases failed by a fresh runtime each (an adapter, plus ``patch`` installing its caches anew)."""
    failed = set()
    for case_id in sorted(ids):
        with pytest.MonkeyPatch.context() as monkeypatch:
            if patch is not None:
                patch(monkeypatch)
            if run_case(_cases()[case_id], adapter_factory()).verdict == FAILED:
                failed.add(case_id)
    return failed


def test_the_cases_are_there():
    assert len(_cases()) == 14
    assert _ATTRIBUTE_PARTS | _BLOCK_FORMATS <= set(_cases())


def test_every_case_passes_on_the_reference():
    assert {i for i in sorted(_cases()) if run_case(_cases()[i], ReferenceAdapter()).verdict != PASSED} == set()


class PlanByGraphName(ReferenceAdapter):
    """Lowers each attention node once per graph name: the first model's attributes and head counts (as a
    compiled plan fixes them) answer for every later model of that name."""

    def __init__(self) -> None:
        super().__init__()
        self.plans: dict = {}

    def executor_kernels(self) -> dict:
        def planned(kernel):
            def run(args, attrs, ctx):
                q, k = args[0], args[1]
                plan = {**attrs, "q_num_heads": q.shape[1], "kv_num_heads": k.shape[1]}
                return kernel(args, self.plans.setdefault(ctx.session.model.graph.name, plan), ctx)
            return run
        return {key: planned(kernel) for key, kernel in super().executor_kernels().items()}


def _attributes_by_node_name(monkeypatch) -> None:
    """Binds each KV node's attributes once per node name (domain, op_type, name): a later model's node of
    that name runs with the first one's attributes."""
    first: dict = {}
    original = program._custom

    def custom(fn, node):
        return original(fn, first.setdefault((node.domain, node.op_type, node.name), node))

    monkeypatch.setattr(program, "_custom", custom)


def _cache_knowledge_by_input_name(monkeypatch) -> None:
    """Keeps what it learned of a cache under the cache input's name across states: its validated metadata
    (``initial['past_key']`` is checked once) and the decoder bound to each of its blocks (by the block's
    place in the cache input, ``PagedAttention.past.blocks[i].key``)."""
    _validation_cached_by_path(monkeypatch)
    codecs: dict = {}
    original = paged.BlockCodec

    def codec(value, heads, head_size, catalogue, registry, path):
        if ".blocks[" not in path:
            return original(value, heads, head_size, catalogue, registry, path)
        if path not in codecs:
            codecs[path] = original(value, heads, head_size, catalogue, registry, path)
        return codecs[path]

    monkeypatch.setattr(paged, "BlockCodec", codec)


def test_a_plan_cached_by_graph_name_fails_the_attribute_and_head_cases():
    wanted = _ATTRIBUTE_PARTS | {REQ + "ContiguousKvHeads", REQ + "PagedKvHeads"}
    assert _failed(PlanByGraphName, _cases()) == wanted


def test_attributes_cached_by_node_name_fail_the_attribute_cases():
    assert _failed(ReferenceAdapter, _cases(), _attributes_by_node_name) == _ATTRIBUTE_PARTS


def test_cache_knowledge_by_input_name_fails_the_shape_and_block_format_cases():
    wanted = _BLOCK_FORMATS | {REQ + "ContiguousKvHeads", REQ + "ContiguousHeadSize"}
    assert _failed(ReferenceAdapter, _cases(), _cache_knowledge_by_input_name) == wanted


def test_every_case_is_failed_by_some_cache():
    """Each case is among those some wrong runtime above is shown to fail (each of which fails exactly the
    cases whose second model or cache differs in what it leaves out of its key)."""
    caught = _ATTRIBUTE_PARTS | _BLOCK_FORMATS | {REQ + "ContiguousKvHeads", REQ + "PagedKvHeads",
                                                   REQ + "ContiguousHeadSize"}
    assert set(_cases()) == caught


def _b_outputs(built: dict) -> list[np.ndarray]:
    return [np.asarray(step["outputs"]["y"]["data"]) for step in built["steps"]
            if step["op"] == "run" and step["state"] == "b"]


@pytest.mark.parametrize(("path", "part"), [(path, part) for path, twins in kv_identity.TWINS.items()
                                            for part, twin in twins.items() if twin.continued])
def test_the_differing_attribute_moves_y_far_past_the_tolerance(monkeypatch, path, part):
    """B's expected Y against what A's attributes give on the same data: the part alone moves it."""
    twin = kv_identity.TWINS[path][part]
    expected = _b_outputs(kv_identity.kv_identity_twin(path, part))
    monkeypatch.setitem(kv_identity.TWINS[path], part, dataclasses.replace(twin, b=twin.a))
    as_a = _b_outputs(kv_identity.kv_identity_twin(path, part))
    assert min(float(np.max(np.abs(x - y))) for x, y in zip(expected, as_a)) > 100 * kv_identity.TOLERANCE
