"""Case-format mechanisms for generated dimensions: a family's ``cross`` table (every row once per
combination, e.g. the three positions of an offending item) and a state case's further ``models`` opened
by name in one trace with one adapter."""

from __future__ import annotations

import pytest

from conformance.adapters import SuiteError
from conformance.adapters.reference import ReferenceAdapter
from conformance.cases import load_cases
from conformance.execute import FAILED, PASSED, run_case
from conformance.families import expand_family

MODEL = '''
ir_version: 13
opset_import {{ domain: "" version: 23 }}
opset_import {{ domain: "onnx_light" version: 1 }}
graph {{
  name: "g"
  encoded_initializer {{ name: "w" affine {{ storage_type: 3 scale {{ data_type: 1 float_data: {scale} }} }}
    logical_type {{ tensor_type {{ elem_type: 1 shape {{ dim {{ dim_value: 2 }} }} }} }} raw_data: "\\x01\\x02" }}
  node {{ op_type: "Decode" domain: "onnx_light" input: "w" output: "y" }}
  output {{ name: "y" type {{ tensor_type {{ elem_type: 1 shape {{ dim {{ dim_value: 2 }} }} }} }} }}
}}
'''
CASE = """
[[case]]
id = "Recommended.Affine.Sequence.TwoModels"
clause = ["AFF-DQ"]
op = "state"
profile = "affine"
model_text = '''{first}'''
models = {{ b = '''{second}''' }}
step = [
  {{ op = "open" }},
  {{ op = "run", outputs = {{ y = {{ dtype = "float32", shape = [2], data = [0.5, 1.0] }} }} }},
  {{ op = "open", state = "b", model = "{name}" }},
  {{ op = "run", state = "b", outputs = {{ y = {{ dtype = "float32", shape = [2], data = [0.25, 0.5] }} }} }},
]
"""


def _case(tmp_path, second_scale: str = "0.25", name: str = "b"):
    corpus = tmp_path / "corpus"
    (corpus / "cases").mkdir(parents=True)
    text = CASE.format(first=MODEL.format(scale="0.5"), second=MODEL.format(scale=second_scale), name=name)
    (corpus / "cases" / "sequence.toml").write_text(text)
    (case,) = load_cases(str(corpus))
    return case


def test_cross_takes_every_row_once_per_combination():
    family = {"id": "Required.Catalogue.Positions.$name$position", "rows": [{"name": "A"}, {"name": "B"}],
              "cross": {"position": ["First", "Middle", "Last"]}}
    assert [entry["id"] for entry in expand_family(family)] == [
        f"Required.Catalogue.Positions.{name}{position}" for name in "AB" for position in ("First", "Middle", "Last")]


def test_a_trace_opens_the_named_model_with_the_same_adapter(tmp_path):
    assert run_case(_case(tmp_path), ReferenceAdapter()).verdict == PASSED


def test_the_second_model_is_judged_on_its_own_values(tmp_path):
    result = run_case(_case(tmp_path, second_scale="0.5"), ReferenceAdapter())
    assert result.verdict == FAILED


def test_the_further_models_are_part_of_the_case_digest(tmp_path):
    assert _case(tmp_path / "a").sha256() != _case(tmp_path / "b", second_scale="0.125").sha256()


def test_an_unknown_model_name_is_a_suite_error(tmp_path):
    case = _case(tmp_path, name="missing")
    with pytest.raises(SuiteError, match="no model named 'missing'"):
        case.other_model_bytes("missing")
    assert "no model named" in run_case(case, ReferenceAdapter()).message


def test_models_must_be_texts(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "cases").mkdir(parents=True)
    text = CASE.format(first=MODEL.format(scale="0.5"), second="", name="b")
    (corpus / "cases" / "bad.toml").write_text(text.replace("models = { b = ''''''", "models = { b = 3"))
    with pytest.raises(SuiteError, match="models is a table of model texts"):
        load_cases(str(corpus))
