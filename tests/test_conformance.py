"""The conformance framework itself: catalogue integrity, the runner, reports, failure lists,
certification bundles, the testee protocol and the pytest plugin."""

from __future__ import annotations

import copy
import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conformance import bundle, failure_list
from conformance.adapters import NotSupported, load_adapter
from conformance.adapters.reference import ReferenceAdapter
from conformance.cases import load_cases, select
from conformance.clause_table import coverage, uncovered
from conformance.execute import FAILED, NOT_SUPPORTED, PASSED, run_case
from conformance.runner import RunConfig, run, summary_line
from reference_impl.clauses import CLAUSES
from reference_impl.errors import ErrorCode

ROOT = pathlib.Path(__file__).resolve().parents[1]
CASES = load_cases()
SAMPLE = ["Required.Affine.Storage", "Required.Catalogue.Identity", "Recommended.External.PathSafety",
          "Required.State.Feedback", "Required.ZeroCopy.Retain", "Required.Export.Rename", "Required.KV.Contiguous",
          "Recommended.Wire.UnknownFields", "Required.Structured.Fields", "Required.State.Concurrency"]


def _cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "conformance", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


# ---------------------------------------------------------------------------------- the catalogue
def test_catalogue_size_and_ids():
    assert len(CASES) >= 300
    for case in CASES:
        level, area, topic, *rest = case.id.split(".")
        assert level in ("Required", "Recommended") and area and topic and rest


def test_every_clause_has_a_case_and_every_case_a_known_clause():
    assert uncovered(CASES) == []
    assert set(coverage(CASES)) == set(CLAUSES)


def test_expected_errors_are_stable_codes():
    codes = {code.value for code in ErrorCode}
    for case in CASES:
        wanted = [case.expect.get("error")] + list(case.expect.get("also", []))
        for step in case.steps:
            wanted += [step.get("error")] + list(step.get("also", []))
        assert {w for w in wanted if w} <= codes, case.id


def test_case_digests_are_stable():
    case = CASES[0]
    assert case.sha256() == case.sha256() and len(case.sha256()) == 64


def test_expectations_say_where_they_come_from():
    sources = {case.expectation_source for case in CASES}
    assert "oracle" not in sources  # no expectation is recorded from the oracle's own output
    assert {"hand", "spec", "numpy", "onnx-reference"} <= sources


# ------------------------------------------------------------------------------------ execution
@pytest.mark.parametrize("pattern", SAMPLE)
def test_reference_passes_sample_in_process(pattern):
    adapter = ReferenceAdapter()
    results = [run_case(case, adapter) for case in select(CASES, [pattern])]
    assert results and all(r.verdict == PASSED for r in results), [(r.id, r.message) for r in results
                                                                    if r.verdict != PASSED]


def test_adapter_exception_is_a_failure_with_traceback():
    class Broken(ReferenceAdapter):
        def verify(self, model_bytes, base_dir):
            raise ZeroDivisionError("vendor bug")

    case = select(CASES, ["Required.Catalogue.Accepts.EmptyCatalogue"])[0]
    result = run_case(case, Broken())
    assert result.verdict == FAILED
    assert "ZeroDivisionError" in result.message and "vendor bug" in result.traceback


def test_not_supported_is_its_own_verdict():
    class Partial(ReferenceAdapter):
        def profiles(self):
            return {"affine"}

        def verify(self, model_bytes, base_dir):
            raise NotSupported("no verifier")

    cases = select(CASES, ["Required.Affine.Storage.Int8PerTensor", "Required.Affine.Storage.Int4PaddingNonzero",
                           "Required.Catalogue.Identity.TypeIdZero"])
    verdicts = {r.id: r.verdict for r in (run_case(c, Partial()) for c in cases)}
    assert verdicts == {"Required.Affine.Storage.Int8PerTensor": PASSED,
                        "Required.Affine.Storage.Int4PaddingNonzero": NOT_SUPPORTED,
                        "Required.Catalogue.Identity.TypeIdZero": NOT_SUPPORTED}


def test_selection_and_shards_partition_the_catalogue():
    shards = [select(CASES, shard=(i, 3)) for i in (1, 2, 3)]
    assert sum(len(s) for s in shards) == len(CASES)
    assert {c.id for s in shards for c in s} == {c.id for c in CASES}
    assert all(c.level == "Recommended" for c in select(CASES, level="Recommended"))
    assert {c.profile for c in select(CASES, profiles={"affine"})} == {"affine"}


def test_adapter_from_file_path(tmp_path):
    path = tmp_path / "my_adapter.py"
    path.write_text("from conformance.adapters.reference import ReferenceAdapter\n"
                    "class Mine(ReferenceAdapter):\n    name = 'mine'\n")
    adapter = load_adapter(f"{path}:Mine")
    assert adapter.name == "mine"


# --------------------------------------------------------------------------- the full CLI run
def test_full_run_writes_reports_and_a_bundle_that_verifies(reference_report, tmp_path):
    report = pathlib.Path(shutil.copytree(reference_report, tmp_path / "report"))  # altered below
    output = reference_report.with_name(reference_report.name + ".out").read_text()
    last = output.strip().splitlines()[-1]
    assert last == f"{len(CASES)} passed, 0 failed, 0 not supported, 0 expected failures"
    payload = json.loads((report / "results.json").read_text())
    assert len(payload["results"]) == len(CASES)
    assert len(list((report / "cases").glob("*.json"))) == len(CASES)
    assert (report / "junit.xml").read_text().count("<testcase") == len(CASES)
    assert "| Profile |" in (report / "summary.md").read_text()
    manifest = json.loads((report / "manifest.json").read_text())
    assert set(manifest["profiles"].values()) == {"certified"}
    assert bundle.check(report)[1] == []
    # tampering with a verdict, a report file or the manifest is detected
    manifest["cases"][0]["verdict"] = "failed"
    (report / "manifest.json").write_text(json.dumps(manifest))
    assert any("manifest_sha256" in p for p in bundle.check(report)[1])
    check = _cli("verify-bundle", str(report), "--integrity-only")
    assert check.returncode == 1


def test_failure_list_hygiene(tmp_path):
    class WrongInt8(ReferenceAdapter):
        def decode(self, model_bytes, value_name, base_dir):
            return super().decode(model_bytes, value_name, base_dir) + np.float32(1)

    cases = select(CASES, ["Required.Affine.Storage.Int8PerTensor", "Required.Affine.Storage.Int2FourPerByte"])
    results, _ = run(cases, RunConfig(progress=False), adapter=WrongInt8())
    assert [r.verdict for r in results] == [FAILED, FAILED]
    listing = tmp_path / "failures.txt"
    assert failure_list.write(listing, results) == 2
    entries = failure_list.read(listing)
    assert failure_list.apply(entries, results, [c.id for c in CASES]) == []
    assert summary_line(results) == "0 passed, 0 failed, 0 not supported, 2 expected failures"
    # stale entries, now-passing cases and changed messages are all problems
    listing.write_text("Required.No.Such.Case  # x\n"
                       "Required.Affine.Storage.Int8PerTensor  # a message that no longer appears\n"
                       "Required.Affine.Storage.Int2FourPerByte\n")
    fresh, _ = run(cases, RunConfig(progress=False), adapter=WrongInt8())
    problems = failure_list.apply(failure_list.read(listing), fresh, [c.id for c in CASES])
    assert any("matches no case" in p for p in problems)
    assert any("different message" in p for p in problems)
    passing, _ = run(cases, RunConfig(progress=False), adapter=ReferenceAdapter())
    assert any("now passes" in p for p in failure_list.apply(failure_list.read(listing), passing,
                                                              [c.id for c in CASES]))


def test_cli_prints_update_command_for_a_stale_list(tmp_path):
    listing = tmp_path / "failures.txt"
    listing.write_text("Required.Affine.Storage.Int8PerTensor  # stale\n")
    done = _cli("run", "--cases", "Required.Affine.Storage.Int8PerTensor", "--failure-list", str(listing),
                "--report-dir", str(tmp_path / "r"), "--quiet")
    assert done.returncode == 1
    assert "now passes" in done.stderr  # --quiet: failure-list problems on stderr, the summary alone on stdout
    assert "--update-failure-list" in done.stderr


def test_list_show_explain_and_clauses():
    assert "Required.Affine.Storage.Int8PerTensor" in _cli("list").stdout
    shown = _cli("show", "Required.Affine.Storage.Int4LowNibbleFirst").stdout
    assert "AFF-PACKING" in shown and "0x21" in shown
    explained = _cli("explain", "Required.Affine.Storage.Int4LowNibbleFirst")
    assert explained.returncode == 0 and "passed" in explained.stdout
    clauses = _cli("clauses")
    from conformance.clause_table import CASE_KINDS

    needing = sum(clause.kind in CASE_KINDS for clause in CLAUSES.values())
    assert clauses.returncode == 0 and f"{needing} of {needing} clauses covered" in clauses.stdout


# ------------------------------------------------------------------------------- testee protocol
def test_protocol_matches_the_proto_file(tmp_path):
    grpc_tools = pytest.importorskip("grpc_tools.protoc")
    from google.protobuf import descriptor_pb2

    from conformance.protocol import file_descriptor

    out = tmp_path / "testee.pb"
    code = grpc_tools.main(["protoc", f"-I{ROOT}", f"--descriptor_set_out={out}", "conformance/testee.proto"])
    assert code == 0
    compiled = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    ours = file_descriptor()
    assert [m.name for m in compiled.message_type] == [m.name for m in ours.message_type]
    for theirs, mine in zip(compiled.message_type, ours.message_type):
        key = lambda f: (f.name, f.number, f.type, f.label, f.type_name, f.HasField("oneof_index"))
        assert [key(f) for f in theirs.field] == [key(f) for f in mine.field], theirs.name


def test_sample_through_the_reference_testee():
    adapter = load_adapter(testee=f"{sys.executable} -m conformance.testee")
    try:
        cases = select(CASES, SAMPLE + ["Required.State.Concurrency", "Required.ZeroCopy.Ownership"])
        results = [run_case(case, adapter) for case in cases]
    finally:
        adapter.shutdown()
    assert all(r.verdict == PASSED for r in results), [(r.id, r.message) for r in results if r.verdict != PASSED]


CRASHY = '''
import os, sys
from conformance.adapters.reference import ReferenceAdapter
class Crashy(ReferenceAdapter):
    def verify(self, model_bytes, base_dir):
        if b"hang" in model_bytes:
            import time; time.sleep(300)
        if b"crash" in model_bytes:
            os._exit(3)
        return super().verify(model_bytes, base_dir)
'''


def test_crashed_or_hung_testee_fails_the_case_and_the_run_goes_on(tmp_path):
    (tmp_path / "crashy.py").write_text(CRASHY)
    command = f"{sys.executable} -m conformance.testee --adapter {tmp_path / 'crashy.py'}:Crashy"
    adapter = load_adapter(testee=command, timeout=30.0)  # generous: a loaded CI machine starts slowly
    try:
        good = select(CASES, ["Required.Catalogue.Accepts.EmptyCatalogue"])[0]
        # copies: the cached cases are shared with other tests, and a run caches each case's bound model
        crash = _fresh_copy(select(CASES, ["Required.Catalogue.Accepts.SpecCatalogue"])[0])
        assert run_case(good, adapter).verdict == PASSED
        crash.model_bytes()
        crash._built = (crash.model_bytes() + b"\x12\x05crash", {}, {})  # producer_name = "crash"
        result = run_case(crash, adapter)
        assert result.verdict == FAILED and "restarted" in result.message
        assert run_case(good, adapter).verdict == PASSED
        hang = _fresh_copy(select(CASES, ["Required.Catalogue.Accepts.DiamondIsNotACycle"])[0])
        hang._built = (hang.model_bytes() + b"\x12\x04hang", {}, {})
        adapter.timeout = 3.0  # the testee is up (the good case answered): a hang needs no generous wait
        result = run_case(hang, adapter)
        adapter.timeout = 30.0
        assert result.verdict == FAILED and "did not answer" in result.message
        assert run_case(good, adapter).verdict == PASSED
    finally:
        adapter.shutdown()


def _fresh_copy(case):
    """A copy of a case with nothing cached (its built and bound model), for a test to alter."""
    fresh = copy.copy(case)
    fresh.__dict__.pop("_bound", None)
    fresh._built = None
    return fresh


# ---------------------------------------------------------------------------------- pytest plugin
def test_pytest_plugin_runs_cases_as_items():
    # The plugin is registered through the package's pytest11 entry point (pyproject.toml).
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--conformance-adapter=reference", "--conformance-only",
                           "--conformance-cases", "Required.Affine.Axis", "tests/test_affine.py"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:]
    count = len(select(CASES, ["Required.Affine.Axis"]))
    assert f"{count} passed" in done.stdout


def test_byte_string_tensors_cross_the_testee_protocol_unchanged():
    """ONNX strings are bytes: they travel as byte_strings, not as their Python repr."""
    from conformance import protocol

    for array in (np.array([b"A", b"\xff\x00"], dtype=object), np.array([b"ab", b"c"])):
        message = protocol.MESSAGES["Value"]()
        protocol.to_proto(array, message)
        assert message.tensor.dtype == "bytes"
        back = protocol.from_proto(message)
        assert back.tolist() == [bytes(x) for x in array.tolist()]
    text = np.array(["x", "yz"])
    message = protocol.MESSAGES["Value"]()
    protocol.to_proto(text, message)
    assert message.tensor.dtype == "str" and protocol.from_proto(message).tolist() == ["x", "yz"]


def test_uint64_literals_beyond_int64_keep_every_bit():
    """A list mixing values above and below 2**63 would otherwise pass through float64."""
    from conformance.values import build

    values = [2**64 - 1, 2**63 + 1, 5, 0]
    array = build({"dtype": "uint64", "shape": [4], "data": values})
    assert array.dtype == np.uint64 and [int(v) for v in array] == values


def test_an_encoded_literal_is_a_new_message_and_payload_on_every_build():
    """Encoded literals are parsed from text once, yet each build hands out its own header and writable
    payload: a runtime editing one call's value never changes the next call's."""
    from conformance.values import build

    literal = {"encoded": 'struct_type { type_ref: 2001 } raw_data: "\\001\\002"'}
    first, second = build(literal), build(literal)
    assert first.header is not second.header and first.payload is not second.payload
    first.header.struct_type.type_ref = 7
    first.payload[0] = 9
    assert second.header.struct_type.type_ref == 2001 and second.payload.tolist() == [1, 2]
    assert not second.header.HasField("raw_data") and build(literal).payload.tolist() == [1, 2]
