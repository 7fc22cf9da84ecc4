"""The mutation run's bookkeeping (tests/mutation/triage.py): the committed triage parses, a run that
disagrees with it fails, the nightly shards cover every mutated module and match the workflow's matrix, and
the cases-as-tests module stays out of the ordinary test run."""

from __future__ import annotations

import fnmatch
import pathlib
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "mutation"))

import triage  # noqa: E402

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

NAME = "reference_impl.bits.x_sign_extend__mutmut_3"
OTHER = "reference_impl.kv.paged.xǁPagedCacheǁappend__mutmut_12"


def _triage(*lines: str) -> dict[str, triage.Entry]:
    return triage.parse_triage("# Triage\n\nprose\n" + "\n".join(lines) + "\n")


def test_the_committed_triage_parses_and_names_only_known_cases():
    from conformance.cases import load_cases

    entries = triage.parse_triage(triage.TRIAGE_FILE.read_text(encoding="utf-8"))
    ids = {case.id for case in load_cases()}
    for entry in entries.values():
        assert entry.name.startswith("reference_impl."), entry
        if entry.verdict == triage.KILLED:
            assert entry.case_id in ids, f"{entry.name}: {entry.case_id} is no case"


def test_triage_lines_need_their_reason():
    with pytest.raises(triage.TriageError, match="names its case"):
        _triage(f"- `{NAME}` killed: a new case")
    with pytest.raises(triage.TriageError, match="quotes"):
        _triage(f"- `{NAME}` permitted: messages are free")
    with pytest.raises(triage.TriageError, match="twice"):
        _triage(f"- `{NAME}` missing case: x", f"- `{NAME}` missing case: y")
    with pytest.raises(triage.TriageError, match="VERDICT"):
        _triage(f"- `{NAME}` dead: x")


def test_a_survivor_needs_a_line_and_a_killed_line_must_stay_killed():
    entries = _triage(f"- `{NAME}` killed: `Required.Encoding.Bits.SignExtend` (its sign bit)",
                      f"- `{OTHER}` equivalent: the append is idempotent")
    assert entries[NAME].case_id == "Required.Encoding.Bits.SignExtend"
    assert triage.problems({NAME: "killed", OTHER: "survived"}, entries) == []
    found = triage.problems({NAME: "survived", OTHER: "survived"}, entries)
    assert found == [f"{NAME} survived, but the triage says Required.Encoding.Bits.SignExtend kills it"]
    assert triage.problems({NAME: "killed", OTHER: "killed"}, entries) == [
        f"{OTHER} is killed, but the triage calls it equivalent: remove that line"]
    untriaged = "reference_impl.bits.x_other__mutmut_1"
    assert triage.problems({untriaged: "no tests"}, entries, globs=("reference_impl.bits.*",)) == [
        f"{untriaged} no tests and has no triage line (docs/audit/mutation.md)",
        f"{NAME} is triaged but the run has no such mutant (renamed? stale line)"]


def test_the_score_counts_timeouts_as_kills_and_leaves_out_equivalents():
    entries = _triage(f"- `{OTHER}` permitted: \"a message is free text\"")
    results = {NAME: "timeout", OTHER: "survived", "reference_impl.bits.x_f__mutmut_1": "killed",
               "reference_impl.bits.x_f__mutmut_2": "no tests"}
    figures = triage.score(results, entries)
    assert figures["excused"] == 1
    assert figures["percent"] == round(100 * 2 / 3, 2)


def test_a_mutant_names_its_file():
    assert triage.source_file(NAME) == "reference_impl/bits.py"
    assert triage.source_file(OTHER) == "reference_impl/kv/paged.py"
    assert triage.source_file("reference_impl.kv.x_f__mutmut_1") == "reference_impl/kv/__init__.py"


def test_the_sample_is_deterministic_and_spread():
    lines = [f"- `reference_impl.bits.x_f__mutmut_{n}` killed: `Required.A.B.C`" for n in range(10)]
    entries = _triage(*lines, f"- `{OTHER}` missing case: x")
    picked = triage.sample(entries, 3)
    assert picked == triage.sample(entries, 3) and len(set(picked)) == 3
    assert OTHER not in picked


def _mutated_modules() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mutmut"]
    skipped = config["do_not_mutate"]
    modules = []
    for path in sorted((ROOT / "reference_impl").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if any(fnmatch.fnmatch(relative, pattern) for pattern in skipped):
            continue
        modules.append(relative[:-3].replace("/", "."))
    return modules


def test_every_mutated_module_is_in_exactly_one_shard():
    for module in _mutated_modules():
        # a package root's mutants carry the package's name (reference_impl/kv/__init__.py: reference_impl.kv.x_...)
        name = module.removesuffix(".__init__") + ".x_f__mutmut_1"
        owners = [shard for shard, globs in triage.SHARDS.items() if triage.in_shard(name, globs)]
        assert len(owners) == 1, f"{module}: shards {owners}"


def test_the_nightly_workflow_runs_every_shard():
    workflow = yaml.safe_load((ROOT / "ci" / "mutation-nightly.yml").read_text(encoding="utf-8"))
    assert workflow["jobs"]["shard"]["strategy"]["matrix"]["shard"] == list(triage.SHARDS)


def test_the_cases_module_is_not_collected_by_the_ordinary_run():
    module = ROOT / "tests" / "mutation" / "conformance_cases.py"
    assert module.exists()
    assert not fnmatch.fnmatch(module.name, "test_*.py") and not fnmatch.fnmatch(module.name, "*_test.py")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "python_files" not in config["tool"]["pytest"]["ini_options"]
    assert config["tool"]["mutmut"]["pytest_add_cli_args_test_selection"] == ["tests/mutation/conformance_cases.py"]


def test_every_case_with_an_external_file_is_also_run_with_its_payload_read(monkeypatch):
    """The oracle reaches external bytes by mapping them or by reading them; the harness runs each such case
    both ways, so a mutant of either reader fails a case, and it leaves the process in the mode it found."""
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "mutation"))
    import conformance_cases

    from reference_impl import payload

    with_files = sorted(cid for cid, case in conformance_cases.CASES.items() if case.external_files())
    assert conformance_cases.READ_ACCESS == with_files and "Required.External.Affine.DecodesFromFile" in with_files
    before = payload.external_access()
    conformance_cases.test_case_read_access("Required.External.Affine.DecodesFromFile")
    assert payload.external_access() == before
