"""A certificate is earned, authenticated and checked without trusting the bundle.

Attacks tried here, each as an honest-looking run or an edited bundle: a run over one case, one level,
one profile or one shard; a run over only the cases a faulty runtime passes; a bundle trimmed of its
failures or with failures flipped to passes and every digest recomputed; a bundle signed by an untrusted
key; forged shards merged; a bundle naming a command to run on rerun; and bundle files pointing at
devices, FIFOs, links and paths outside the bundle, or holding malformed JSON.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conformance import attestation, bundle, certificate, reports
from conformance.adapters.reference import ReferenceAdapter
from conformance.cases import load_cases
from conformance.cli import main
from conformance.execute import PASSED, Result
from conformance.runner import RunInfo

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROFILES = sorted({case.profile for case in load_cases()})


class OffByOneInt8(ReferenceAdapter):
    """Decodes every floating-point value one too high: fails the value-comparing decode cases."""

    def decode(self, model_bytes, value_name, base_dir):
        values = super().decode(model_bytes, value_name, base_dir)
        return values + np.asarray(1, dtype=values.dtype) if values.dtype.kind == "f" else values


def _run(directory: pathlib.Path, *extra: str) -> int:
    return main(["run", "--quiet", "--report-dir", str(directory), *extra])


def _manifest(directory: pathlib.Path) -> dict:
    return json.loads((directory / bundle.MANIFEST).read_text())


def _rewrite_manifest(directory: pathlib.Path, change) -> None:
    """Edit a manifest and recompute its own digest, as anyone holding the files can."""
    manifest = _manifest(directory)
    manifest.pop("manifest_sha256")
    change(manifest)
    manifest["manifest_sha256"] = bundle._digest(bundle._canonical(manifest))
    (directory / bundle.MANIFEST).write_text(json.dumps(manifest))


def _rewrite_results(directory: pathlib.Path, change) -> None:
    """Rewrite the whole report and manifest from edited results: every digest is consistent again."""
    recorded = json.loads((directory / "results.json").read_text())
    results = change([Result(**entry) for entry in recorded["results"]])
    info = RunInfo(**recorded["run"])
    shutil.rmtree(directory / "cases")
    reports.write_all(directory, results, info, recorded["problems"])
    bundle.write(directory, results, info, _manifest(directory)["waivers"])


def _verify(capsys, directory: pathlib.Path, *options: str) -> tuple[int, str]:
    capsys.readouterr()
    status = main(["verify-bundle", str(directory), *options])
    captured = capsys.readouterr()
    return status, captured.out + captured.err


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, pathlib.Path]:
    root = tmp_path_factory.mktemp("keys")
    attestation.generate_key(root / "vendor.pem", root / "vendor.pub.pem")
    attestation.generate_key(root / "other.pem", root / "other.pub.pem")
    return {"private": root / "vendor.pem", "public": root / "vendor.pub.pem",
            "other": root / "other.pem", "other_public": root / "other.pub.pem"}


@pytest.fixture
def full(reference_report) -> pathlib.Path:
    """A full reference run: every case of the corpus (shared: tests copy it before altering it)."""
    return reference_report


@pytest.fixture(scope="module")
def faulty(tmp_path_factory) -> pathlib.Path:
    """A full run of a runtime that fails some affine cases."""
    directory = tmp_path_factory.mktemp("faulty") / "report"
    assert _run(directory, "-j", "2", "--adapter", "tests.test_certificate:OffByOneInt8") == 1
    return directory


@pytest.fixture
def copy(tmp_path):
    def make(directory: pathlib.Path) -> pathlib.Path:
        return pathlib.Path(shutil.copytree(directory, tmp_path / f"copy-{directory.parent.name}"))
    return make


# ------------------------------------------------------------------------------------ what certifies
def test_a_full_reference_run_certifies_every_profile(full):
    assert len(PROFILES) == 12
    assert _manifest(full)["profiles"] == {profile: certificate.CERTIFIED for profile in PROFILES}
    assert _manifest(full)["selection"]["full"] is True


@pytest.mark.parametrize("selection", [
    ["--cases", "Required.Affine.Storage.Int8PerTensor"],
    ["--profile", "decode-e2e"],
    ["--level", "Required", "--cases", "Required.Affine", "--cases", "Required.External"],
    ["--shard", "1/40"],
], ids=["one-case", "one-profile", "one-level", "one-shard"])
def test_a_partial_run_certifies_nothing(tmp_path, capsys, selection):
    assert _run(tmp_path / "r", *selection) == 0
    statuses = _manifest(tmp_path / "r")["profiles"]
    assert not [p for p, status in statuses.items() if status in certificate.EARNED], statuses
    assert set(statuses.values()) <= {certificate.PARTIAL, certificate.NOT_RUN}
    status, text = _verify(capsys, tmp_path / "r", "--integrity-only")
    assert status == 0 and "certified: none" in text


def test_an_honest_run_over_only_the_passing_cases_does_not_certify(faulty, tmp_path):
    recorded = json.loads((faulty / "results.json").read_text())["results"]
    failing = {r["id"] for r in recorded if r["verdict"] != PASSED}
    assert failing and all(case_id.split(".")[1] for case_id in failing)
    passing = [r["id"] for r in recorded if r["profile"] == "affine" and r["verdict"] == PASSED]
    assert _run(tmp_path / "r", *[arg for case_id in passing for arg in ("--cases", case_id)]) == 0
    assert _manifest(tmp_path / "r")["profiles"]["affine"] == certificate.PARTIAL
    assert _manifest(faulty)["profiles"]["affine"] == certificate.NOT_CERTIFIED


def test_statuses_follow_the_corpus_not_the_runs_list():
    cases = [c for c in load_cases() if c.profile == "decode-e2e"]
    entries = [{"id": c.id, "verdict": PASSED, "level": c.level, "profile": c.profile, "expected_failure": False}
               for c in cases]
    assert certificate.profile_statuses(entries, cases, ["decode-e2e"], True) == {"decode-e2e": "certified"}
    assert certificate.profile_statuses(entries[:-1], cases, ["decode-e2e"], True) == {"decode-e2e": "partial"}
    assert certificate.profile_statuses(entries + entries[-1:], cases, ["decode-e2e"], True) == {
        "decode-e2e": "partial"}  # a case listed twice
    assert certificate.profile_statuses(entries, cases, ["decode-e2e"], False) == {"decode-e2e": "partial"}
    crashed = [{**entries[0], "verdict": "crashed"}] + entries[1:]
    assert certificate.profile_statuses(crashed, cases, ["decode-e2e"], True) == {"decode-e2e": "not certified"}


# ---------------------------------------------------------------------------------- authenticity
def test_a_signed_bundle_verifies_under_its_key_only(full, copy, keys, capsys):
    signed = copy(full)
    assert main(["sign", str(signed), "--key", str(keys["private"])]) == 0
    envelope = json.loads((signed / attestation.ENVELOPE).read_text())
    statement = json.loads(__import__("base64").b64decode(envelope["payload"]))
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == attestation.PREDICATE_TYPE
    assert {s["name"] for s in statement["subject"]} == {"manifest.json", *bundle.REPORT_FILES}
    assert statement["predicate"]["profiles"] == _manifest(full)["profiles"]
    status, text = _verify(capsys, signed, "--trusted-key", str(keys["public"]))
    assert status == 0 and "signature by trusted key" in text
    status, text = _verify(capsys, signed, "--trusted-key", str(keys["other_public"]))
    assert status == 1 and "no signature by a trusted key" in text


def test_verification_without_key_or_rerun_is_refused(full, capsys):
    status, text = _verify(capsys, full)
    assert status == 2 and "--trusted-key" in text and "--integrity-only" in text


def test_flipped_verdicts_with_recomputed_digests_do_not_verify(faulty, copy, keys, capsys):
    forged = copy(faulty)
    assert main(["sign", str(forged), "--key", str(keys["private"])]) == 0
    envelope = (forged / attestation.ENVELOPE).read_text()
    _rewrite_results(forged, lambda results: [_passed(r) for r in results])
    assert _manifest(forged)["profiles"]["affine"] == certificate.CERTIFIED
    (forged / attestation.ENVELOPE).write_text(envelope)  # the vendor's genuine signature, kept
    status, text = _verify(capsys, forged, "--trusted-key", str(keys["public"]))
    assert status == 1 and "is not the file that was signed" in text
    # the forger's own signature is not one the certifier trusts
    assert main(["sign", str(forged), "--key", str(keys["other"])]) == 0
    status, text = _verify(capsys, forged, "--trusted-key", str(keys["public"]))
    assert status == 1 and "no signature by a trusted key" in text
    # and a rerun on the certifier's build of the runtime shows the flips
    status, text = _verify(capsys, forged, "--rerun", "--adapter", "tests.test_certificate:OffByOneInt8")
    assert status == 1 and "the rerun gives 'failed'" in text and "profile affine" in text


def _passed(result: Result) -> Result:
    result.verdict, result.message, result.expected_failure = PASSED, "passed", False
    return result


def test_a_trimmed_bundle_does_not_verify(faulty, copy, keys, capsys):
    trimmed = copy(faulty)
    _rewrite_results(trimmed, lambda results: [r for r in results if r.verdict == PASSED])
    manifest = _manifest(trimmed)
    assert manifest["profiles"]["affine"] == certificate.PARTIAL  # the honest writer certifies nothing
    _rewrite_manifest(trimmed, lambda m: m["profiles"].update(affine="certified"))
    status, text = _verify(capsys, trimmed, "--integrity-only")
    assert status == 1 and "profile affine: the bundle says 'certified'" in text and "coverage:" in text
    status, text = _verify(capsys, trimmed, "--rerun", "--adapter", "reference")
    assert status == 1


def test_rerun_runs_only_the_runtime_the_verifier_names(full, tmp_path, capsys):
    marker = tmp_path / "ran"
    planted = tmp_path / "planted.py"
    planted.write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('imported')\nADAPTER = None\n")
    for n, identity in enumerate((f"testee:sh -c 'touch {marker}'", f"{planted}:ADAPTER")):
        target = pathlib.Path(shutil.copytree(full, tmp_path / f"named-{n}"))
        _rewrite_manifest(target, lambda m, identity=identity: m["adapter"].update(identity=identity))
        status, text = _verify(capsys, target, "--rerun")
        assert status == 2 and "--adapter NAME or --testee COMMAND" in text
        status, text = _verify(capsys, target, "--rerun", "--adapter", "reference", "--trusted-key", str(planted))
        assert status == 2  # the planted file is not a key
        jobs = ("-j", "2") if n else ()  # a rerun in worker processes judges the same
        status, text = _verify(capsys, target, "--rerun", "--adapter", "reference", *jobs)
        assert status == 0, text
        assert not marker.exists()


# ------------------------------------------------------------------------------------------- shards
@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> list[pathlib.Path]:
    root = tmp_path_factory.mktemp("shards")
    for index in (1, 2, 3):
        assert _run(root / f"s{index}", "--shard", f"{index}/3") == 0
    return [root / f"s{index}" for index in (1, 2, 3)]


def test_merged_shards_of_the_whole_corpus_certify_and_one_shard_does_not(shards, tmp_path, capsys, keys):
    assert not [s for s in _manifest(shards[0])["profiles"].values() if s in certificate.EARNED]
    out = tmp_path / "merged"
    assert main(["merge", *map(str, shards), "--report-dir", str(out)]) == 0
    merged = _manifest(out)
    assert merged["profiles"] == {profile: certificate.CERTIFIED for profile in PROFILES}
    assert merged["selection"]["shards_authenticated"] is False
    assert main(["merge", *map(str, shards), "--report-dir", str(tmp_path / "m2"), "--trusted-key",
                 str(keys["public"])]) == 2  # unsigned shards, a trusted key asked for
    signed = [pathlib.Path(shutil.copytree(s, tmp_path / f"signed-{s.name}")) for s in shards]
    for shard in signed:
        assert main(["sign", str(shard), "--key", str(keys["private"])]) == 0
    assert main(["merge", *map(str, signed), "--report-dir", str(tmp_path / "m3"), "--trusted-key",
                 str(keys["public"])]) == 0
    assert _manifest(tmp_path / "m3")["selection"]["shards_authenticated"] is True


def test_forged_shards_merge_only_into_a_bundle_that_does_not_authenticate(shards, tmp_path, capsys, keys):
    forged = [pathlib.Path(shutil.copytree(s, tmp_path / f"f-{s.name}")) for s in shards]
    for shard in forged:
        assert main(["sign", str(shard), "--key", str(keys["private"])]) == 0
        envelope = (shard / attestation.ENVELOPE).read_text()
        _rewrite_results(shard, lambda results: [_flip(r) for r in results])
        (shard / attestation.ENVELOPE).write_text(envelope)  # the genuine signature of the honest shard
    assert main(["merge", *map(str, forged), "--report-dir", str(tmp_path / "m"), "--trusted-key",
                 str(keys["public"])]) == 2
    assert "not the file that was signed" in capsys.readouterr().out


def _flip(result: Result) -> Result:
    if result.profile == "decode-e2e":
        result.verdict = "failed"
    return result


# ------------------------------------------------------------------------------- hostile bundles
def _hostile(tmp_path: pathlib.Path, full: pathlib.Path) -> pathlib.Path:
    target = tmp_path / "hostile"
    shutil.copytree(full, target)
    return target


def _list_file(name):
    def change(manifest):
        if isinstance(name, str):
            manifest["files"][name] = "0" * 64
        else:
            manifest["files"]["results.json"] = name
    return change


@pytest.mark.parametrize("name", ["../../etc/hostname", "/etc/hostname", "cases/../../x", "a\nb", "", 7, None])
def test_files_outside_the_bundle_are_never_opened(full, tmp_path, capsys, name):
    target = _hostile(tmp_path, full)
    _rewrite_manifest(target, _list_file(name))
    status, text = _verify(capsys, target, "--integrity-only")
    assert status == 2 and len(text.strip().splitlines()) == 1 and "Traceback" not in text


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "symlink-out", "directory"])
def test_special_files_in_a_bundle_are_refused_without_reading(full, tmp_path, capsys, kind):
    target = _hostile(tmp_path, full)
    for name in ("results.json", bundle.MANIFEST):
        victim = target / name
        victim.unlink()
        if kind == "dev-zero":
            victim.symlink_to("/dev/zero")
        elif kind == "fifo":
            os.mkfifo(victim)
        elif kind == "symlink-out":
            victim.symlink_to("/etc/hostname")
        else:
            victim.mkdir()
        status, text = _verify(capsys, target, "--integrity-only")
        assert status in (1, 2) and "Traceback" not in text
        if name == bundle.MANIFEST:
            assert status == 2 and len(text.strip().splitlines()) == 1
        else:
            assert "results.json" in text
        shutil.rmtree(target)
        shutil.copytree(full, target)


@pytest.mark.parametrize("content", [
    b"[]", b"null", b"\xff\xfe", b"{" * 100_000, b"[" * 100_000 + b"]" * 100_000, b'{"format": ' + b"9" * 5000 + b"}",
    b'{"format": 2, "suite": [], "spec": {}}', b'{"format": true}', b"NaN", b'{"a": Infinity}',
])
def test_malformed_manifests_are_one_line_errors(full, tmp_path, capsys, content):
    target = _hostile(tmp_path, full)
    (target / bundle.MANIFEST).write_bytes(content)
    status, text = _verify(capsys, target, "--integrity-only")
    assert status == 2 and len(text.strip().splitlines()) == 1 and "Traceback" not in text, text


@pytest.mark.parametrize("change", [
    lambda m: m.update(cases=[{"id": 1}]),
    lambda m: m["cases"][0].update(expected_failure="yes"),
    lambda m: m.update(waivers=["x"]),
    lambda m: m["selection"].update(cases="Required"),
    lambda m: m.update(profiles={"affine": ["certified"]}),
])
def test_manifests_of_the_wrong_shape_are_one_line_errors(full, tmp_path, capsys, change):
    target = _hostile(tmp_path, full)
    _rewrite_manifest(target, change)
    status, text = _verify(capsys, target, "--integrity-only")
    assert status == 2 and len(text.strip().splitlines()) == 1 and "Traceback" not in text, text


def test_a_waiver_the_manifest_does_not_list_is_refused(faulty, copy, capsys):
    target = copy(faulty)

    def waive(manifest):
        for entry in manifest["cases"]:
            if entry["verdict"] == "failed":
                entry["expected_failure"] = True
                entry["level"] = "Recommended"
    _rewrite_manifest(target, waive)
    status, text = _verify(capsys, target, "--integrity-only")
    assert status == 1 and "waived by no listed waiver" in text and "recorded as Recommended" in text


def test_verify_bundle_from_the_command_line_is_one_line_on_a_missing_bundle(tmp_path):
    done = subprocess.run([sys.executable, "-m", "conformance", "verify-bundle", str(tmp_path / "none"),
                           "--integrity-only"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and not done.stdout


# ------------------------------------------------------------------------------------------- summary
def test_the_summary_shows_each_profiles_status_and_what_blocks_it(tmp_path):
    pytest.importorskip("onnxruntime")
    assert _run(tmp_path / "r", "--adapter", "onnxruntime", "--profile", "state") == 1
    summary = (tmp_path / "r" / "summary.md").read_text()
    assert "### Certification" in summary and "| state | not certified |" in summary
    assert "A partial run" in summary
    listed = summary.split("### Not supported in a claimed profile", 1)[1].split("\n### ", 1)[0]
    assert "`Required.State.Concurrency.SecondRunRejected` (state; needs STATE-NO-CONCURRENCY" in listed


def test_runtime_messages_are_inert_in_the_summary():
    from conformance.reports import markdown

    hostile = "x | y <script>alert(1)</script> [click](javascript:alert(1)) `code`\n### injected heading"
    result = Result("Required.Affine.Storage.Int8PerTensor", "failed", message=hostile, profile="affine",
                    level="Required")
    text = markdown([result], RunInfo(adapter={"name": "t", "profiles": ["affine"]}), statuses={"affine": "x"})
    line = next(line for line in text.splitlines() if line.startswith("- `Required.Affine.Storage.Int8PerTensor`"))
    assert "<script>" not in line and "\\[click\\]" in line and " | y" not in line
    assert "\n### injected" not in text
