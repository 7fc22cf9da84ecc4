"""Defects a vendor hit writing adapters from the docs alone, each pinned by a test."""

from __future__ import annotations

import dataclasses
import json
import re
import xml.etree.ElementTree as ET

import numpy as np
import onnx
import pytest

from conformance.adapters import Rejected
from conformance.adapters.lowering import dequantize_model
from conformance.adapters.onnx_reference import OnnxReferenceAdapter
from conformance.adapters.reference import ReferenceAdapter
from conformance.cases import load_cases, select
from conformance.cli import main
from conformance.execute import FAILED, PASSED, PASSED_WITHOUT_CODE, run_case
from conformance.text import clip
from conformance.values import default_buffer_id
from reference_impl import schema


def _case(case_id: str):
    return select(load_cases(), [case_id])[0]


# ------------------------------------------------------------------------ identity routing
class CopyingState:
    """Retains the caller's buffers but hands out a fresh NumPy copy from values(), mapping each copy to
    the runtime buffer behind it; for any other array it answers the array's own address, exactly as
    the shipped onnxruntime example does."""

    def __init__(self, initial):
        self.retained = dict(initial)
        self.ids: dict[int, int] = {}
        self.keep: list = []

    def values(self):
        out = {}
        for name, array in self.retained.items():
            copy = array.copy()
            self.ids[id(copy)] = default_buffer_id(array)
            self.keep.append(copy)
            out[name] = copy
        return out

    def run(self, feeds):
        return {}

    def reset(self, initial):
        self.retained = dict(initial)

    def close(self):
        pass

    def buffer_id(self, value):
        found = self.ids.get(id(value))
        return found if found is not None else default_buffer_id(value)


class CopyingRuntime:
    name, version = "copying", "1"

    def profiles(self):
        return {"state", "zero-copy"}

    def open_state(self, model_bytes, initial, base_dir=None):
        return CopyingState(initial)


def test_identity_is_asked_of_the_state_that_produced_the_value():
    """Two open states; the identity step is about state b's values. Asking state a first (which answers
    every array with its address) made b's honest answer unreachable."""
    base = _case("Required.State.Isolation.TwoStatesOneModel")
    steps = [{"op": "open", "state": "a", "initial": {"past": {"dtype": "float32", "shape": [2], "data": [0, 0]}}},
             {"op": "open", "state": "b", "as": "ib",
              "initial": {"past": {"dtype": "float32", "shape": [2], "data": [1, 1]}}},
             {"op": "values", "state": "b", "as": "vb"},
             {"op": "identity", "same": [["ib|past", "vb|past"]]}]
    case = dataclasses.replace(base, id="Required.Test.Identity.Routed", steps=steps, _built=None)
    result = run_case(case, CopyingRuntime())
    assert result.verdict == PASSED, result.message


# --------------------------------------------------------------------- passed without code
class Uncoded(ReferenceAdapter):
    """The reference with every error code stripped: rejections carry no code."""

    def classify(self, exc):
        found = super().classify(exc)
        return Rejected(None, found.message) if found is not None else None


def test_a_rejection_without_code_is_shown_apart_everywhere(tmp_path, capsys):
    report = tmp_path / "report"
    code = main(["run", "--adapter", "tests.test_vendor_defects:Uncoded", "--quiet", "--report-dir", str(report),
                 "--cases", "Required.Catalogue.Identity.TypeIdZero",
                 "--cases", "Required.Affine.Storage.Int8PerTensor"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.strip().splitlines()[-1] == ("1 passed, 0 failed, 0 not supported, 0 expected failures, "
                                            "1 passed without code")
    results = {r["id"]: r for r in json.loads((report / "results.json").read_text())["results"]}
    assert results["Required.Catalogue.Identity.TypeIdZero"]["verdict"] == PASSED_WITHOUT_CODE
    assert results["Required.Affine.Storage.Int8PerTensor"]["verdict"] == PASSED
    junit = ET.fromstring((report / "junit.xml").read_bytes())
    marked = [c.get("name") for c in junit.iter("testcase")
              if any(p.get("value") == PASSED_WITHOUT_CODE for p in c.iter("property"))]
    assert marked == ["Required.Catalogue.Identity.TypeIdZero"]
    summary = (report / "summary.md").read_text()
    assert "Passed without code" in summary and "`Required.Catalogue.Identity.TypeIdZero`" in summary
    manifest = json.loads((report / "manifest.json").read_text())
    assert manifest["profiles"]["representation"] == "not certified"  # certification requires codes
    assert manifest["profiles"]["affine"] == "partial"  # two cases certify nothing
    assert manifest["totals"]["passed_without_code"] == 1
    assert main(["verify-bundle", str(report), "--integrity-only"]) == 0


def test_a_runtime_that_cannot_load_uint4_does_not_pass_the_padding_case():
    pytest.importorskip("tract")
    from conformance.adapters.tract_rt import TractAdapter

    result = run_case(_case("Required.Affine.Storage.Uint4PaddingNonzeroDecode"), TractAdapter())
    assert result.verdict == PASSED_WITHOUT_CODE, result.message


# ---------------------------------------------------------------------------- show, explain
def test_show_prints_the_steps_and_model_of_a_builder_state_case(capsys):
    case = _case("Recommended.KV.Paged.DenseBlocksMatchAttention")
    assert not case.steps and case.state_steps()
    assert main(["show", case.id]) == 0
    out = capsys.readouterr().out
    assert f"state trace of {len(case.state_steps())} steps" in out and "state trace of 0 steps" not in out
    assert "  step 0: {op = \"open\"" in out and f"  step {len(case.state_steps()) - 1}: " in out
    assert "model (text format):" in out and 'op_type: "PagedAttention"' in out


class AlwaysFree:
    """A lock that never says busy."""

    def acquire(self, blocking: bool = True) -> bool:
        return True

    def release(self) -> None:
        pass


def test_explain_prints_each_step_with_expected_and_actual():
    class NoFeedCheck(OnnxReferenceAdapter):
        """A lowered runtime whose caller loop does not check feeds against the declared types."""

        def open_state(self, model_bytes, initial, base_dir=None):
            state = super().open_state(model_bytes, initial, base_dir)
            state._check_feeds = lambda feeds: None
            return state

    case = _case("Required.State.Feeds.OverrideRetainedInput")
    from conformance.explain import explain

    result, text = explain(case, NoFeedCheck(), timeout=120)
    assert result.verdict == FAILED
    assert "  trace:\n" in text
    assert "    step 0: open\n      expected: accepted\n      actual:   open_state -> LoweredState" in text
    assert "    step 1: run\n      expected: rejected with STATE_FEED_OVERRIDES" in text
    assert ">>> the case failed here" in text
    assert "    step 2: values" in text and "not reached" in text


# ----------------------------------------------------------------------- failure list, text
def test_a_missing_failure_list_is_a_one_line_error(tmp_path, capsys):
    code = main(["run", "--failure-list", str(tmp_path / "absent.txt"), "--cases",
                 "Required.Affine.Storage.Int8PerTensor", "--report-dir", str(tmp_path / "r"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.count("\n") == 0 and err.startswith("conformance: failure list") and "Traceback" not in err
    assert not (tmp_path / "r").exists()  # nothing was run


LONG = ("the runtime could not load the model because " + " ".join(f"reason{n}" for n in range(120))).strip()


class Verbose(ReferenceAdapter):
    def decode(self, model_bytes, value_name, base_dir):
        raise RuntimeError(LONG)


def test_messages_stay_whole_in_json_and_are_cut_at_words_elsewhere(tmp_path, capsys):
    report = tmp_path / "r"
    main(["run", "--adapter", "tests.test_vendor_defects:Verbose", "--cases", "Required.Affine.Storage.Int8PerTensor",
          "--report-dir", str(report)])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("FAILED"))
    (result,) = json.loads((report / "results.json").read_text())["results"]
    assert LONG in result["message"]
    summary = next(x for x in (report / "summary.md").read_text().splitlines() if "Int8PerTensor" in x)
    junit = next(ET.fromstring((report / "junit.xml").read_bytes()).iter("failure")).get("message")
    for shown in (line, summary, junit):
        assert shown.endswith(" …")
        head = shown[:-2].rsplit(" ", 1)[-1]
        assert re.search(rf"\b{re.escape(head)}( |$)", result["message"]), shown  # the last word is whole


def test_clip_cuts_at_a_word_boundary():
    assert clip("alpha beta gamma", 100) == "alpha beta gamma"
    assert clip("alpha beta gamma", 12) == "alpha beta …"
    assert clip("alpha beta gamma", 11) == "alpha …"
    assert clip("alphabetagamma", 8) == "alphab …"
    assert clip("one\ntwo   three", 40) == "one two three"


# ---------------------------------------------------------------------------- DOUBLE scales
def _affine(text: str):
    return schema.parse_text(text, "EncodedValueProto")


@pytest.mark.parametrize("layout,dims,raw,expected", [
    ("scale { data_type: 11 double_data: 0.125 }", [3], b"\x08\x10\xf8", [1.0, 2.0, -1.0]),
    ("scale { dims: 2 data_type: 11 double_data: [0.5, 0.25] } zero_point { dims: 2 data_type: 3 raw_data: "
     "\"\\001\\002\" } axis: 1", [2, 2], b"\x03\x04\x05\x06", [1.0, 0.5, 2.0, 1.0]),
    ("scale { dims: 1 dims: 2 data_type: 11 double_data: [1, 0.1] } axis: 1 block_size: 2", [1, 3],
     b"\x01\x02\x03", [1.0, 2.0, 0.30000000000000004]),
])
def test_a_double_scale_lowers_to_a_valid_model_computing_in_double(layout, dims, raw, expected):
    shape = " ".join(f"dim {{ dim_value: {d} }}" for d in dims)
    value = _affine(f"name: \"w\" affine {{ storage_type: 3 {layout} }} "
                    f"logical_type {{ tensor_type {{ elem_type: 11 shape {{ {shape} }} }} }}")
    value.raw_data = raw
    model = onnx.ModelProto()
    model.ParseFromString(dequantize_model(value))
    onnx.checker.check_model(model, full_check=True)  # DequantizeLinear with a DOUBLE scale fails this
    from onnx.reference import ReferenceEvaluator

    (y,) = ReferenceEvaluator(model).run(None, {})
    assert y.dtype == np.float64 and y.shape == tuple(dims)
    np.testing.assert_array_equal(y.reshape(-1), np.array(expected))


def test_onnxruntime_decodes_a_double_scale_value():
    pytest.importorskip("onnxruntime")
    from conformance.adapters.ort import OnnxRuntimeAdapter

    for granularity in ("PerTensor", "PerAxis", "Blocked"):
        assert run_case(_case(f"Required.Affine.ScaleType.Double.{granularity}"), OnnxRuntimeAdapter()).verdict \
            == PASSED, granularity


def test_float_scales_still_use_dequantize_linear():
    value = _affine('name: "w" affine { storage_type: 3 scale { data_type: 1 float_data: 0.5 } } '
                    "logical_type { tensor_type { elem_type: 1 shape { dim { dim_value: 2 } } } }")
    value.raw_data = b"\x02\x04"
    model = onnx.ModelProto()
    model.ParseFromString(dequantize_model(value))
    assert [n.op_type for n in model.graph.node] == ["DequantizeLinear"]


# ------------------------------------------------------------------ caller-managed feedback
CALLER_RULES = ["Required.State.Initial", "Required.State.Feeds", "Required.State.ResetClose",
                "Required.State.Atomic", "Required.ZeroCopy.ReadOnly", "Required.State.Publication"]


def test_the_lowering_enforces_every_rule_a_caller_can():
    """On a runtime that is correct for what it does (onnx's evaluator), every caller-enforceable case
    passes with its error code: what a lowered peer still fails is the runtime's own behaviour."""
    results = {case.id: run_case(case, OnnxReferenceAdapter(), timeout=120)
               for case in select(load_cases(), CALLER_RULES) if "Struct" not in case.id}  # structs: L-STRUCT
    assert len(results) >= 15
    assert {k: r.message for k, r in results.items() if r.verdict != PASSED} == {}
    # The concurrency rules hold too, though a lowered runtime cannot park a run at the Hold node:
    state = OnnxReferenceAdapter().open_state(_case("Required.State.Feedback.HundredSteps").model_bytes(),
                                              {"past": np.zeros(2, np.float32)})
    state._enter()
    with pytest.raises(Rejected) as busy:
        state.run({"x": np.ones(2, np.float32)})
    assert busy.value.code == "STATE_BUSY"
