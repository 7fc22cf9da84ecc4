"""The audit: a fault for every checkable clause, patches that stay inside the fault's calls, scoping
that never changes a kill, faults served through the testee, and a gate that fails on survivors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conformance.audit import audit, catalogue, report, scope
from conformance.audit.audit import Audit, FaultOutcome
from conformance.audit.fault import INSTALLER, Fault, wrap
from conformance.audit.faults.catalogue import LastDuplicateWins, ResolvesReferencesLazily
from conformance.cases import load_cases, select
from reference_impl import ContractError, records, structs, verify_model
from reference_impl.clauses import CLAUSES

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # a faulty runtime's arithmetic may overflow

FAULTS = catalogue.faults()
COMMITTED = json.loads(report.COMMITTED.read_text())


def test_patches_of_lazily_exported_names_are_undone():
    """The package root resolves ``read_fields`` from its submodule on each read: a fault patching the
    submodule's function (and, through alias expansion, the package's name) must leave both as they
    were, or every later fault in the worker runs with its bug."""
    import importlib

    import reference_impl
    from conformance.audit.faults.structured import NestedConstantsNotExposed

    decode = importlib.import_module("reference_impl.decode")
    original = decode.read_fields
    with NestedConstantsNotExposed().injected():
        assert decode.read_fields is not original and reference_impl.read_fields is not original
    assert decode.read_fields is original and reference_impl.read_fields is original
    assert "read_fields" not in vars(reference_impl)


def test_a_module_loaded_after_a_patch_was_expanded_is_patched_too():
    """The aliases of a patched function are remembered between calls, but a module imported since holding the
    same function is found: the cache is keyed by the number of loaded modules and the original itself."""
    import sys
    import types

    from conformance.audit.fault import Patch

    patch = Patch(structs, "check_struct", lambda *args, **kwargs: None)
    before = {id(p.target) for p in patch.expand()}
    late = types.ModuleType("reference_impl._loaded_late")
    late.check_struct = structs.check_struct
    sys.modules[late.__name__] = late
    try:
        after = {id(p.target) for p in patch.expand()}
    finally:
        del sys.modules[late.__name__]
    assert id(late) not in before and after == before | {id(late)}


def test_every_checkable_clause_has_a_fault_and_no_other_kind_does():
    covered = {clause for cls in FAULTS for clause in cls.clauses}
    assert [cid for cid in catalogue.checkable_clauses() if cid not in covered] == []
    assert all(CLAUSES[cid].kind in catalogue.CHECKABLE_KINDS for cid in covered)


def test_fault_ids_are_stable_and_documented():
    ids = [cls.fault_id for cls in FAULTS]
    assert len(ids) == len(set(ids))
    assert set(catalogue.SAMPLE) <= set(ids), sorted(set(catalogue.SAMPLE) - set(ids))
    assert all(cls.fault_id.startswith(cls.clauses[0] + ".") and cls.__doc__.strip() for cls in FAULTS)


def test_every_patch_names_what_the_oracle_has_today():
    """A fault patching a function the oracle renamed or removed would crash the audit."""
    for cls in FAULTS:
        for patch in cls().patches():
            for concrete in patch.expand():
                concrete._get()  # raises AttributeError (KeyError for a table) when the oracle has no such name


def test_committed_kill_matrix_is_the_catalogue():
    """Adding, renaming or re-aiming a fault without rerunning ``audit --write`` fails here."""
    committed = {f["id"]: (f["adapter"], f["clauses"], f["pending"], f["testee_blind"]) for f in COMMITTED["faults"]}
    current = {cls.fault_id: (catalogue.adapter_spec(cls), list(cls.clauses), cls.pending, cls.testee_blind)
               for cls in FAULTS}
    assert committed == current


def test_committed_kill_matrix_names_existing_cases_and_catches_every_scored_fault():
    ids = {case.id for case in load_cases()}
    named = {case for f in COMMITTED["faults"] for case in f["caught_by"]}
    assert named <= ids, sorted(named - ids)
    assert all(f["caught_by"] for f in COMMITTED["faults"] if not f["pending"])
    assert not any(f["caught_by"] for f in COMMITTED["faults"] if f["pending"])


def test_patches_apply_only_during_the_faults_calls():
    original = structs.check_struct
    case = select(load_cases(), ["Required.Catalogue.Identity.UnresolvedFieldRef"])[0]
    fault = ResolvesReferencesLazily()
    fault.verify(case.model_bytes(), None)  # accepted: the lazy runtime does not resolve the reference
    assert structs.check_struct is original and INSTALLER.idle
    with pytest.raises(ContractError, match="TYPE_REF_UNRESOLVED"):
        verify_model(case.model_bytes())


@pytest.fixture(scope="module")
def traced():
    """Every case but the slow ones (paged KV, concurrency), with the reference's trace of each."""
    cases = [c for c in load_cases() if c.profile != "kv-paged" and "Concurrency" not in c.id]
    return cases, scope.trace(cases)


#: Faults of different seams: a patched checker, a patched reader, a prepare that edits the model, a state
#: feed, an export and a round trip.
SCOPING_SAMPLE = ("CAT-ID-UNIQUE.last-declaration-wins", "ENC-BIT-ORDER.big-endian-scalars",
                  "CAT-ID-CHANGE.constants-not-checked", "ZC-TRANSPORT.field-transport-copies",
                  "STATE-FEEDS.missing-feeds-zero-filled", "EXP-STANDARD.lowered-feedback-reversed",
                  "WIRE-ROUNDTRIP.external-location-marker-dropped")


def test_scoping_never_changes_a_kill(traced):
    """The cases each fault is scoped to catch exactly what running every case catches (one run of each
    kind over the whole sample, so the reference runs twice, not twice per fault)."""
    cases, traces = traced
    classes = [next(c for c in FAULTS if c.fault_id == fault_id) for fault_id in SCOPING_SAMPLE]
    scoped = scope.cases_for(classes, cases, traces)
    assert all(len(scoped[fault_id]) < len(cases) for fault_id in SCOPING_SAMPLE)
    full = audit.run(classes, cases, progress=False, complete=False)
    narrowed = audit.run(classes, cases, progress=False, cases_for=scoped, complete=False)
    for every, some in zip(full.outcomes, narrowed.outcomes):
        assert every.caught_by == some.caught_by != [], every.fault_id


def test_scoping_in_workers_only_widens_a_faults_cases():
    """Split over worker processes, each fault keeps at least the cases one process scopes it to, in order."""
    cases = [c for c in load_cases() if c.profile != "kv-paged" and "Concurrency" not in c.id][::7]
    classes = [next(c for c in FAULTS if c.fault_id == fault_id) for fault_id in SCOPING_SAMPLE]
    alone = scope.cases_for(classes, cases, scope.trace(cases))
    split = scope.scoped_cases(classes, cases, jobs=2)
    order = {case.id: index for index, case in enumerate(cases)}
    for fault_id in SCOPING_SAMPLE:
        assert set(alone[fault_id]) <= set(split[fault_id]), fault_id
        assert split[fault_id] == sorted(split[fault_id], key=order.__getitem__), fault_id


def test_a_fault_is_caught_through_the_testee():
    cases = select(load_cases(), ["Required.Catalogue.Identity.Duplicate*", "Required.Catalogue.Accepts"])
    result = audit.run([LastDuplicateWins], cases, progress=False, testee=f"{sys.executable} -m conformance.testee",
                       complete=False)
    assert result.outcomes[0].caught_by == ["Required.Catalogue.Identity.DuplicateIdenticalDeclaration",
                                            "Required.Catalogue.Identity.DuplicateTypeId"]
    assert not result.reference_failures and not result.problems()


def _matrix(fault_id: str, caught_by: list[str]) -> dict:
    cls = next(c for c in FAULTS if c.fault_id == fault_id)
    return {"faults": [{"id": fault_id, "adapter": catalogue.adapter_spec(cls), "clauses": list(cls.clauses),
                        "pending": cls.pending, "testee_blind": cls.testee_blind, "boundary": cls.boundary,
                        "caught_by": caught_by, "incidental": []}]}


def test_checking_the_committed_claims_fails_exactly_where_a_whole_run_fails():
    """``audit --check --claims`` runs a fault only on the cases the matrix names: an honest matrix passes, a
    forged catcher or a catcher that went missing from the corpus fails, as in a whole run; a fault the
    matrix does not know is run on its whole scope."""
    cases = select(load_cases(), ["Required.Catalogue.Identity.Duplicate*", "Required.Catalogue.Accepts"])
    fault_id = LastDuplicateWins.fault_id
    catchers = ["Required.Catalogue.Identity.DuplicateIdenticalDeclaration",
                "Required.Catalogue.Identity.DuplicateTypeId"]
    forged, removed = "Required.Catalogue.Accepts", "Required.Catalogue.Identity.Removed"
    whole = audit.run([LastDuplicateWins], cases, progress=False, complete=False).to_json()
    for claimed, lost in ((catchers, []), (catchers + [forged], [forged]), (catchers + [removed], [removed])):
        committed = _matrix(fault_id, claimed)
        chosen = scope.claimed_cases(committed, [LastDuplicateWins], cases, lambda unclaimed: pytest.fail(unclaimed))
        assert chosen == {fault_id: [case.id for case in cases if case.id in claimed]}
        narrowed = audit.run([LastDuplicateWins], cases, progress=False, cases_for=chosen, complete=False).to_json()
        problems = report.stale(committed, narrowed)[0]
        assert problems == report.stale(committed, whole)[0]
        assert problems == ([f"{fault_id} is no longer caught by {', '.join(lost)}"] if lost else [])
    unknown = scope.claimed_cases({"faults": []}, [LastDuplicateWins], cases,
                                  lambda unclaimed: {cls.fault_id: ["scoped"] for cls in unclaimed})
    assert unknown == {fault_id: ["scoped"]}


def _outcome(fault_id, caught_by=(), pending=""):
    return FaultOutcome(fault_id, "m:C", (fault_id.split(".")[0],), False, pending, caught_by=list(caught_by))


def test_the_gate_fails_on_survivors_stale_pending_notes_and_reference_failures():
    survivor = Audit([_outcome("CAT-ID-UNIQUE.x")], ["c"], {}, complete=False)
    assert any("survives" in p for p in survivor.problems())
    stale = Audit([_outcome("CAT-ID-UNIQUE.x", ["c"], pending="needs a case")], ["c"], {}, complete=False)
    assert any("pending" in p for p in stale.problems())
    assert Audit([_outcome("CAT-ID-UNIQUE.x", [], pending="needs a case")], ["c"], {}, complete=False).problems() == []
    broken = Audit([], ["c"], {"c": "failed"}, complete=False)
    assert broken.problems() == ["the reference fails c: failed"]
    assert any("has no fault" in p for p in Audit([_outcome("CAT-ID-UNIQUE.x", ["c"])], ["c"], {}).problems())


def _aligned_loads_by_dataclass_replace(original):
    """A fault's slip: ``dataclasses.replace`` on a leaf, which is a named tuple, raises TypeError."""
    import dataclasses

    def read_leaf(payload, record_bits, leaf):
        if leaf.width == 64 and leaf.offset % 64:
            leaf = dataclasses.replace(leaf, offset=leaf.offset - leaf.offset % 64)
        return original(payload, record_bits, leaf)
    return read_leaf


class SlippedAlignedLoads(Fault):
    """Reads 64-bit fields with an aligned load, written with a slip that makes the fault itself crash."""

    fault_id = "ENC-UNALIGNED.slipped-aligned-loads"
    clauses = ("ENC-UNALIGNED",)

    def patches(self):
        return [wrap(records, "read_leaf", _aligned_loads_by_dataclass_replace)]


def test_a_fault_crashing_in_its_own_code_is_a_defect_not_a_catch():
    """A case failing because the fault's code raised (here a library misused by the fault) proves nothing
    about the suite: such failures are not catches, and the gate names the fault to fix."""
    cases = select(load_cases(), ["Required.Structured.Fields.UnalignedInt64"], None, None, None)
    result = audit.run([SlippedAlignedLoads], cases, progress=False, complete=False)
    outcome = result.outcomes[0]
    assert outcome.crashed == ["Required.Structured.Fields.UnalignedInt64"] and outcome.caught_by == []
    assert any("crashed in its own code" in problem and "TypeError" in problem for problem in result.problems())


@pytest.mark.parametrize(("message", "frames", "crashed"), [
    ("unclassified TypeError: x", ["conformance/execute.py", "conformance/audit/faults/encoding.py",
                                   "/usr/lib/python3.11/dataclasses.py"], True),
    # the oracle given the bug's input
    ("unclassified ValueError: x", ["conformance/audit/faults/encoding.py", "reference_impl/records.py",
                                    "/usr/lib/python3/dist-packages/numpy/core/x.py"], False),
    ("unclassified MemoryError: x", ["conformance/audit/faults/limits.py"], False),  # raised on purpose
    ("expected X, got Y", ["conformance/audit/faults/encoding.py"], False),  # a classified failure
])
def test_only_an_exception_from_the_faults_own_code_is_its_crash(message, frames, crashed):
    root = audit._AUDIT.parents[1]  # where conformance/ and reference_impl/ are (a checkout or site-packages)
    text = "Traceback (most recent call last):\n" + "".join(
        f'  File "{path if path.startswith("/") else root / path}", line 1, in f\n    pass\n' for path in frames)
    assert audit.crashed_in_fault(message, text) is crashed


def test_audit_command_writes_the_kill_matrix_and_gates(tmp_path):
    command = [sys.executable, "-m", "conformance", "audit", "--quiet",
               "--faults", "CAT-ID-UNIQUE.last-declaration-wins", "--out", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    matrix = json.loads((tmp_path / "kill-matrix.json").read_text())
    assert [f["id"] for f in matrix["faults"]] == ["CAT-ID-UNIQUE.last-declaration-wins"]
    assert "1 of 1 faults caught (100.0%)" in done.stdout
    assert "Mutation score" in (tmp_path / "summary.md").read_text()
    refused = subprocess.run(command[:-2] + ["--write"], capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2  # a partial run never overwrites the committed matrix


def test_a_stale_kill_matrix_is_a_false_claim_not_an_omission():
    entry = {"id": "CAT-ID-UNIQUE.x", "adapter": "m:C", "clauses": ["CAT-ID-UNIQUE"], "pending": "",
             "testee_blind": "", "boundary": False, "caught_by": ["c1", "c2"]}
    committed = {"faults": [entry]}
    assert report.stale(committed, {"faults": [{**entry, "caught_by": ["c1", "c2", "c3"]}]}) == (
        [], ["CAT-ID-UNIQUE.x is now also caught by c3"])
    problems, _ = report.stale(committed, {"faults": [{**entry, "caught_by": ["c1"]}]})
    assert problems == ["CAT-ID-UNIQUE.x is no longer caught by c2"]
    problems, _ = report.stale(committed, {"faults": [{**entry, "pending": "needs a case"}]})
    assert problems == ["CAT-ID-UNIQUE.x: pending changed"]


def test_a_fault_patching_a_lazily_exported_function_leaves_the_package_root_as_it_was():
    """The package root answers a name it does not hold with its submodule's current attribute: once the
    fault's calls end, it must again hold nothing and answer with the restored original."""
    import reference_impl
    from conformance.audit.faults.bindings import StringsCheckedOnInputSideOnly
    from reference_impl import bindings

    original = bindings.validate_bindings
    case = select(load_cases(), ["Required.Bindings.OutputStrings.MapOfStructsWithStringField"])[0]
    from conformance.execute import run_case
    assert run_case(case, StringsCheckedOnInputSideOnly()).verdict == "failed"
    assert "validate_bindings" not in vars(reference_impl)
    assert bindings.validate_bindings is original
    assert reference_impl.validate_bindings is original


def _by_own_clause(matrix: dict) -> tuple[list[str], dict[str, list[str]]]:
    """From a kill matrix: the faults that only cases of other clauses fail (incidental-only), and the faults
    caught, through their own clauses, by Recommended cases only, with those cases. A catch counts only
    where the case cites one of the fault's clauses, whichever way the matrix recorded it."""
    clauses_of = {case.id: set(case.clauses) for case in load_cases()}
    incidental, recommended = [], {}
    for fault in matrix["faults"]:
        failing = fault["caught_by"] + fault.get("incidental", [])
        own = [c for c in failing if clauses_of.get(c, set()) & set(fault["clauses"])]
        if failing and not own:
            incidental.append(fault["id"])
        elif own and not any(c.startswith("Required.") for c in own):
            recommended[fault["id"]] = own
    return incidental, recommended


def test_every_fault_is_caught_through_its_own_clauses():
    """No fault counts as caught only because a case of another clause trips over it."""
    incidental, _ = _by_own_clause(COMMITTED)
    assert incidental == []


def test_every_fault_caught_only_by_recommended_cases_is_justified():
    """docs/audit/recommended-only.md lists exactly the faults only Recommended cases catch, each with its
    catching cases and a reason in the spec's own (verbatim, double-quoted) words or their absence."""
    import re

    from conformance import spec

    document = report.ROOT / "docs" / "audit" / "recommended-only.md"
    rows = {}
    for line in document.read_text().splitlines():
        if match := re.match(r"\| `([A-Z0-9-]+\.[a-z0-9-]+)` \|", line):
            rows[match.group(1)] = [cell.strip() for cell in line.strip("|").split("|")]
    _, recommended = _by_own_clause(COMMITTED)
    assert sorted(rows) == sorted(recommended)
    for fault_id, (_, clauses, cases, why) in rows.items():
        assert all(f"`{case}`" in cases for case in recommended[fault_id]), fault_id
        assert clauses.replace("`", "").split(", ") == next(
            f["clauses"] for f in COMMITTED["faults"] if f["id"] == fault_id)
        quotes = re.findall(r'"([^"]+)"', why)
        assert quotes or why.startswith("No spec sentence."), fault_id
        assert all(spec.quoted(quote) for quote in quotes), (fault_id, [q for q in quotes if not spec.quoted(q)])


def test_a_spec_naming_a_retired_fault_module_finds_the_fault_in_its_area():
    from conformance.adapters import SuiteError, load_adapter

    adapter = load_adapter("conformance.audit.faults_zero_copy:InitialValuesCopied")
    assert type(adapter).__module__ == "conformance.audit.faults.zero_copy"
    assert adapter.fault_id == "ZC-RETAIN.initial-values-copied"
    with pytest.raises(SuiteError, match="names no fault"):
        load_adapter("conformance.audit.faults_state:Patch")
    name = _a_fault_class("external_ownership")  # its module was faults/payload.py
    moved = load_adapter(f"conformance.audit.faults.payload:{name}")
    assert type(moved).__module__ == "conformance.audit.faults.external_ownership"


def _a_fault_class(module: str) -> str:
    return next(cls.__name__ for cls in FAULTS if cls.__module__ == f"conformance.audit.faults.{module}")


def test_through_the_testee_in_process_only_cases_are_left_out():
    """The measured profile cannot be observed through the protocol: the reference behind the testee is not
    failed by it, and no fault is judged by it."""
    cases = select(load_cases(), ["Required.Catalogue.Accepts.EmptyCatalogue", "Recommended.ZeroCopy.Measured.*"])
    assert any(case.profile == "measured" for case in cases)
    result = audit.run([LastDuplicateWins], cases, progress=False, testee=f"{sys.executable} -m conformance.testee",
                       complete=False)
    assert not result.reference_failures and result.case_ids == ["Required.Catalogue.Accepts.EmptyCatalogue"]
