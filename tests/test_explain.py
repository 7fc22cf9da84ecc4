"""``python -m conformance explain`` for one-shot cases (verify, decode): the spec's words, the model, the
expected result and what the adapter's call returned or raised, from a run of the case or from a report."""

from __future__ import annotations

from conformance.adapters import Rejected
from conformance.adapters.reference import ReferenceAdapter
from conformance.cli import main

DECODE = "Required.Affine.Storage.Int4LowNibbleFirst"  # codes 0x21 0x8f, scale 0.5: [0.5, 1, -0.5, -4]
VERIFY = "Required.Affine.Storage.Rejects_Float"


class Skewed(ReferenceAdapter):
    """Decodes one too many and accepts every model."""

    def decode(self, model_bytes, value_name, base_dir):
        return super().decode(model_bytes, value_name, base_dir) + 1

    def verify(self, model_bytes, base_dir):
        return None


class Refusing(ReferenceAdapter):
    def verify(self, model_bytes, base_dir):
        raise Rejected("AFFINE_STORAGE_INVALID", "FLOAT is no storage type")


def _explain(capsys, *args) -> tuple[int, str]:
    code = main(["explain", *args])
    return code, capsys.readouterr().out


def test_a_failed_decode_shows_quote_model_expected_and_actual_values(capsys):
    code, out = _explain(capsys, DECODE, "--adapter", "tests.test_explain:Skewed")
    assert code == 1
    assert f"{DECODE}: failed" in out
    assert 'spec says: "Four-bit types pack two codes per byte' in out
    assert "expected: float32[4] [ 0.5,  1. , -0.5, -4. ]" in out
    assert "actual:   decode -> float32[4] [ 1.5,  2. ,  0.5, -3. ]" in out
    assert "model (text format):" in out and 'raw_data: "\\x21\\x8f"' in out


def test_a_verify_case_shows_what_the_call_answered(capsys):
    code, out = _explain(capsys, VERIFY, "--adapter", "tests.test_explain:Skewed")
    assert code == 1
    assert 'spec says: "storage_type is one of INT8, UINT8, INT4, UINT4, INT2 or UINT2."' in out
    assert "expected: rejected with AFFINE_STORAGE_INVALID" in out and "actual:   verify -> accepted" in out
    code, out = _explain(capsys, VERIFY, "--adapter", "tests.test_explain:Refusing")
    assert code == 0
    assert "actual:   verify raised Rejected AFFINE_STORAGE_INVALID: FLOAT is no storage type" in out
    assert "storage_type: 1" in out  # the model's FLOAT storage type, in the model text


def test_explain_reads_the_result_of_a_run(tmp_path, capsys):
    report = tmp_path / "r"
    main(["run", "--adapter", "tests.test_explain:Skewed", "--cases", DECODE, "--quiet", "--no-isolation",
          "--report-dir", str(report)])
    capsys.readouterr()
    code, out = _explain(capsys, DECODE, "--report-dir", str(report))
    assert code == 1
    assert "actual:   float32[4] [ 1.5,  2. ,  0.5, -3. ]" in out and "spec says:" in out and "raw_data:" in out


def test_a_report_without_the_case_is_a_one_line_error(tmp_path, capsys):
    assert main(["explain", DECODE, "--report-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("conformance: ") and err.count("\n") == 1 and "results.json" in err
