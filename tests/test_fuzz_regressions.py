"""Every promoted fuzz finding, replayed: target inputs under corpus/regressions/<target>/ must no longer
raise a finding, and oracle cases under corpus/regressions/oracle/ must get their expected verdict.

Findings whose oracle issue is still open are strict xfails: the test fails as soon as the oracle is
fixed, which is the signal to mark the regression fixed and drop the entry from fuzz/known_issues.py.
"""

from __future__ import annotations

import json
import pathlib

import pytest

from fuzz.cases import FuzzCase, run_case
from fuzz.invariants import Finding, Limits, guarded
from fuzz.targets import TARGETS, load

ROOT = pathlib.Path(__file__).resolve().parents[1] / "corpus" / "regressions"
LIMITS = Limits(time_budget=10.0, hang_after=1.0, memory_budget_mb=2048)


def _mark(meta: dict):
    if meta.get("status") == "open":
        reason = f"open oracle issue {meta.get('known_issue')}: {meta.get('note') or meta.get('detail')}"
        return [pytest.mark.xfail(strict=True, reason=reason)]
    return []


def _target_inputs():
    for target in TARGETS:
        for meta_path in sorted((ROOT / target).glob("*.json")):
            meta = json.loads(meta_path.read_text())
            yield pytest.param(target, meta_path.with_suffix(".bin"), meta, id=f"{target}/{meta['id']}",
                               marks=_mark(meta))


def _oracle_cases():
    for path in sorted((ROOT / "oracle").glob("*.json")):
        record = json.loads(path.read_text())
        yield pytest.param(record, id=record["name"], marks=_mark(record))


@pytest.mark.parametrize("target,path,meta", list(_target_inputs()))
def test_promoted_input_no_longer_finds_anything(target, path, meta):
    data = path.read_bytes()
    try:
        guarded(lambda: load(target).one_input(data), LIMITS, "regression")
    except Finding as finding:
        pytest.fail(f"{finding.signature}: {finding.detail}")


@pytest.mark.parametrize("record", list(_oracle_cases()))
def test_oracle_regression_gets_the_contract_verdict(record):
    case = FuzzCase.from_json(json.dumps(record["case"]))
    try:
        verdict, outputs = guarded(lambda: run_case(case), LIMITS, record["name"])
    except Finding as finding:
        pytest.fail(f"{finding.kind}: {finding.detail}")
    assert verdict.code == case.expected, f"{case.rule}: expected {case.expected or 'accept'}, got {verdict}"
    fields = outputs.get(case.name, {})
    for path, wanted in record.get("fields_hex", {}).items():
        assert fields[path].tobytes().hex() == wanted, f"field {path}: {fields[path]!r}"


def test_open_regressions_are_known_issues():
    """Every open regression names an entry of fuzz/known_issues.py (and the reverse)."""
    from fuzz.known_issues import ISSUES

    named = set()
    for path in list(ROOT.glob("*/*.json")):
        meta = json.loads(path.read_text())
        if meta.get("status") == "open":
            assert meta.get("known_issue") in ISSUES, path
            named.add(meta["known_issue"])
    assert named == set(ISSUES)
