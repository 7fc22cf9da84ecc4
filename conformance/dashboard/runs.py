"""Reading result bundles for the dashboard, without trusting them.

Every file is read through ``conformance.bundle_files`` (no links, regular files, bounded sizes) and every
field is checked for its kind before use, so a malformed bundle is one ``BundleError`` line naming the
bundle and the field. Long texts are cut here (``MAX_TEXT``) so a hostile bundle cannot blow up the site.
Whether a bundle is signed is whether it has ``attestation.dsse.json``; whether the signature is verified
is decided by ``conformance.bundle.verify`` under the keys the person building the dashboard trusts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from conformance.bundle_files import MAX_FILE_BYTES, BundleError, expect, read_json
from conformance.bundle_files import exists as bundle_has
from conformance.bundle_files import field as required

#: The most characters of one message, detail or traceback the site shows (the bundle keeps them whole).
MAX_TEXT = 4000
ENVELOPE = "attestation.dsse.json"


@dataclass(frozen=True)
class Outcome:
    """One case's result in one run, as the bundle records it."""

    verdict: str
    message: str = ""
    expected: str = ""
    actual: str = ""
    detail: str = ""
    traceback: str = ""
    expected_failure: bool = False
    level: str = ""
    profile: str = ""
    clauses: tuple[str, ...] = ()


@dataclass
class Run:
    """One bundle: who ran what, on which suite and corpus, with what result per case."""

    directory: str
    runtime: str
    version: str
    identity: str
    suite_version: str
    spec_revision: str
    corpus_sha256: str
    full: bool
    started: float | None
    profiles: dict[str, str]
    signed: bool
    outcomes: dict[str, Outcome]
    label: str = ""
    verified: bool = False
    verification: str = "not checked (no --trusted-key given)"
    problems: list[str] = field(default_factory=list)


def load(directory: str | os.PathLike) -> Run:
    """The run recorded in the bundle at ``directory``; a ``BundleError`` naming it when it is malformed."""
    where = os.fspath(directory)
    try:
        return _load(where)
    except BundleError as error:
        raise BundleError(f"{where}: {error}") from None


def _load(where: str) -> Run:
    recorded = expect(read_json(where, "results.json", MAX_FILE_BYTES), dict, "results.json")
    run = expect(recorded.get("run", {}), dict, "results.json.run")
    items = required(recorded, "results", list, "results.json")
    manifest = read_json(where, "manifest.json") if bundle_has(where, "manifest.json") else {}
    manifest = expect(manifest, dict, "manifest.json")
    adapter = _section(manifest, "adapter", "manifest.json") or _section(run, "adapter", "results.json.run")
    suite = _section(manifest, "suite", "manifest.json") or _section(run, "suite", "results.json.run")
    spec = _section(manifest, "spec", "manifest.json") or _section(run, "spec", "results.json.run")
    corpus = _section(manifest, "corpus", "manifest.json")
    selection = _section(manifest, "selection", "manifest.json")
    profiles = _section(manifest, "profiles", "manifest.json")
    for name, status in profiles.items():
        expect(status, str, f"manifest.json.profiles.{name}")
    started = run.get("started")
    outcomes: dict[str, Outcome] = {}
    for index, item in enumerate(items):
        case_id, outcome = _outcome(item, f"results.json.results[{index}]")
        if case_id in outcomes:
            raise BundleError(f"results.json lists {_short(case_id)} more than once")
        outcomes[case_id] = outcome
    return Run(directory=where,
               runtime=_text(adapter, "name", "adapter", "unknown runtime"),
               version=_text(adapter, "version", "adapter", "unknown"),
               identity=_text(adapter, "identity", "adapter", ""),
               suite_version=_text(suite, "version", "suite", "unknown"),
               spec_revision=_text(spec, "revision", "spec", "unknown"),
               corpus_sha256=_text(corpus, "sha256", "corpus", "unknown"),
               full=selection.get("full") is True,
               started=float(started) if isinstance(started, (int, float)) and not isinstance(started, bool)
               else None,
               profiles=dict(profiles), signed=bundle_has(where, ENVELOPE), outcomes=outcomes)


def _section(mapping: dict, key: str, where: str) -> dict:
    value = mapping.get(key, {})
    return expect(value, dict, f"{where}.{key}")


def _text(mapping: dict, key: str, where: str, default: str) -> str:
    value = mapping.get(key, default)
    return clip(expect(value, str, f"{where}.{key}"), 200)


_TEXT_FIELDS = ("message", "expected", "actual", "detail", "traceback")


def _outcome(item, where: str) -> tuple[str, Outcome]:
    expect(item, dict, where)
    case_id = required(item, "id", str, where)
    if not case_id or len(case_id) > 300:
        raise BundleError(f"{where}.id is empty or longer than 300 characters")
    texts = {key: clip(expect(item.get(key, ""), str, f"{where}.{key}"), MAX_TEXT) for key in _TEXT_FIELDS}
    clauses = expect(item.get("clauses", []), list, f"{where}.clauses")
    for clause in clauses:
        expect(clause, str, f"{where}.clauses[]")
    return case_id, Outcome(verdict=clip(required(item, "verdict", str, where), 60),
                            expected_failure=expect(item.get("expected_failure", False), bool,
                                                    f"{where}.expected_failure"),
                            level=clip(expect(item.get("level", ""), str, f"{where}.level"), 60),
                            profile=clip(expect(item.get("profile", ""), str, f"{where}.profile"), 60),
                            clauses=tuple(clip(c, 100) for c in clauses), **texts)


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out (line breaks kept)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]} … ({len(text) - limit} more characters in the bundle)"


def _short(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:57] + "...")


def label_runs(runs: list[Run]) -> None:
    """Give every run a distinct label: its runtime's name, with its bundle's directory name when two runs
    are of one runtime, and a number when even that repeats."""
    names = [run.runtime for run in runs]
    for run in runs:
        run.label = run.runtime
        if names.count(run.runtime) > 1:
            run.label = f"{run.runtime} ({os.path.basename(os.path.normpath(run.directory))})"
    seen: dict[str, int] = {}
    for run in runs:
        seen[run.label] = seen.get(run.label, 0) + 1
        if seen[run.label] > 1:
            run.label = f"{run.label} #{seen[run.label]}"


def verify(run: Run, trusted_keys: list, corpus: str | None) -> None:
    """Record whether ``run``'s bundle is signed by one of ``trusted_keys`` and checks out on this corpus."""
    from conformance import bundle

    if not trusted_keys:
        run.verification = "signed, not verified (no --trusted-key given)" if run.signed else "unsigned"
        return
    if not run.signed:
        run.verification = "unsigned"
        return
    try:
        outcome = bundle.verify(run.directory, corpus, trusted_keys=trusted_keys)
    except BundleError as error:
        run.verification, run.problems = f"not verified: {error}", [str(error)]
        return
    run.verified = outcome.ok
    run.problems = list(outcome.problems)
    run.verification = (f"verified: {outcome.authenticated_by}" if outcome.ok
                        else f"not verified: {outcome.problems[0] if outcome.problems else 'no trusted signature'}")
