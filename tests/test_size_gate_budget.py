"""The budget file: spec figures, derived limits, the loader's checks, and the gate's verdicts."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest

from size_gate import (
    SizeGateError,
    delta_findings,
    evaluate,
    load_budget,
    measure_path,
    needed_allowed,
    passed,
)
from size_gate.budget import DEFAULT_BUDGET, parse_size, soname_family

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures" / "elf"
SPEC_NAME = "custom-quantized-persistent-values.txt"
GATED = ("installed_bytes", "text_bytes", "defined_symbols")


def _kib(text) -> int:
    """'32 KiB' -> 32768 and 8 -> 8, computed here independently of size_gate's parser."""
    if isinstance(text, int):
        return text
    number, unit = text.split()
    assert unit == "KiB"
    return int(number) * 1024


def _raw() -> dict:
    with open(DEFAULT_BUDGET, "rb") as f:
        return tomllib.load(f)


def _spec_text() -> str | None:
    for base in (REPO.parent / "shared", REPO / "shared", Path("/work/shared")):
        path = base / "spec" / SPEC_NAME
        if path.exists():
            return path.read_text(encoding="utf-8")
    return None


def _ints(*groups: str) -> tuple[int, ...]:
    words = {"eight": 8}
    return tuple(words[g] if g in words else int(g.replace(",", "")) for g in groups)


# -- the figures in the TOML ----------------------------------------------------------------------
@pytest.mark.clause("SIZE-PR04-ALLOWANCE", "SIZE-ORT-ALLOWANCE")
def test_pr04_ci_limits_are_post_ort_limits_plus_allowance():
    stages = _raw()["stages"]
    assert stages["PR04"]["base"] == "ORT"
    for key in GATED:
        derived = stages["ORT"]["limits"][key] + _kib(stages["PR04"]["allowance"][key])
        assert stages["PR04"]["limits"][key] == derived, key


@pytest.mark.clause("SIZE-PR02-ALLOWANCE")
def test_pr02_maxima_are_pr01_baseline_plus_allowance():
    raw = _raw()
    for key in GATED:
        assert raw["stages"]["PR02"]["limits"][key] == raw["baseline"][key] + _kib(
            raw["stages"]["PR02"]["allowance"][key]), key


def test_loaded_budget_agrees_with_raw_arithmetic():
    budget = load_budget()
    raw = _raw()["stages"]
    assert budget.default_stage == "PR04"
    for key in GATED:
        assert budget.stage("PR04").limits[key] == raw["ORT"]["limits"][key] + _kib(raw["PR04"]["allowance"][key])
        assert budget.stage("PR04").allowance[key] == _kib(raw["PR04"]["allowance"][key])


def test_project_ceiling_and_pr02_relation():
    budget = load_budget()
    assert budget.ceiling["installed_bytes"] == (12 * 1024 * 1024) // 10  # 1.2 MiB in whole bytes
    assert budget.stage("PR02").limits["installed_bytes"] < budget.ceiling["installed_bytes"]
    assert budget.stage("PR04").within_ceiling is False  # post-ORT limits lie above 1.2 MiB


@pytest.mark.clause("SIZE-BASELINE")
def test_figures_match_the_spec_text():
    spec = _spec_text()
    if spec is None:
        pytest.skip("spec text not available next to the repository")
    raw = _raw()
    flat = re.sub(r"\s+", " ", spec)
    ci = _ints(*re.search(r"CI limits to ([\d,]+) bytes, ([\d,]+) bytes and (\d+) symbols", flat).groups())
    allowance = re.search(r"PR04 receives a bounded allowance of (\d+) KiB installed, (\d+) KiB of \.text "
                          r"and (\w+) symbols", flat).groups()
    pr04_allowance = (int(allowance[0]) * 1024, int(allowance[1]) * 1024, _ints(allowance[2])[0])
    assert tuple(raw["stages"]["PR04"]["limits"][k] for k in GATED) == ci
    assert tuple(_kib(raw["stages"]["PR04"]["allowance"][k]) for k in GATED) == pr04_allowance
    assert tuple(raw["stages"]["ORT"]["limits"][k] for k in GATED) == tuple(
        c - a for c, a in zip(ci, pr04_allowance))
    rows = {label: re.search(label + r" ([\d,]+) ([\d,]+|Report only)", flat).groups()
            for label in ("Stripped installed bytes", "Allocated section bytes", r"\.text bytes",
                          "Defined dynamic symbols")}
    assert raw["baseline"]["installed_bytes"] == _ints(rows["Stripped installed bytes"][0])[0]
    assert raw["baseline"]["alloc_bytes"] == _ints(rows["Allocated section bytes"][0])[0]
    assert raw["baseline"]["text_bytes"] == _ints(rows[r"\.text bytes"][0])[0]
    assert raw["baseline"]["defined_symbols"] == _ints(rows["Defined dynamic symbols"][0])[0]
    assert raw["stages"]["PR02"]["limits"]["installed_bytes"] == _ints(rows["Stripped installed bytes"][1])[0]
    assert raw["stages"]["PR02"]["limits"]["text_bytes"] == _ints(rows[r"\.text bytes"][1])[0]
    assert raw["stages"]["PR02"]["limits"]["defined_symbols"] == _ints(rows["Defined dynamic symbols"][1])[0]
    pr02 = re.search(r"PR02 may add at most (\d+) KiB of stripped size, (\d+) KiB of \.text and (\d+) dynamic",
                     flat).groups()
    assert tuple(_kib(raw["stages"]["PR02"]["allowance"][k]) for k in GATED) == (
        int(pr02[0]) * 1024, int(pr02[1]) * 1024, int(pr02[2]))
    measured = _ints(*re.search(r"measurement for this implementation is ([\d,]+) installed bytes, ([\d,]+) "
                                r"\.text bytes and (\d+) defined dynamic symbols", flat).groups())
    assert tuple(raw["measurements"]["PR04"][k] for k in GATED) == measured
    assert raw["ceiling"]["installed_bytes"] == re.search(r"existing ([\d.]+ MiB) project ceiling", flat)[1]
    needed = re.search(r"DT_NEEDED (libcrypto[^N]*?) No additions", flat)[1]
    assert raw["dt_needed"]["allowed"] == [e.strip() for e in needed.split(",")]


# -- size figures and the loader -----------------------------------------------------------------------
@pytest.mark.parametrize("text,expected", [
    ("128 KiB", 128 * 1024), ("96KiB", 96 * 1024), ("1.2 MiB", 1258291), ("2 GiB", 2 << 30),
    ("10", 10), ("10 B", 10), (0, 0), (800, 800),
])
def test_parse_size(text, expected):
    assert parse_size(text, "x", "budget.toml") == expected


@pytest.mark.parametrize("value", [-1, True, "12 kB", "1e3", "", 1.5, "-3 KiB"])
def test_parse_size_rejects(value):
    with pytest.raises(SizeGateError) as err:
        parse_size(value, "stages.X.limits.text_bytes", "budget.toml")
    assert err.value.code == "bad-budget" and "stages.X.limits.text_bytes" in err.value.message


def _write_budget(tmp_path: Path, edit) -> Path:
    text = DEFAULT_BUDGET.read_text()
    path = tmp_path / "budget.toml"
    path.write_text(edit(text))
    return path


@pytest.mark.parametrize("old,new,words", [
    ("text_bytes = 970_090", "text_bytes = 970_091", "ORT 953,706 + allowance 16,384 = 970,090"),
    ("defined_symbols = 8 }", 'defined_symbols = "8 KiB" }', "non-negative integer"),
    ('stage = "PR04"', 'stage = "PR09"', "PR09"),
    ('base = "ORT"', 'base = "PR05"', "earlier stage"),
    ("format = 1", "format = 2", "format 1"),
    ("[measurements]", "[measurement]", "unknown top-level keys"),
    ("within_ceiling = true", "within_ceilings = true", "unknown keys"),
    ('installed_bytes = "1.2 MiB"', 'installed_bytes = "1.1 MiB"', "exceeds the ceiling"),
    ('allowed = ["libcrypto"', 'allowed = [3, "libcrypto"', "non-empty strings"),
    ("[library]", "[library", "not valid TOML"),
])
def test_loader_rejects_inconsistent_budgets(tmp_path, old, new, words):
    path = _write_budget(tmp_path, lambda t: t.replace(old, new, 1))
    with pytest.raises(SizeGateError) as err:
        load_budget(path)
    assert err.value.code == "bad-budget" and err.value.path == str(path)
    assert words in err.value.message


def test_loader_derives_a_limit_left_unwritten(tmp_path):
    path = _write_budget(tmp_path, lambda t: t.replace(
        "limits = { installed_bytes = 1_423_320, text_bytes = 970_090, defined_symbols = 800 }", ""))
    stage = load_budget(path).stage("PR04")
    assert stage.limits == {k: load_budget().stage("ORT").limits[k] + stage.allowance[k] for k in GATED}


def test_missing_budget_file(tmp_path):
    with pytest.raises(SizeGateError) as err:
        load_budget(tmp_path / "none.toml")
    assert err.value.code == "not-found"


# -- DT_NEEDED allowlist rule ----------------------------------------------------------------------------
ALLOWED = ("libcrypto", "libstdc++", "libgcc_s", "libc", "ld-linux")


@pytest.mark.parametrize("soname,entry", [
    ("libc.so.6", "libc"), ("libcrypto.so.3", "libcrypto"), ("libcrypto.so.1.1", "libcrypto"),
    ("libstdc++.so.6", "libstdc++"), ("libgcc_s.so.1", "libgcc_s"), ("ld-linux-x86-64.so.2", "ld-linux"),
    ("ld-linux-aarch64.so.1", "ld-linux"), ("ld-linux.so.2", "ld-linux"),
    ("libm.so.6", None), ("libcrypt.so.1", None), ("libc++.so.1", None), ("libssl.so.3", None),
    ("libcrypto3.so", None), ("libpthread.so.0", None), ("ld64.so.2", None), ("libstdc++", "libstdc++"),
])
def test_needed_allowlist_matches_by_family(soname, entry):
    assert needed_allowed(soname, ALLOWED) == entry


def test_soname_family():
    assert [soname_family(s) for s in ("libc.so.6", "ld-linux-x86-64.so.2", "libfoo")] == [
        "libc", "ld-linux-x86-64", "libfoo"]


# -- the gate's verdicts -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lib():
    return measure_path(FIXTURES / "default.so", "*")


def _at(lib, **values):
    return dataclasses.replace(lib, **values)


def test_limits_are_inclusive(lib):
    budget = load_budget()
    stage = budget.stage("PR04")
    at_limit = _at(lib, **stage.limits)
    assert passed(evaluate(at_limit, budget, stage))
    for key in GATED:
        over = _at(at_limit, **{key: stage.limits[key] + 1})
        failures = [f for f in evaluate(over, budget, stage) if f.status == "fail"]
        assert len(failures) == 1 and failures[0].metric == key and failures[0].overshoot == 1
        message = failures[0].message
        assert key in message and f"{stage.limits[key]:,}" in message
        assert f"{stage.limits[key] + 1:,}" in message and "by 1 " in message


@pytest.mark.clause("SIZE-PR04-ALLOWANCE")
def test_spec_pr04_measurement_needs_the_pr04_allowance(lib):
    budget = load_budget()
    measured = _at(lib, **budget.measurements["PR04"])
    assert passed(evaluate(measured, budget, budget.stage("PR04")))
    failing = {f.metric for f in evaluate(measured, budget, budget.stage("ORT")) if f.status == "fail"}
    expected = {k for k in GATED if budget.measurements["PR04"][k] > budget.stage("ORT").limits[k]}
    assert failing == expected == {"text_bytes", "defined_symbols"}


def test_report_only_metrics_are_never_gated(lib):
    budget = load_budget()
    huge = _at(lib, alloc_bytes=10**12, section_bytes_total=10**12)
    findings = evaluate(huge, budget, budget.stage())
    assert passed(findings)
    reported = {f.metric for f in findings if f.status == "report"}
    assert {"alloc_bytes", "section_bytes_total"} <= reported


def test_ceiling_is_gated_only_where_the_stage_applies_it(lib):
    budget = load_budget()
    big = _at(lib, installed_bytes=budget.ceiling["installed_bytes"] + 1)
    pr02 = [f for f in evaluate(big, budget, budget.stage("PR02")) if f.check == "ceiling"]
    pr04 = [f for f in evaluate(big, budget, budget.stage("PR04")) if f.check == "ceiling"]
    assert pr02[0].status == "fail" and pr02[0].overshoot == 1
    assert pr04[0].status == "report"


@pytest.mark.clause("SIZE-PR02-ALLOWANCE", "SIZE-PR04-ALLOWANCE")
def test_needed_outside_allowlist_fails(lib):
    budget = load_budget()
    assert passed(evaluate(lib, budget, budget.stage()))
    extra = _at(lib, needed=lib.needed + ("libm.so.6",))
    failures = [f for f in evaluate(extra, budget, budget.stage()) if f.status == "fail"]
    assert [f.actual for f in failures] == ["libm.so.6"] and "allowlist" in failures[0].message


def test_gated_metric_missing_without_section_headers():
    budget = load_budget()
    noshdr = measure_path(FIXTURES / "default-noshdr.so", "*")
    with pytest.raises(SizeGateError) as err:
        evaluate(noshdr, budget, budget.stage())
    assert err.value.code == "metric-unavailable" and ".text" in err.value.message


@pytest.mark.clause("SIZE-PR02-ALLOWANCE")
def test_deltas_gated_against_pr02_allowance_only(lib):
    budget = load_budget()
    pr02, pr04 = budget.stage("PR02"), budget.stage("PR04")
    base = _at(lib, installed_bytes=1_000_000, text_bytes=700_000, defined_symbols=600)
    ok = _at(base, **{k: base.value(k) + pr02.allowance[k] for k in GATED})
    assert passed(delta_findings(base, ok, pr02))
    over = _at(ok, text_bytes=ok.text_bytes + 1)
    failures = [f for f in delta_findings(base, over, pr02) if f.status == "fail"]
    assert [(f.metric, f.overshoot) for f in failures] == [("text_bytes", 1)]
    assert all(f.status == "report" for f in delta_findings(base, over, pr04))
    added = _at(base, needed=base.needed + ("libz.so.1",))
    failures = [f for f in delta_findings(base, added, pr04) if f.status == "fail"]
    assert [f.actual for f in failures] == ["libz.so.1"]
