"""The faults of conformance/audit/faults/, ``nonpad_kv_seqlen`` values of 0 that no Required case
used to feed (and, Recommended, values beyond the cache), are each caught by the cases of
corpus/cases/kv/padding.toml listed for them: each passes on the reference and fails on the fault. The
hand-written expectations agree with onnx's reference evaluator and onnxruntime (Attention and TensorScatter)
call by call, and an empty row's zeros differ from what reading 0 as the whole cache gives."""

from __future__ import annotations

import numpy as np
import pytest
from fault_catchers import assert_caught_by_independent_cases, assert_every_case_listed, params
from plain_models import plain_onnx

from conformance.cases import load_cases

_NONPAD = "Required.KV.NonpadZero."
_ALL = (_NONPAD + "EmptyFirstRow", _NONPAD + "EmptySecondRowCausal", _NONPAD + "EveryRowEmpty")
#: fault ID -> the cases that must catch it
CATCHERS = {
    "KV-ATTENTION.nonpad-zero-rejected": _ALL,
    "KV-ATTENTION.nonpad-zero-as-full-length": _ALL,
    "KV-ATTENTION.nonpad-empty-row-nan": _ALL,
    "KV-ATTENTION.nonpad-beyond-cache-accepted": (
        "Recommended.KV.NonpadBeyondCache.FirstRowOneOver",
        "Recommended.KV.NonpadBeyondCache.SecondRowCausalFarOver"),
    "KV-ATTENTION.sliding-window-exclusive": (
        "Recommended.KV.SlidingWindow.Left", "Recommended.KV.SlidingWindow.Right"),
}
_BEYOND = tuple(CATCHERS["KV-ATTENTION.nonpad-beyond-cache-accepted"])
_FED_BACK = {"cache_key": "next_key", "cache_value": "next_value"}


def _cases() -> dict:
    return {case.id: case for case in load_cases() if case.source == "cases/kv/padding.toml"}


@pytest.mark.parametrize(("fault_id", "case_ids"), list(params(CATCHERS)))
def test_fault_is_caught_by_two_independent_cases(fault_id, case_ids):
    assert_caught_by_independent_cases(fault_id, case_ids)


def test_every_new_case_catches_a_fault_listed_here():
    assert_every_case_listed(CATCHERS, "cases/kv/padding.toml")


def _array(literal):
    from conformance import values as V

    return V.build(literal)


def _runner(case, peer: str):
    plain = plain_onnx(case)
    names = [o.name for o in plain.graph.output]
    if peer == "onnxruntime":
        ort = pytest.importorskip("onnxruntime")
        session = ort.InferenceSession(plain.SerializeToString())
        return lambda feeds: dict(zip(names, session.run(names, feeds), strict=True))
    from onnx.reference import ReferenceEvaluator

    evaluator = ReferenceEvaluator(plain)
    return lambda feeds: dict(zip(names, evaluator.run(None, feeds), strict=True))


@pytest.mark.clause("KV-ATTENTION")
@pytest.mark.parametrize("peer", ["onnx-reference", "onnxruntime"])
@pytest.mark.parametrize("case_id", _ALL + _BEYOND)
def test_hand_written_expectations_agree_with_peers(case_id, peer):
    """onnx's reference evaluator (1.23: zero rows for fully-masked queries) and onnxruntime's Attention and
    TensorScatter give every expected output of every successful call, the caches fed back by hand; each
    Required case has a call where some row's nonpad is 0."""
    case = _cases()[case_id]
    run = _runner(case, peer)
    steps = case.extras()["steps"]
    cache = {name: _array(value) for name, value in steps[0]["initial"].items()}
    zero_rows = 0
    for step in steps[1:]:
        if step["op"] != "run" or "error" in step:
            continue  # the refused call (its peers disagree: test_beyond_cache_is_left_open_by_the_peers)
        feeds = {name: _array(value) for name, value in step["feeds"].items()}
        zero_rows += int(np.sum(feeds["nonpad"] == 0))
        got = run({**feeds, **cache})
        for name, want in step["outputs"].items():
            np.testing.assert_allclose(got[name], _array(want), rtol=1e-6, atol=1e-6)
        cache = {name: got[output] for name, output in _FED_BACK.items()}
    assert zero_rows or case_id in _BEYOND


@pytest.mark.clause("KV-ATTENTION")
@pytest.mark.parametrize("case_id", _BEYOND)
def test_beyond_cache_is_left_open_by_the_peers(case_id):
    """Why those cases are Recommended: onnxruntime refuses a nonpad_kv_seqlen beyond the cache, onnx's
    reference evaluator runs it (every slot valid). After the first call, the refused call's row attends
    both written slots and the two zero slots there."""
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail

    case = _cases()[case_id]
    steps = case.extras()["steps"]
    first, bad = steps[1], steps[2]
    assert bad["cause"] == ["ATTENTION_INPUT_INVALID"] and case.level == "Recommended"
    cache = {name: _array(first["outputs"][output]) for name, output in _FED_BACK.items()}
    feeds = {name: _array(value) for name, value in bad["feeds"].items()}
    with pytest.raises(Fail, match="out of range"):
        _runner(case, "onnxruntime")({**feeds, **cache})
    got = _runner(case, "onnx-reference")({**feeds, **cache})
    row = int(np.flatnonzero(feeds["nonpad"] > 4)[0])
    np.testing.assert_allclose(got["y"][row].reshape(-1), got["next_value"][row, 0].mean(axis=0), rtol=1e-6)


@pytest.mark.clause("KV-ATTENTION")
def test_empty_rows_would_differ_under_each_wrong_reading():
    """Where a row's nonpad is 0, its expected output is zeros, while reading 0 as the whole cache gives the
    (nonzero) mean of the four slots: the cases tell the two readings apart at every such row."""
    for case_id in _ALL:
        steps = _cases()[case_id].extras()["steps"]
        for step in steps[1:]:
            feeds = {name: _array(value) for name, value in step["feeds"].items()}
            want = _array(step["outputs"]["y"])
            values = _array(step["outputs"]["next_value"])
            for row in np.flatnonzero(feeds["nonpad"] == 0):
                assert not want[row].any()
                # the last query (causal or not) would see every slot: the mean of the whole cache row
                assert values[row].mean(axis=1).all()


_WINDOWS = tuple(CATCHERS["KV-ATTENTION.sliding-window-exclusive"])


@pytest.mark.clause("KV-ATTENTION")
@pytest.mark.parametrize("peer", ["onnx-reference", "onnxruntime"])
@pytest.mark.parametrize("case_id", _WINDOWS)
def test_window_expectations_agree_with_peers(case_id, peer):
    """Attention-25 in onnx's reference evaluator and onnxruntime gives every expected output of both calls,
    the past fed back by hand."""
    case = _cases()[case_id]
    run = _runner(case, peer)
    steps = case.extras()["steps"]
    past = {name: _array(value) for name, value in steps[0]["initial"].items()}
    for step in steps[1:]:
        got = run({**{name: _array(value) for name, value in step["feeds"].items()}, **past})
        for name, want in step["outputs"].items():
            np.testing.assert_allclose(got[name], _array(want), rtol=1e-6, atol=1e-6)
        past = {"past_key": got["present_key"], "past_value": got["present_value"]}
