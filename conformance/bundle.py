"""The certification bundle: a manifest others can check without trusting the vendor's machine.

``manifest.json`` records the suite version and spec revision, the SHA-256 of every case as the suite
defines it, the adapter's identity, version and claimed profiles, the certified profiles, the waivers
(expected-failure entries) and every per-case verdict, plus SHA-256 of the report files. ``verify``
recomputes the case digests from the local corpus, the verdict tallies, the certified profiles and the
file digests; with ``rerun`` it also runs the cases again and compares verdicts.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
from collections import defaultdict

from conformance import SPEC_REVISION, SUITE_VERSION
from conformance.cases import load_cases
from conformance.execute import FAILED, NOT_SUPPORTED, PASSED, PASSED_WITHOUT_CODE, Result
from conformance.runner import RunInfo

MANIFEST = "manifest.json"
REPORT_FILES = ("results.json", "junit.xml", "summary.md")


def certified_profiles(results: list[Result], claimed: list[str]) -> dict[str, str]:
    """Per claimed profile: ``certified`` when every case passed, ``certified-with-waivers`` when the only
    failures are waived Recommended cases, otherwise ``not certified``. Certification requires error
    codes: a case that passed without code does not certify its profile."""
    by_profile: dict[str, list[Result]] = defaultdict(list)
    for result in results:
        by_profile[result.profile].append(result)
    status = {}
    for profile in sorted(claimed):
        group = by_profile.get(profile, [])
        if not group:
            status[profile] = "not run"
        elif any(r.verdict != PASSED and (r.level == "Required" or not r.expected_failure) for r in group):
            status[profile] = "not certified"
        elif any(r.verdict != PASSED for r in group):
            status[profile] = "certified-with-waivers"
        else:
            status[profile] = "certified"
    return status


def corpus_sha256(cases) -> str:
    """One digest of a whole corpus: every case's ID and SHA-256, in ID order. Shards of one run record
    it, so a merge can tell that they ran the same cases."""
    lines = "".join(f"{case.id} {case.sha256()}\n" for case in sorted(cases, key=lambda c: c.id))
    return _digest(lines.encode())


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def write(directory: str | pathlib.Path, results: list[Result], info: RunInfo, waivers: list[dict],
          corpus: str | None = None) -> dict:
    directory = pathlib.Path(directory)
    cases = {c.id: c for c in load_cases(corpus)}
    manifest = {
        "format": 1,
        "suite": info.suite,
        "spec": info.spec,
        "adapter": info.adapter,
        "profiles": certified_profiles(results, info.adapter.get("profiles", [])),
        "waivers": waivers,
        "totals": _totals(results),
        "cases": [{"id": r.id, "sha256": cases[r.id].sha256(), "level": r.level, "profile": r.profile,
                   "verdict": r.verdict, "expected_failure": r.expected_failure} for r in results],
        "files": {name: _digest((directory / name).read_bytes()) for name in REPORT_FILES
                  if (directory / name).exists()},
    }
    manifest["manifest_sha256"] = _digest(_canonical(manifest))
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _totals(results) -> dict:
    return {"passed": sum(r["verdict"] == PASSED if isinstance(r, dict) else r.verdict == PASSED for r in results),
            "passed_without_code": sum((r["verdict"] if isinstance(r, dict) else r.verdict) == PASSED_WITHOUT_CODE
                                       for r in results),
            "failed": sum((r["verdict"] if isinstance(r, dict) else r.verdict) == FAILED for r in results),
            "not_supported": sum((r["verdict"] if isinstance(r, dict) else r.verdict) == NOT_SUPPORTED
                                 for r in results),
            "expected_failures": sum(bool(r["expected_failure"] if isinstance(r, dict) else r.expected_failure)
                                     for r in results)}


def verify(directory: str | pathlib.Path, corpus: str | None = None, rerun: bool = False,
           adapter_spec: str | None = None, testee: str | None = None) -> list[str]:
    """Every problem found in the bundle at ``directory`` (empty when it checks out)."""
    directory = pathlib.Path(directory)
    path = directory / MANIFEST
    if not path.exists():
        return [f"{path} does not exist"]
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        return [f"{path} is not JSON: {error}"]
    problems = []
    recorded = manifest.pop("manifest_sha256", None)
    if recorded != _digest(_canonical(manifest)):
        problems.append("manifest_sha256 does not match the manifest's content")
    if manifest.get("suite", {}).get("version") != SUITE_VERSION:
        problems.append(f"suite version {manifest.get('suite', {}).get('version')} is not this suite's "
                        f"{SUITE_VERSION}")
    if manifest.get("spec", {}).get("revision") != SPEC_REVISION:
        problems.append(f"spec revision {manifest.get('spec', {}).get('revision')} is not {SPEC_REVISION}")
    for name, digest in manifest.get("files", {}).items():
        file = directory / name
        if not file.exists():
            problems.append(f"{name} is listed but missing")
        elif _digest(file.read_bytes()) != digest:
            problems.append(f"{name} does not match its recorded SHA-256")
    cases = {c.id: c for c in load_cases(corpus)}
    entries = manifest.get("cases", [])
    for entry in entries:
        case = cases.get(entry["id"])
        if case is None:
            problems.append(f"{entry['id']} is not a case of this suite")
        elif case.sha256() != entry["sha256"]:
            problems.append(f"{entry['id']}: the case differs from the one certified (SHA-256 mismatch)")
    if manifest.get("totals") != _totals(entries):
        problems.append("totals do not match the per-case verdicts")
    results = [Result(e["id"], e["verdict"], level=e["level"], profile=e["profile"],
                      expected_failure=e["expected_failure"]) for e in entries]
    claimed = manifest.get("adapter", {}).get("profiles", [])
    if certified_profiles(results, claimed) != manifest.get("profiles"):
        problems.append("certified profiles do not follow from the per-case verdicts")
    results_file = directory / "results.json"
    if results_file.exists():
        listed = {r["id"]: r["verdict"] for r in json.loads(results_file.read_text())["results"]}
        if listed != {e["id"]: e["verdict"] for e in entries}:
            problems.append("results.json verdicts differ from the manifest")
    if rerun:
        problems += _rerun(entries, cases, adapter_spec or manifest.get("adapter", {}).get("identity"), testee,
                           corpus)
    return problems


def _rerun(entries, cases, adapter_spec, testee, corpus) -> list[str]:
    from conformance.runner import RunConfig, run

    selected = [cases[e["id"]] for e in entries if e["id"] in cases]
    if adapter_spec and adapter_spec.startswith("testee:"):
        testee, adapter_spec = adapter_spec[len("testee:"):], None
    results, _ = run(selected, RunConfig(adapter=adapter_spec, testee=testee, corpus=corpus, progress=False))
    now = {r.id: r.verdict for r in results}
    return [f"{e['id']}: certified {e['verdict']}, now {now.get(e['id'])}" for e in entries
            if now.get(e["id"]) != e["verdict"]]
