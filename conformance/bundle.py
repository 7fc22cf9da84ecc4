"""The certification bundle: a report directory whose claim a certifier can check without trusting it.

``manifest.json`` records the suite version and spec revision, the corpus digest, the exact selection,
the runner's, runtime's and machine's facts, the per-profile status (``conformance.certificate``), the
waivers and every per-case verdict with the SHA-256 of the case, plus SHA-256 of the report files.

Digests alone prove nothing (whoever edits a bundle can recompute them), so verification has two parts:

- *integrity and coverage* (``check``): the files match their digests, the cases are this corpus's, every
  waived failure is backed by a listed waiver, and every status follows from the verdicts against the
  verifier's own corpus — a trimmed bundle or one run on a subset certifies nothing;
- *authenticity* (``verify``): a DSSE signature by a key the verifier trusts over the bundle's in-toto
  Statement (``python -m conformance sign``), or a rerun of every claimed profile's full selection on a
  runtime the verifier names. Nothing the bundle names is ever executed, imported or opened outside it.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import pathlib
from dataclasses import dataclass, field
from typing import Any

from conformance import SPEC_REVISION, SUITE_VERSION, attestation, certificate, renames
from conformance.bundle_files import BundleError, check_name, expect, read_bytes, read_json
from conformance.bundle_files import field as required_field
from conformance.cases import default_corpus, load_cases
from conformance.execute import CRASHED, FAILED, NOT_SUPPORTED, PASSED, PASSED_WITHOUT_CODE, Result
from conformance.runner import RunInfo

MANIFEST = "manifest.json"
REPORT_FILES = ("results.json", "junit.xml", "summary.md")
FORMAT = 2


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def corpus_sha256(cases) -> str:
    """One digest of a whole corpus (kept for callers of the shard check)."""
    return certificate.corpus_digest(cases)


# ------------------------------------------------------------------------------------------------ write
def statuses(results: list[Result], info: RunInfo, corpus: str | None = None) -> dict[str, str]:
    """Each claimed profile's status for a run (what ``write`` records, for the summary written before)."""
    return certificate.profile_statuses(results, load_cases(corpus), info.adapter.get("profiles", []),
                                        certificate.is_full_selection(info.selection))


def write(directory: str | pathlib.Path, results: list[Result], info: RunInfo, waivers: list[dict],
          corpus: str | None = None) -> dict:
    """Write ``manifest.json`` for the report already in ``directory`` and return it."""
    directory = pathlib.Path(directory)
    all_cases = load_cases(corpus)
    cases = {c.id: c for c in all_cases}
    selection = dict(info.selection)
    full = certificate.is_full_selection(selection)
    manifest = {
        "format": FORMAT,
        "suite": info.suite,
        "spec": info.spec,
        "runner": certificate.runner_record(),
        "corpus": certificate.corpus_record(all_cases, corpus or default_corpus()),
        "selection": {**selection, "full": full},
        "adapter": info.adapter,
        "machine": certificate.machine_record(),
        "profiles": statuses(results, info, corpus),
        "waivers": waivers,
        "totals": _totals(results),
        "cases": [{"id": r.id, "sha256": cases[r.id].sha256(), "level": r.level, "profile": r.profile,
                   "verdict": r.verdict, "expected_failure": r.expected_failure} for r in results],
        "files": {name: _digest((directory / name).read_bytes()) for name in REPORT_FILES
                  if (directory / name).exists()},
    }
    manifest["manifest_sha256"] = _digest(_canonical(manifest))
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    stale = directory / attestation.ENVELOPE
    if stale.exists() or stale.is_symlink():  # a signature of an earlier run in the same directory
        stale.unlink()
    return manifest


def _totals(entries) -> dict:
    verdicts = [e["verdict"] if isinstance(e, dict) else e.verdict for e in entries]
    waived = [bool(e["expected_failure"] if isinstance(e, dict) else e.expected_failure) for e in entries]
    return {"passed": verdicts.count(PASSED), "passed_without_code": verdicts.count(PASSED_WITHOUT_CODE),
            "failed": verdicts.count(FAILED), "not_supported": verdicts.count(NOT_SUPPORTED),
            "crashed": verdicts.count(CRASHED),
            "other": sum(v not in (PASSED, PASSED_WITHOUT_CODE, FAILED, NOT_SUPPORTED, CRASHED) for v in verdicts),
            "expected_failures": sum(waived)}


# ------------------------------------------------------------------------------------------------- sign
def sign(directory: str | pathlib.Path, key_path: str | os.PathLike, corpus: str | None = None) -> str:
    """Sign the bundle in ``directory`` (after checking it) with the Ed25519 key at ``key_path``; writes
    ``attestation.dsse.json`` and returns the key ID. A bundle that does not check out is not signed."""
    directory = pathlib.Path(directory)
    key = attestation.load_private_key(key_path)
    manifest, problems = check(directory, corpus)
    if problems:
        raise BundleError(f"{directory} does not check out ({problems[0]}{' ...' if len(problems) > 1 else ''}); "
                          "not signed")
    envelope = attestation.sign(manifest, _subjects(directory, manifest), key)
    target = directory / attestation.ENVELOPE
    if target.is_symlink():
        raise BundleError(f"{target} is a symbolic link; not signed")
    target.write_text(json.dumps(envelope, indent=1) + "\n")
    return attestation.key_id(key.public_key())


def _subjects(directory: pathlib.Path, manifest: dict) -> dict[str, str]:
    names = [MANIFEST, *manifest["files"]]
    return {name: _digest(read_bytes(directory, name)) for name in names}


# ------------------------------------------------------------------------------------------------ check
@dataclass
class Verification:
    """What ``verify`` found: problems (empty when the bundle checks out) and how it was authenticated."""

    problems: list[str] = field(default_factory=list)
    authenticated_by: str | None = None
    manifest: dict | None = None

    @property
    def ok(self) -> bool:
        return not self.problems and self.authenticated_by is not None


def check(directory: str | pathlib.Path, corpus: str | None = None) -> tuple[dict, list[str]]:
    """The manifest and every integrity or coverage problem of the bundle (authenticity aside). Raises
    ``BundleError`` when the bundle cannot be read as one (a one-line reason)."""
    directory = pathlib.Path(directory)
    manifest = read_json(directory, MANIFEST)
    _check_shape(manifest)
    problems = []
    body = {key: value for key, value in manifest.items() if key != "manifest_sha256"}
    if manifest.get("manifest_sha256") != _digest(_canonical(body)):
        problems.append("manifest_sha256 does not match the manifest's content")
    if manifest["format"] != FORMAT:
        problems.append(f"manifest format {manifest['format']} is not this suite's {FORMAT}")
    if manifest["suite"].get("version") != SUITE_VERSION:
        problems.append(f"suite version {manifest['suite'].get('version')} is not this suite's {SUITE_VERSION}")
    if manifest["spec"].get("revision") != SPEC_REVISION:
        problems.append(f"spec revision {manifest['spec'].get('revision')} is not {SPEC_REVISION}")
    problems += _check_files(directory, manifest)
    all_cases = load_cases(corpus)
    problems += _check_corpus(manifest, all_cases, corpus)
    entries = manifest["cases"]
    if manifest["totals"] != _totals(entries):
        problems.append("totals do not match the per-case verdicts")
    problems += _check_waivers(manifest)
    full = certificate.is_full_selection(manifest["selection"]) and manifest["selection"].get("full") is True
    claimed = manifest["adapter"].get("profiles", [])
    if not isinstance(claimed, list) or not all(isinstance(p, str) for p in claimed):
        raise BundleError(f"{MANIFEST}: adapter.profiles is not a list of names")
    recomputed = certificate.profile_statuses(entries, all_cases, claimed, full)
    if recomputed != manifest["profiles"]:
        for profile in sorted(set(recomputed) | set(manifest["profiles"])):
            if recomputed.get(profile) != manifest["profiles"].get(profile):
                problems.append(f"profile {profile}: the bundle says {manifest['profiles'].get(profile)!r}, "
                                f"its verdicts on this corpus give {recomputed.get(profile)!r}")
    earned = [p for p, s in manifest["profiles"].items() if s in certificate.EARNED]
    gaps = certificate.coverage_gaps(entries, all_cases, earned)
    if gaps:
        problems.append(f"coverage: {len(gaps)} case(s) of the certified profiles are not in the bundle "
                        f"(first: {gaps[0]})")
    if "results.json" in manifest["files"]:
        problems += _check_results(directory, entries)
    return manifest, problems


def _check_shape(manifest: Any) -> None:
    """Every key the checks read has the kind they expect: malformed input is one line, not a traceback."""
    expect(manifest, dict, MANIFEST)
    required_field(manifest, "format", int, MANIFEST)
    for key in ("suite", "spec", "adapter", "profiles", "totals", "files", "selection", "corpus"):
        required_field(manifest, key, dict, MANIFEST)
    for key in ("cases", "waivers"):
        required_field(manifest, key, list, MANIFEST)
    selection = manifest["selection"]
    for key, kind in (("cases", list), ("level", str), ("profile", list), ("shard", str)):
        if selection.get(key) is not None:
            expect(selection[key], kind, f"{MANIFEST}.selection.{key}")
    for key in ("cases", "profile"):
        for item in selection.get(key) or []:
            expect(item, str, f"{MANIFEST}.selection.{key}[]")
    for name, status in manifest["profiles"].items():
        expect(status, str, f"{MANIFEST}.profiles.{name}")
    for name, digest in manifest["files"].items():
        check_name(name)
        expect(digest, str, f"{MANIFEST}.files.{name}")
    for index, entry in enumerate(manifest["cases"]):
        where = f"{MANIFEST}.cases[{index}]"
        expect(entry, dict, where)
        for key in ("id", "sha256", "level", "profile", "verdict"):
            required_field(entry, key, str, where)
        required_field(entry, "expected_failure", bool, where)
    for index, waiver in enumerate(manifest["waivers"]):
        where = f"{MANIFEST}.waivers[{index}]"
        expect(waiver, dict, where)
        required_field(waiver, "pattern", str, where)
        required_field(waiver, "message", str, where)


def _check_files(directory: pathlib.Path, manifest: dict) -> list[str]:
    problems = []
    for name in REPORT_FILES:
        if name not in manifest["files"]:
            problems.append(f"{name} is not recorded in the manifest")
    for name, digest in manifest["files"].items():
        try:
            data = read_bytes(directory, name)
        except BundleError as error:
            problems.append(str(error))
            continue
        if _digest(data) != digest:
            problems.append(f"{name} does not match its recorded SHA-256")
    return problems


def _check_corpus(manifest: dict, all_cases, corpus: str | None) -> list[str]:
    problems = []
    cases = {c.id: c for c in all_cases}
    recorded = manifest["corpus"]
    local = certificate.corpus_record(all_cases, corpus or default_corpus())
    for key, what in (("sha256", "cases"), ("files_sha256", "case definitions and builders")):
        if recorded.get(key) != local[key]:
            problems.append(f"corpus: the run's {what} digest {recorded.get(key)} is not this corpus's {local[key]}")
    renamed = renames.table(corpus)
    old_ids = [entry["id"] for entry in manifest["cases"] if entry["id"] not in cases and entry["id"] in renamed]
    if old_ids:
        problems.insert(0, f"corpus: the bundle names {len(old_ids)} case(s) by IDs from before the suite renamed "
                           f"them ({renames.FILE}: {old_ids[0]} is now {renamed[old_ids[0]]}): it was made by an "
                           "older suite on another corpus and cannot certify against this one; rerun this suite")
    seen = set()
    for entry in manifest["cases"]:
        case = cases.get(entry["id"])
        if entry["id"] in seen:
            problems.append(f"{entry['id']} is listed more than once")
        seen.add(entry["id"])
        if case is None and entry["id"] in renamed:
            problems.append(f"{entry['id']} is now {renamed[entry['id']]} (renamed; see the first problem)")
        elif case is None:
            problems.append(f"{entry['id']} is not a case of this suite")
        elif case.sha256() != entry["sha256"]:
            problems.append(f"{entry['id']}: the case differs from the one certified (SHA-256 mismatch)")
        elif (case.level, case.profile) != (entry["level"], entry["profile"]):
            problems.append(f"{entry['id']}: recorded as {entry['level']}/{entry['profile']}, the corpus has "
                            f"{case.level}/{case.profile}")
    return problems


def _check_waivers(manifest: dict) -> list[str]:
    """A waived (expected) failure must be a failure matched by a waiver the manifest lists."""
    patterns = [waiver["pattern"] for waiver in manifest["waivers"]]
    problems = []
    for entry in manifest["cases"]:
        if not entry["expected_failure"]:
            continue
        if entry["verdict"] != FAILED:
            problems.append(f"{entry['id']} is waived but its verdict is {entry['verdict']!r}")
        elif not any(fnmatch.fnmatchcase(entry["id"], pattern) for pattern in patterns):
            problems.append(f"{entry['id']} is waived by no listed waiver")
    return problems


def _check_results(directory: pathlib.Path, entries: list[dict]) -> list[str]:
    try:
        recorded = read_json(directory, "results.json")
        listed = {}
        for index, item in enumerate(required_field(expect(recorded, dict, "results.json"), "results", list,
                                                    "results.json")):
            where = f"results.json.results[{index}]"
            expect(item, dict, where)
            listed[required_field(item, "id", str, where)] = required_field(item, "verdict", str, where)
    except BundleError as error:
        return [str(error)]
    if listed != {e["id"]: e["verdict"] for e in entries}:
        return ["results.json verdicts differ from the manifest"]
    return []


# ----------------------------------------------------------------------------------------------- verify
def verify(directory: str | pathlib.Path, corpus: str | None = None, *, trusted_keys: list[Any] = (),
           rerun_adapter: str | None = None, rerun_testee: str | None = None, timeout: float = 30.0,
           integrity_only: bool = False, jobs: int = 1) -> Verification:
    """Check the bundle, then authenticate its claim: by a signature under one of ``trusted_keys``, or by
    rerunning every claimed profile on the runtime the verifier names (``rerun_adapter``/``rerun_testee``).
    With ``integrity_only`` (and no key or rerun) a bundle that checks out is reported as unauthenticated."""
    manifest, problems = check(directory, corpus)
    outcome = Verification(problems=problems, manifest=manifest)
    if trusted_keys:
        try:
            key = _check_signature(pathlib.Path(directory), manifest, list(trusted_keys))
            outcome.authenticated_by = f"signature by trusted key {key[:16]}"
        except BundleError as error:
            outcome.problems.append(f"signature: {error}")
    if rerun_adapter or rerun_testee:
        differences = rerun(manifest, corpus, rerun_adapter, rerun_testee, timeout, jobs)
        outcome.problems += differences
        if not differences:
            named = f"--testee {rerun_testee}" if rerun_testee else f"--adapter {rerun_adapter}"
            outcome.authenticated_by = (outcome.authenticated_by + " and " if outcome.authenticated_by else "") + \
                f"a rerun with {named}"
    if outcome.problems:
        outcome.authenticated_by = None
    elif integrity_only and outcome.authenticated_by is None:
        outcome.authenticated_by = "integrity only (not authenticated)"
    return outcome


def _check_signature(directory: pathlib.Path, manifest: dict, trusted: list[Any]) -> str:
    envelope = read_json(directory, attestation.ENVELOPE, limit=1 << 20)
    statement, key = attestation.verify(envelope, trusted)
    subjects = attestation.subjects_of(statement)
    for name in [MANIFEST, *manifest["files"]]:
        if name not in subjects:
            raise BundleError(f"{name} is not a subject of the signed statement")
    for name, digest in subjects.items():
        check_name(name)
        if _digest(read_bytes(directory, name)) != digest:
            raise BundleError(f"{name} is not the file that was signed (SHA-256 differs)")
    expected = attestation.statement(manifest, {})["predicate"]
    if statement["predicate"] != json.loads(json.dumps(expected)):
        raise BundleError("the signed predicate differs from the manifest")
    return key


def rerun(manifest: dict, corpus: str | None, adapter: str | None, testee: str | None,
          timeout: float = 30.0, jobs: int = 1) -> list[str]:
    """Run the full corpus selection of every profile the bundle claims on the verifier's runtime and list
    every case whose verdict, and every profile whose status, differs from the bundle's."""
    from conformance.failure_list import Entry, apply
    from conformance.runner import RunConfig, run

    claimed = sorted(manifest["profiles"])
    all_cases = load_cases(corpus)
    selection = [case for case in all_cases if case.profile in claimed]
    if not selection:
        return ["rerun: the bundle claims no profile of this corpus"]
    results, _ = run(selection, RunConfig(adapter=adapter, testee=testee, corpus=corpus, timeout=timeout,
                                          jobs=jobs, progress=False))
    waivers = [Entry(w["pattern"], w["message"], n) for n, w in enumerate(manifest["waivers"], start=1)]
    apply(waivers, results, [c.id for c in all_cases])
    recorded = {e["id"]: e["verdict"] for e in manifest["cases"]}
    problems = [f"rerun: {r.id}: the bundle says {recorded[r.id]!r}, the rerun gives {r.verdict!r}"
                for r in results if r.id in recorded and recorded[r.id] != r.verdict]
    statuses = certificate.profile_statuses(results, all_cases, claimed, True)
    for profile in claimed:
        said = manifest["profiles"][profile]
        if said in certificate.EARNED and statuses[profile] != said:
            problems.append(f"rerun: profile {profile}: the bundle says {said!r}, the rerun of its whole "
                            f"selection gives {statuses[profile]!r}")
    return problems
