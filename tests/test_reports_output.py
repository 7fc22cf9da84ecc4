"""What a run shows: ``run --quiet`` prints the summary line alone (the report directory keeps the rest),
and JUnit keeps the suite's own outcomes apart: "not supported" is skipped with its reason, and "passed
without code" is a pass marked by a property and a message."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from conformance.adapters import NotSupported, Rejected
from conformance.adapters.reference import ReferenceAdapter
from conformance.cli import main
from conformance.execute import NOT_SUPPORTED, PASSED_WITHOUT_CODE

WRONG = "Required.Affine.Storage.Int8PerTensor"  # decoded wrong: a failure
UNCODED = "Required.Catalogue.Identity.TypeIdZero"  # rejected without a code: passed without code
REFUSED = "Required.Affine.Storage.Int4LowNibbleFirst"  # answered "not supported"
SELECTION = ["--cases", WRONG, "--cases", UNCODED, "--cases", REFUSED]


class Mixed(ReferenceAdapter):
    """The reference with one wrong decode, one refused decode and rejections without codes."""

    def classify(self, exc):
        found = super().classify(exc)
        return Rejected(None, found.message) if isinstance(found, Rejected) else found

    def decode(self, model_bytes, value_name, base_dir):
        values = super().decode(model_bytes, value_name, base_dir)
        if values[-1] == -4:  # Int4LowNibbleFirst's values end in -4, Int8PerTensor's in 63.5
            raise NotSupported("packed four-bit codes are not implemented here")
        return values + 1


def _run(tmp_path, *extra):
    return main(["run", "--adapter", "tests.test_reports_output:Mixed", "--report-dir", str(tmp_path / "r"),
                 "--no-isolation", *SELECTION, *extra])


def _verdicts(tmp_path) -> dict[str, str]:
    results = json.loads((tmp_path / "r" / "results.json").read_text())["results"]
    return {r["id"]: r["verdict"] for r in results}


def test_quiet_prints_the_summary_line_and_nothing_else(tmp_path, capsys):
    assert _run(tmp_path, "--quiet") == 1
    out, err = capsys.readouterr()
    assert out == "0 passed, 1 failed, 1 not supported, 0 expected failures, 1 passed without code\n"
    assert err == ""
    assert _verdicts(tmp_path) == {WRONG: "failed", UNCODED: PASSED_WITHOUT_CODE, REFUSED: NOT_SUPPORTED}
    assert WRONG in (tmp_path / "r" / "summary.md").read_text()


def test_without_quiet_the_failures_and_certification_are_shown(tmp_path, capsys):
    assert _run(tmp_path) == 1
    out = capsys.readouterr().out
    assert f"FAILED {WRONG}:" in out and "certification:" in out and "report:" in out
    assert out.splitlines()[-1] == "0 passed, 1 failed, 1 not supported, 0 expected failures, 1 passed without code"


def test_quiet_sends_failure_list_problems_to_stderr(tmp_path, capsys):
    listing = tmp_path / "failures.txt"
    listing.write_text(f"{UNCODED}  # no longer fails\n{WRONG}\n")
    assert _run(tmp_path, "--quiet", "--failure-list", str(listing)) == 1
    out, err = capsys.readouterr()
    assert out == "0 passed, 0 failed, 1 not supported, 1 expected failures, 1 passed without code\n"
    assert f"FAILURE LIST: line 1: {UNCODED} is listed as failing but now passes" in err
    assert "--update-failure-list" in err


def test_junit_skips_not_supported_with_its_reason_and_marks_passed_without_code(tmp_path, capsys):
    _run(tmp_path, "--quiet")
    cases = {c.get("name"): c for c in ET.fromstring((tmp_path / "r" / "junit.xml").read_bytes()).iter("testcase")}
    skipped = cases[REFUSED].find("skipped")
    assert skipped is not None and skipped.get("message") == ("not supported: packed four-bit codes are not "
                                                              "implemented here")
    uncoded = cases[UNCODED]
    assert uncoded.find("skipped") is None and uncoded.find("failure") is None
    assert [(p.get("name"), p.get("value")) for p in uncoded.iter("property")] == [("verdict", PASSED_WITHOUT_CODE)]
    assert uncoded.find("system-out").text.startswith(f"{PASSED_WITHOUT_CODE}: passed, but a rejection carried no")
    assert cases[WRONG].find("failure") is not None
