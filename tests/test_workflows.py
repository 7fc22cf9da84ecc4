"""The CI workflows under ci/ (and the vendor template copied from them) can be trusted by a certifier:
every action pinned to a commit, no checkout leaving its token behind, the token limited per job, no
expression spliced into a script, and the certification bundle attested by the only job allowed to."""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess

import pytest

yaml = pytest.importorskip("yaml")

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / "ci").glob("*.yml"))
PREDICATE_TYPE = "https://onnx-light.dev/conformance/certificate/v1"
ATTEST_PERMISSIONS = {"id-token", "attestations"}
USES = re.compile(r"^\s*(?:-\s+)?uses:\s*(?P<ref>\S+)(?P<rest>.*)$")
PINNED = re.compile(r"^(?P<action>[\w.-]+/[\w./-]+)@(?P<sha>[0-9a-f]{40})$")
VERSION_COMMENT = re.compile(r"^\s+#\s*(?P<version>v\d+(?:\.\d+){0,2})\s*$")


def _load(path: pathlib.Path) -> dict:
    return yaml.safe_load(path.read_text())


def _steps(workflow: dict):
    for job_id, job in workflow["jobs"].items():
        for step in job.get("steps", []):
            yield job_id, step


def _uses_lines() -> list[tuple[str, str, str]]:
    """(file:line, reference, rest of the line) of every `uses:`; YAML loses the comments, so text."""
    found = []
    for path in WORKFLOWS:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            match = USES.match(line)
            if match:
                found.append((f"{path.name}:{number}", match["ref"], match["rest"]))
    return found


def test_the_workflows_are_valid_yaml_with_jobs():
    assert [p.name for p in WORKFLOWS] == ["conformance.yml", "fuzz-nightly.yml", "mutation-nightly.yml", "native.yml",
                                           "size-gate.yml", "vendor-certify.yml"]
    for path in WORKFLOWS:
        assert _load(path)["jobs"], path.name


def test_every_action_is_pinned_to_a_commit_with_its_version_in_a_comment():
    uses = _uses_lines()
    assert len(uses) >= 30
    for where, ref, rest in uses:
        assert PINNED.match(ref), f"{where}: {ref} is not pinned to a 40-hex commit"
        assert VERSION_COMMENT.match(rest), f"{where}: {ref} has no '# vX.Y.Z' comment"


def test_an_action_has_one_commit_and_one_version_across_the_workflows():
    seen: dict[str, set[tuple[str, str]]] = {}
    for _, ref, rest in _uses_lines():
        pinned = PINNED.match(ref)
        comment = VERSION_COMMENT.match(rest)
        if pinned and comment:
            repository = "/".join(pinned["action"].split("/")[:2])  # actions/cache/save -> actions/cache
            seen.setdefault(repository, set()).add((pinned["sha"], comment["version"]))
    assert seen and all(len(pins) == 1 for pins in seen.values()), seen


def test_every_checkout_drops_its_credentials():
    checkouts = 0
    for path in WORKFLOWS:
        for job_id, step in _steps(_load(path)):
            if step.get("uses", "").startswith("actions/checkout@"):
                checkouts += 1
                assert step.get("with", {}).get("persist-credentials") is False, f"{path.name} {job_id}"
    assert checkouts == 13  # ci/mutation-nightly.yml has two jobs (shards, the whole audit)


def test_the_token_is_empty_or_read_only_by_default_and_jobs_ask_for_the_rest():
    for path in WORKFLOWS:
        workflow = _load(path)
        assert workflow.get("permissions") in ({}, {"contents": "read"}), path.name
        for job_id, job in workflow["jobs"].items():
            if workflow["permissions"] == {}:
                assert "permissions" in job, f"{path.name} {job_id} falls back to no permissions unannounced"
            for scope, level in job.get("permissions", {}).items():
                assert level in ("read", "write"), f"{path.name} {job_id} {scope}"


def test_only_the_job_that_attests_may_mint_tokens_and_write_attestations():
    attesting = []
    for path in WORKFLOWS:
        workflow = _load(path)
        assert not ATTEST_PERMISSIONS & set(workflow.get("permissions") or {}), path.name
        for job_id, job in workflow["jobs"].items():
            attests = any(s.get("uses", "").startswith("actions/attest@") for s in job.get("steps", []))
            granted = {scope for scope, level in job.get("permissions", {}).items() if level == "write"}
            if attests:
                attesting.append((path.name, job_id))
                assert ATTEST_PERMISSIONS <= granted, f"{path.name} {job_id}"
            else:
                assert not ATTEST_PERMISSIONS & granted, f"{path.name} {job_id} may sign without attesting"
    assert attesting == [("vendor-certify.yml", "attest")]


def test_no_expression_is_spliced_into_a_script():
    for path in WORKFLOWS:
        for job_id, step in _steps(_load(path)):
            assert "${{" not in step.get("run", ""), f"{path.name} {job_id}: {step.get('name', step['run'])}"


def test_the_vendor_workflow_attests_the_bundle_its_own_run_merged():
    workflow = _load(ROOT / "ci" / "vendor-certify.yml")
    certify, attest = workflow["jobs"]["certify"], workflow["jobs"]["attest"]
    assert attest["needs"] == "certify" and "if" not in attest  # only a bundle that passed the checks
    downloads = [s for j in ("certify", "attest") for s in workflow["jobs"][j]["steps"]
                 if s.get("uses", "").startswith("actions/download-artifact@")]
    assert len(downloads) == 2
    for step in downloads:  # this run's artifacts only: no other run, repository or token
        assert not {"run-id", "repository", "github-token"} & set(step["with"]), step
    commands = [s.get("run", "") for s in certify["steps"]]
    merge = commands.index("python -m conformance merge shards/onnx-light-shard-* --report-dir certification")
    assert commands.index("python -m conformance verify-bundle certification --integrity-only") > merge
    assert not any("pip install" in s.get("run", "") for s in attest["steps"])  # nothing installed signs
    step = next(s for s in attest["steps"] if s.get("uses", "").startswith("actions/attest@"))
    assert step["with"]["subject-path"].split() == ["certification/manifest.json", "certification/results.json",
                                                    "certification/junit.xml", "certification/summary.md"]
    assert step["with"]["predicate-type"] == PREDICATE_TYPE
    assert step["with"]["predicate-path"] == "certification/predicate.json"


def test_the_predicate_is_written_from_the_manifest(tmp_path):
    workflow = _load(ROOT / "ci" / "vendor-certify.yml")
    script = next(s["run"] for s in workflow["jobs"]["attest"]["steps"] if "predicate.json" in s.get("run", ""))
    bundle = tmp_path / "certification"
    bundle.mkdir()
    manifest = {"format": 1, "suite": {"version": "4.0.0"}, "spec": {"revision": "r"}, "adapter": {"name": "a"},
                "profiles": {"state": "certified"}, "corpus": {"sha256": "0" * 64}, "cases": [], "totals": {}}
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    subprocess.run(["bash", "-eo", "pipefail", "-c", script], cwd=tmp_path, check=True)
    predicate = json.loads((bundle / "predicate.json").read_text())
    assert predicate == {k: manifest[k] for k in ("profiles", "suite", "spec", "adapter", "corpus")}


def test_the_documented_verification_matches_the_workflow():
    doc = (ROOT / "docs" / "conformance.md").read_text()
    section = doc[doc.index("## Keyless attestation in CI"):]
    end = section.find("\n## ")
    section = section if end < 0 else section[:end]  # up to the next section, if any
    assert ("gh attestation verify certification/manifest.json --repo OWNER/REPO \\\n"
            f"  --predicate-type {PREDICATE_TYPE}") in section
    assert "verify-bundle certification --rerun --testee THEIR_BUILD" in section


@pytest.mark.skipif(shutil.which("zizmor") is None, reason="zizmor is not installed (.ci/run installs it)")
def test_zizmor_finds_nothing():
    done = subprocess.run(["zizmor", "--offline", "--no-progress", *map(str, WORKFLOWS)], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
