"""The campaign machinery: invariants, PNG report, minimization, triage, promotion, known issues, a
smoke campaign, and the differential target finding an injected fault."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from fuzz import plot
from fuzz.invariants import Finding, Limits, guarded, twice
from fuzz.known_issues import known
from fuzz.triage import ddmin, proto_reduce
from reference_impl import ErrorCode
from reference_impl.errors import violation

ROOT = pathlib.Path(__file__).resolve().parents[1]
REGRESSION = ROOT / "corpus" / "regressions" / "verify" / "c1acf6c98134.bin"


_TIMELINE = [{"t": 1.0, "cov": 100, "corpus": 10, "findings": 0}, {"t": 2.0, "cov": 180, "corpus": 14, "findings": 0},
             {"t": 3.0, "cov": 200, "corpus": 15, "findings": 2}, {"t": 4.0, "cov": 210, "corpus": 15, "findings": 3}]


def test_findings_are_marked_when_they_appear():
    assert plot.finding_times(_TIMELINE) == [3.0, 3.0, 4.0]


def test_campaign_chart_labels_its_axes_and_draws_corpus_size_on_a_second_axis():
    figure = plot.coverage_figure(_TIMELINE, "Fuzz campaign: verify (1 job(s))")
    coverage, corpus = figure.axes
    assert coverage.get_shared_x_axes().joined(coverage, corpus) and corpus.yaxis.get_label_position() == "right"
    assert coverage.get_xlabel() == "time since start (s)"
    assert (coverage.get_ylabel(), corpus.get_ylabel()) == ("coverage (edges)", "corpus size (files)")
    assert coverage.get_title() == "Fuzz campaign: verify (1 job(s))"
    legend = [text.get_text() for text in coverage.get_legend().get_texts()]
    assert legend == ["coverage (edges)", "corpus size (files)", "finding (3 in all)"]
    coverage_line, *finding_lines = coverage.get_lines()
    assert list(coverage_line.get_ydata()) == [100, 180, 200, 210]
    assert list(corpus.get_lines()[0].get_ydata()) == [10, 14, 15, 15]
    assert [line.get_xdata()[0] for line in finding_lines] == [3.0, 3.0, 4.0]


def test_campaign_chart_is_a_png_showing_the_series(tmp_path):
    from matplotlib.colors import to_rgb
    from matplotlib.image import imread

    plot.write_plot(tmp_path / "coverage.png", _TIMELINE, "Fuzz campaign: verify")
    pixels = imread(tmp_path / "coverage.png")  # decodes, or raises
    assert pixels.shape == (400, 800, 4)
    for color in (plot.COVERAGE_COLOR, plot.CORPUS_COLOR, plot.FINDING_COLOR):
        assert (np.abs(pixels[..., :3] - to_rgb(color)).max(axis=2) < 0.02).sum() > 50, color


def test_plotting_library_is_imported_only_to_draw():
    code = "import sys, fuzz.campaign; print('matplotlib' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_ddmin_keeps_the_property_and_shrinks():
    data = bytes(range(200)) + b"needle" + bytes(range(100))
    assert ddmin(data, lambda d: b"needle" in d) == b"needle"


def test_proto_reduce_keeps_the_property_and_drops_the_rest():
    from fuzz.cases import FuzzCase, run_case
    from reference_impl import schema

    model = schema.parse_model(REGRESSION.read_bytes())
    for index in range(5):
        model.graph.initializer.add(name=f"dense{index}", data_type=1, dims=[1], float_data=[1.0])
    data = model.SerializeToString()

    def keeps(candidate: bytes) -> bool:
        return run_case(FuzzCase(candidate))[0].code == "EXTERNAL_PATH_INVALID"

    assert keeps(data)
    reduced = proto_reduce(data, keeps)
    assert keeps(reduced)
    assert len(reduced) < len(data) and not schema.parse_model(reduced).graph.initializer


# ------------------------------------------------------------------------------------------ invariants
def test_contract_errors_are_verdicts_and_other_exceptions_findings():
    def rejected():
        raise violation(ErrorCode.TYPE_ID_ZERO, "x", "zero")

    with pytest.raises(Exception) as info:
        guarded(rejected)
    assert not isinstance(info.value, Finding)
    with pytest.raises(Finding) as info:
        guarded(lambda: {}["missing"])
    assert info.value.kind == "unclassified" and "test_fuzz_campaign.py" in info.value.origin


def test_memory_error_and_runaway_time_are_findings():
    def allocate():
        raise MemoryError("too big")

    with pytest.raises(Finding) as info:
        guarded(allocate)
    assert info.value.kind == "memory"

    def spin():
        while True:
            pass

    with pytest.raises(Finding) as info:
        guarded(spin, Limits(time_budget=5, hang_after=0.2))
    assert info.value.kind == "hang" and "spin" in info.value.origin

    def slow():
        total = 0
        for i in range(3_000_000):
            total += i
        return total

    with pytest.raises(Finding) as info:
        guarded(slow, Limits(time_budget=0.01, hang_after=0))
    assert info.value.kind == "slow"


def test_a_different_second_answer_is_a_finding():
    answers = iter([("accept", {}), ("reject", {})])
    with pytest.raises(Finding) as info:
        twice(lambda: next(answers))
    assert info.value.kind == "nondeterministic"


def test_known_issues_match_by_function_and_strict_mode_disables_them(monkeypatch):
    from fuzz import known_issues

    monkeypatch.setattr(known_issues, "_BY_SIGNATURE",
                        {"unclassified|reference_impl/payload.py:check_location": "example-issue"})
    signature = "unclassified|reference_impl/payload.py:999:check_location"
    assert known(signature) == "example-issue"  # line numbers do not matter
    assert known("unclassified|reference_impl/payload.py:51:payload_extent") is None
    monkeypatch.setenv("FUZZ_STRICT", "1")
    assert known(signature) is None


# ---------------------------------------------------------------------------------- targets in process
@pytest.mark.parametrize("target", ["verify", "structured", "differential", "state", "properties", "statediff"])
def test_seeds_run_clean_through_their_target(target):
    from fuzz.targets import load

    module = load(target)
    seeds = sorted((ROOT / "corpus" / "seeds" / target).iterdir())[:15]
    assert seeds
    for path in seeds:
        module.one_input(path.read_bytes())


@pytest.mark.parametrize("target", ["verify", "structured", "differential", "state", "properties", "statediff"])
def test_the_harness_reads_what_to_instrument_through_the_import_system(target):
    from fuzz.harness import _instrument
    from fuzz.targets import load

    assert _instrument(target) == load(target).INSTRUMENT


@pytest.mark.parametrize("target", ["verify", "structured", "differential", "state", "properties", "statediff"])
def test_the_harness_imports_every_module_it_instruments_before_fuzzing(target):
    """Every module file under a target's INSTRUMENT prefixes is imported inside the instrumentation block
    (targets import lazily; a module first imported in ``one_input`` would run uninstrumented). The files
    on disk are the independent list; only command lines and adapters of runtimes not installed here are
    left out."""
    import importlib

    from fuzz.harness import _import_all, _instrument

    imported = set(_import_all(_instrument(target)))
    on_disk = set()
    for prefix in _instrument(target):
        path = ROOT / prefix.replace(".", "/")
        files = path.rglob("*.py") if path.is_dir() else [path.with_suffix(".py")]
        for file in files:
            parts = file.relative_to(ROOT).with_suffix("").parts
            on_disk.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    missing = {name for name in on_disk - imported if not name.endswith("__main__")}
    for name in missing:  # only what cannot be imported here at all (an optional runtime's adapter)
        with pytest.raises(ImportError):
            importlib.import_module(name)


@pytest.mark.parametrize("target", ["verify", "structured", "differential", "state", "properties", "statediff"])
def test_a_dictionary_a_target_names_exists(target):
    from fuzz.targets import load

    dictionary = load(target).DICTIONARY
    assert dictionary is None or (ROOT / "corpus" / "dict" / dictionary).is_file()


def test_a_conformance_case_that_cannot_be_built_is_reported_not_dropped(tmp_path):
    from conformance.adapters import SuiteError
    from fuzz.seedgen import conformance_models

    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "seeds.toml").write_text(
        'profile = "representation"\nop = "verify"\n'
        '[[case]]\nid = "Required.Seeds.Build.Good"\nclause = ["WIRE-FIELDS"]\nmodel_text = "ir_version: 10"\n'
        'expect = {accepted = true}\n'
        '[[case]]\nid = "Required.Seeds.Build.Broken"\nclause = ["WIRE-FIELDS"]\nmodel_text = "ir_version: {"\n'
        'expect = {accepted = true}\n')
    with pytest.raises(SuiteError) as error:
        conformance_models(str(tmp_path))
    assert "1 conformance case(s)" in str(error.value)
    assert "Required.Seeds.Build.Broken" in str(error.value) and "Good" not in str(error.value)
    repaired = tmp_path / "repaired"
    (repaired / "cases").mkdir(parents=True)
    (repaired / "cases" / "seeds.toml").write_text(
        (tmp_path / "cases" / "seeds.toml").read_text().replace("ir_version: {", "ir_version: 9"))
    assert len(conformance_models(str(repaired))) == 2


# ------------------------------------------------------------------------------------- whole pipeline
def _fuzz(*args, env=None, timeout=240):
    environment = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "fuzz", *args], cwd=ROOT, env=environment, timeout=timeout,
                          capture_output=True, text=True)


def test_smoke_campaign_writes_a_report(tmp_path):
    result = _fuzz("run", "verify", "--time", "60", "--runs", "400", "--out", str(tmp_path / "out"),
                   "--corpus", str(tmp_path / "corpus"), "--quiet")
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["executions"] >= 400 and report["coverage_edges"] > 0
    assert report["findings"] == []
    assert (tmp_path / "out" / "coverage.png").read_bytes().startswith(b"\x89PNG")
    assert "executions per second" in (tmp_path / "out" / "report.md").read_text()


def test_differential_target_finds_an_injected_fault(tmp_path):
    """The reference adapter with one injected fault (blocked quantization's partial last block decoded
    with the previous block's scale): a short campaign reports a value disagreement."""
    result = _fuzz("run", "differential", "--time", "120", "--subject", "fuzz.subjects:faulty_reference",
                   "--fault", "blocked-tail-scale", "--stop-on-finding", "--seed", "1",
                   "--out", str(tmp_path / "out"), "--corpus", str(tmp_path / "corpus"), "--quiet")
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["findings"], result.stdout + result.stderr
    log = (tmp_path / "out" / "logs" / "job-0.log").read_text()
    assert "FINDING disagreement" in log and ":decode:values" in log


def test_a_crashing_subprocess_testee_is_a_finding_not_a_dead_fuzzer(tmp_path):
    """The testee aborts (SIGABRT) on INT4 values; the campaign reports it and keeps its own process."""
    testee = f"{sys.executable} -m conformance.testee --adapter fuzz.subjects:faulty_reference"
    _fuzz("run", "differential", "--time", "120", "--testee", testee, "--fault", "native-crash",
          "--stop-on-finding", "--out", str(tmp_path / "out"), "--corpus", str(tmp_path / "corpus"), "--quiet",
          env={"FUZZ_FAULT": "native-crash"})
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["findings"]
    log = (tmp_path / "out" / "logs" / "job-0.log").read_text()
    assert "FINDING testee-crash at testee:reference+native-crash:decode" in log


def _partial_record_stream() -> bytes:
    from fuzz.mutators import MUTATORS
    from fuzz.seedgen import structured_streams

    codes = sorted(MUTATORS, key=lambda c: c.value)
    return structured_streams(0)[codes.index(ErrorCode.PAYLOAD_PARTIAL_RECORD)]


def test_triage_groups_findings_by_signature_and_minimizes(tmp_path):
    """Findings of the differential target against a subject that swaps one error code."""
    faulty = {"FUZZ_SUBJECT": "fuzz.subjects:faulty_reference", "FUZZ_FAULT": "code-swap"}
    findings = tmp_path / "run" / "findings"
    findings.mkdir(parents=True)
    stream = b"\x00" + _partial_record_stream()
    (findings / "crash-a").write_bytes(stream)
    (findings / "crash-b").write_bytes(stream + bytes(40))  # trailing bytes the generator never reads
    result = _fuzz("triage", str(tmp_path / "run"), "--target", "differential", env=faulty)
    groups = json.loads((tmp_path / "run" / "triage.json").read_text())
    assert len(groups) == 1, result.stdout
    assert groups[0]["signature"] == "disagreement|reference+code-swap:verify:code"
    assert sorted(groups[0]["files"]) == ["crash-a", "crash-b"]
    assert groups[0]["size"] < len(stream)  # minimized while the signature holds


def test_promote_writes_a_regression_and_a_loadable_conformance_case(tmp_path):
    from conformance.cases import load_cases

    stream = _partial_record_stream()
    (tmp_path / "finding.bin").write_bytes(stream)
    regressions = tmp_path / "regressions"
    result = _fuzz("promote", str(tmp_path / "finding.bin"), "--target", "structured",
                   "--cases-dir", str(tmp_path / "corpus" / "cases"), env={"FUZZ_REGRESSIONS_DIR": str(regressions)})
    assert result.returncode == 0, result.stderr
    meta = json.loads(next((regressions / "structured").glob("*.json")).read_text())
    assert meta["status"] == "fixed" and meta["expect"] == "PAYLOAD_PARTIAL_RECORD"
    assert (regressions / "structured" / f"{meta['id']}.bin").read_bytes() == stream
    cases = load_cases(str(tmp_path / "corpus"))
    assert [c.expect for c in cases] == [{"error": "PAYLOAD_PARTIAL_RECORD"}]
    assert cases[0].id == f"Required.Encoding.FuzzStructured.F{meta['id']}"
    from conformance.adapters.reference import ReferenceAdapter
    from conformance.execute import run_case

    assert run_case(cases[0], ReferenceAdapter()).verdict == "passed"


def test_protobuf_leniency_is_not_a_disagreement_but_everything_else_is():
    """A subject whose protobuf runtime parses bytes upb refuses (protobuf C++ truncates overlong tag
    varints) is not judged on wire-format leniency, whatever it then finds in the model it parsed; every
    other verdict difference still counts."""
    from fuzz.subjects import Outcome, compare, observe

    parse_error = {"verify": Outcome("reject", "MODEL_PARSE_ERROR")}
    assert compare(parse_error, {"verify": Outcome("ok")}) == []
    assert compare(parse_error, {"verify": Outcome("reject", "TENSOR_DATA_INVALID")}) == []
    assert compare({"verify": Outcome("reject", "TYPE_ID_ZERO")}, {"verify": Outcome("ok")})
    assert compare({"verify": Outcome("ok")}, {"verify": Outcome("reject", "MODEL_PARSE_ERROR")})

    class Lenient:
        name = "lenient"

        def verify(self, model_bytes, base_dir):
            return None

    assert list(observe(Lenient(), b"\x0a\xff", None)) == ["verify"]  # unparsable: no values to read


def test_codes_of_one_clause_agree_and_codes_of_two_clauses_do_not():
    """An extent that overflows is also one no file covers (both PAY-EXTERNAL-EXTENT): a native runtime
    that looks for the file first answered EXTERNAL_FILE_INVALID where the oracle said
    EXTERNAL_EXTENT_OVERFLOW. Codes of different clauses, or codes the contract lacks, still disagree."""
    from fuzz.subjects import Outcome, compare

    def verdicts(oracle, subject):
        return compare({"verify": Outcome("reject", oracle)}, {"verify": Outcome("reject", subject)})

    assert verdicts("EXTERNAL_EXTENT_OVERFLOW", "EXTERNAL_FILE_INVALID") == []
    assert verdicts("TYPE_ID_MISSING", "TYPE_ID_ZERO") == []
    assert verdicts("PAYLOAD_PARTIAL_RECORD", "AFFINE_PAYLOAD_SIZE")
    assert verdicts("TYPE_ID_ZERO", "NOT_A_CODE")


def test_raw_inputs_are_judged_on_verdicts_and_values_but_not_codes():
    """Mutated raw bytes broke two rules at once (an offset past INT64 and a length the affine layout
    does not need): the oracle named one, a native runtime the other, and both are right. Raw inputs
    are judged without codes, structure-aware ones (one broken rule by construction) with them."""
    from fuzz.subjects import Outcome, compare
    from fuzz.targets.differential import is_raw

    oracle = {"verify": Outcome("reject", "EXTERNAL_EXTENT_OVERFLOW")}
    assert compare(oracle, {"verify": Outcome("reject", "AFFINE_PAYLOAD_SIZE")}, codes=False) == []
    assert compare(oracle, {"verify": Outcome("reject", "AFFINE_PAYLOAD_SIZE")}, codes=True)
    assert compare(oracle, {"verify": Outcome("ok")}, codes=False)
    assert compare(oracle, {"verify": Outcome("reject", "MODEL_PARSE_ERROR")}, codes=False)
    decoded = {"verify": Outcome("ok"), "decode:w": Outcome("ok", value=[1.0])}
    assert compare(decoded, {"verify": Outcome("ok"), "decode:w": Outcome("ok", value=[2.0])}, codes=False)
    assert is_raw(b"\x01model") and not is_raw(b"\x00stream") and not is_raw(b"")


class _StrictWireSubject:
    """The reference, behind a parser that refuses every byte string but the canonical encoding (as
    protobuf C++ refuses some unknown groups upb accepts); ``canonical_too`` refuses canonical bytes as
    well, as a broken parser would."""

    def __init__(self, canonical_too: bool = False):
        from conformance.adapters.reference import ReferenceAdapter

        self.inner, self.canonical_too, self.name = ReferenceAdapter(), canonical_too, "strict-wire"

    def verify(self, model_bytes, base_dir):
        from conformance.adapters import Rejected
        from fuzz.subjects import canonical_bytes

        if self.canonical_too or model_bytes != canonical_bytes(model_bytes):
            raise Rejected("MODEL_PARSE_ERROR", "refused")
        return self.inner.verify(model_bytes, base_dir)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_subject_refusing_bytes_upb_accepts_is_judged_on_their_canonical_encoding(monkeypatch):
    """Found by the native example: upb parses a model whose first field is an unknown group, protobuf
    C++ refuses it. The target compares again on the oracle's re-serialization, where both parse and
    agree; a subject that refuses the canonical bytes too is still a finding."""
    from conformance.adapters.reference import ReferenceAdapter
    from fuzz.invariants import Finding
    from fuzz.subjects import canonical_bytes
    from fuzz.targets import differential

    data = bytes.fromhex("0173010" "80a3a0b1209636174616c67756542040a001017c23e0912050a030a017850" "07")
    model = data[1:]
    assert canonical_bytes(model) not in (None, model)
    monkeypatch.setattr(differential, "_ADAPTERS", {"oracle": ReferenceAdapter(), "subject": _StrictWireSubject()})
    differential.one_input(data)
    monkeypatch.setattr(differential, "_ADAPTERS", {"oracle": ReferenceAdapter(),
                                                    "subject": _StrictWireSubject(canonical_too=True)})
    with pytest.raises(Finding, match="MODEL_PARSE_ERROR"):
        differential.one_input(data)


def test_implementation_limits_are_not_disagreements_but_rule_codes_are():
    """The spec leaves nesting depth and resource budgets to the implementation: a subject going deeper
    than the oracle, or stopping earlier with a limit code, is not a finding (a native runtime without
    the oracle's 64-level reference-chain limit was reported as one). A limit code where the other side
    rejected for a rule, or a rule code where the other side accepted, still is."""
    from fuzz.subjects import Outcome, compare

    for code in ("NESTING_TOO_DEEP", "RESOURCE_LIMIT"):
        for op in ("verify", "decode:x"):
            assert compare({op: Outcome("reject", code)}, {op: Outcome("ok", value=1)}) == []
            assert compare({op: Outcome("ok", value=1)}, {op: Outcome("reject", code)}) == []
        assert compare({"verify": Outcome("reject", code)}, {"verify": Outcome("reject", "TYPE_REF_CYCLE")})
        assert compare({"verify": Outcome("reject", "TYPE_REF_CYCLE")}, {"verify": Outcome("reject", code)})
    assert compare({"verify": Outcome("reject", "DECLARATION_NOT_CONCRETE")}, {"verify": Outcome("ok")})


# ---------------------------------------------------------------------------------- campaign outcome
def _failure(report: dict) -> str | None:
    from fuzz.campaign import campaign_failure

    return campaign_failure(report)


def _fake_campaign(tmp_path, monkeypatch, script: str, *options: str) -> dict:
    """A campaign whose job is ``python -c script`` (argv[1]: the findings directory) instead of a fuzzer."""
    from fuzz import campaign
    from fuzz.cli import _parser

    def command(target, args, corpus, findings, remaining, seed):
        return [sys.executable, "-c", script, str(findings)]

    monkeypatch.setattr(campaign, "_command", command)
    args = _parser().parse_args(["run", "verify", "--out", str(tmp_path / "out"), "--corpus",
                                 str(tmp_path / "corpus"), "--quiet", *options])
    return campaign.run_campaign(args)


def test_a_job_that_dies_without_a_finding_fails_the_campaign_with_its_first_error_line(tmp_path, monkeypatch):
    script = ("import sys\nprint('INFO: starting')\nprint('ERROR: The required directory \"fz/corpus\" does not "
              "exist')\nprint('ERROR: a second line')\nsys.exit(1)")
    report = _fake_campaign(tmp_path, monkeypatch, script, "--time", "30")
    assert report["restarts"] == 0 and report["findings"] == []
    assert report["job_failures"] == [{"job": 0, "status": 1,
                                       "error": 'ERROR: The required directory "fz/corpus" does not exist'}]
    assert _failure(report) == ('job 0 died without a finding (exit status 1): ERROR: The required '
                                'directory "fz/corpus" does not exist')
    assert report["seconds"] < 30  # a dead job is not restarted until the time is up


def test_a_python_error_in_a_job_is_reported_by_its_exception_line(tmp_path, monkeypatch):
    report = _fake_campaign(tmp_path, monkeypatch, "import no_such_module_anywhere", "--time", "30")
    assert "ModuleNotFoundError: No module named 'no_such_module_anywhere'" in _failure(report)
    assert "Traceback" not in _failure(report)


def test_a_campaign_of_zero_executions_fails(tmp_path, monkeypatch):
    report = _fake_campaign(tmp_path, monkeypatch, "pass", "--time", "30")
    assert report["executions"] == 0 and report["job_failures"] == []
    assert _failure(report) == "no input was executed: the jobs ended without running a single input"


def test_only_jobs_that_stop_on_a_finding_are_restarted(tmp_path, monkeypatch):
    """libFuzzer's artifact line marks an end on a finding: such a job is restarted and counted as a restart
    after a finding, not as a failure, whatever its exit status."""
    script = ("import pathlib, sys, uuid\npath = pathlib.Path(sys.argv[1]) / f'crash-{uuid.uuid4().hex}'\n"
              "path.write_bytes(b'x')\nprint('#7\\tDONE   cov: 3 ft: 3 corp: 1/1b')\n"
              "print(f'Test unit written to {path}')\nsys.exit(77)")
    report = _fake_campaign(tmp_path, monkeypatch, script, "--time", "5")
    assert report["job_failures"] == [] and report["restarts"] >= 1
    assert len(report["findings"]) == report["restarts"] + 1 and report["executions"] == 7 * len(report["findings"])
    assert _failure(report) is None


def test_a_testee_lending_ownerless_answers_is_judged_afresh_on_every_input(monkeypatch, tmp_path):
    """A testee may answer with ownerless data, which the runner holds until the case ends (at most one frame's
    worth per case). The fuzz targets end a case after each input: otherwise a long campaign piles the answers
    up until the limit refuses one, and reports a testee failure the subject never had. The flood testee
    answers every decode with 32 MiB of ownerless bytes; three inputs exceed the 64 MiB limit."""
    from conformance.adapters import load_adapter
    from conformance.adapters.reference import ReferenceAdapter
    from fuzz.targets import differential
    from reference_impl import affine, dtypes, schema

    model = schema.ModelProto(ir_version=10)
    model.graph.encoded_initializer.append(
        affine.make_affine_value(np.arange(4, dtype=np.float32), dtypes.INT8, np.float32(1), name="w"))
    data = b"\x01" + model.SerializeToString()  # a raw input: one value to decode
    hostile = ROOT / "tests" / "hostile_testee.py"
    subject = load_adapter(None, testee=f"{sys.executable} {hostile} flood 0 {tmp_path / 'mark'}", timeout=60)
    monkeypatch.setattr(differential, "_ADAPTERS", {"oracle": ReferenceAdapter(), "subject": subject})
    try:
        for _ in range(3):
            with pytest.raises(Finding) as found:
                differential.one_input(data)
            assert found.value.kind == "disagreement", found.value
    finally:
        subject.shutdown()
