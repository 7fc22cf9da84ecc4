"""What a certificate means: which profiles a run earned, judged against the corpus, not the run's own list.

A profile is ``certified`` only when the run's selection was the whole corpus (no ``--cases``, ``--level``,
``--profile`` or lone ``--shard``), it covered every case of that profile in the corpus (Required and
Recommended, each once), none failed, crashed or was not supported, every rejection carried its code, and
the only failures are waived Recommended cases (``certified-with-waivers``). Anything less is ``partial``
(the run did not cover the profile) or ``not certified``. The same function decides when a bundle is
written and when it is verified, always against the verifier's own corpus.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import platform
import sys
from collections import defaultdict
from collections.abc import Iterable
from importlib import metadata
from typing import Any

CERTIFIED = "certified"
CERTIFIED_WITH_WAIVERS = "certified-with-waivers"
NOT_CERTIFIED = "not certified"
PARTIAL = "partial"
NOT_RUN = "not run"
#: Statuses that certify a profile.
EARNED = (CERTIFIED, CERTIFIED_WITH_WAIVERS)


def is_full_selection(selection: dict) -> bool:
    """Whether a run's recorded selection is the whole corpus (no filter; a shard only once merged)."""
    return not any(selection.get(key) for key in ("cases", "level", "profile", "shard"))


def profile_statuses(entries: Iterable[Any], corpus_cases: Iterable[Any], claimed: Iterable[str],
                     full: bool) -> dict[str, str]:
    """Per claimed profile, its status. ``entries`` are per-case outcomes (``Result`` objects or their
    JSON) with id, verdict, level, profile and expected_failure; ``corpus_cases`` the corpus's cases."""
    from conformance.execute import PASSED  # late: execute imports the runner's machinery

    outcomes: dict[str, list[tuple[str, str, str, bool]]] = defaultdict(list)
    for entry in entries:
        item = _fields(entry)
        outcomes[item[3]].append(item[:3] + (item[4],))
    wanted: dict[str, set[str]] = defaultdict(set)
    for case in corpus_cases:
        wanted[case.profile].add(case.id)
    status = {}
    for profile in sorted(set(claimed)):
        group = outcomes.get(profile, [])
        ids = [case_id for case_id, _, _, _ in group]
        if not group:
            status[profile] = NOT_RUN
        elif any(verdict != PASSED and (level == "Required" or not waived) for _, verdict, level, waived in group):
            status[profile] = NOT_CERTIFIED
        elif not full or len(ids) != len(set(ids)) or set(ids) != wanted.get(profile, set()):
            status[profile] = PARTIAL
        elif any(verdict != PASSED for _, verdict, _, _ in group):
            status[profile] = CERTIFIED_WITH_WAIVERS
        else:
            status[profile] = CERTIFIED
    return status


def _fields(entry: Any) -> tuple[str, str, str, str, bool]:
    if isinstance(entry, dict):
        return (entry["id"], entry["verdict"], entry["level"], entry["profile"], bool(entry["expected_failure"]))
    return (entry.id, entry.verdict, entry.level, entry.profile, bool(entry.expected_failure))


def coverage_gaps(entries: Iterable[Any], corpus_cases: Iterable[Any], profiles: Iterable[str]) -> list[str]:
    """The corpus cases of ``profiles`` a run does not show: what a trimmed bundle left out."""
    present = {_fields(entry)[0] for entry in entries}
    chosen = set(profiles)
    return [case.id for case in corpus_cases if case.profile in chosen and case.id not in present]


# ------------------------------------------------------------------------------------------ the corpus
def corpus_digest(cases: Iterable[Any]) -> str:
    """One digest of every case as the suite defines it (ID, manifest entry, model and files), in ID order."""
    lines = "".join(f"{case.id} {case.sha256()}\n" for case in sorted(cases, key=lambda c: c.id))
    return hashlib.sha256(lines.encode()).hexdigest()


def corpus_files_digest(root: str | os.PathLike) -> str:
    """One digest of the corpus's definitions: the rename table and every case manifest and builder source
    under ``root`` (``cases/``, ``builders/``, ``regressions/cases/``), by relative path. Catches a builder whose
    expected values changed while the models it builds did not."""
    root = pathlib.Path(root)
    digest = hashlib.sha256()
    renames = root / "renames.toml"  # which old IDs name which cases is part of the definitions
    if renames.is_file():
        digest.update(b"renames.toml\0" + hashlib.sha256(renames.read_bytes()).digest())
    for part in ("cases", "builders", "regressions/cases"):
        base = root / part
        if not base.is_dir():
            continue
        for path in sorted(p for p in base.rglob("*") if p.suffix in (".toml", ".py") and p.is_file()
                           and "__pycache__" not in p.parts):
            relative = path.relative_to(root).as_posix()
            digest.update(relative.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def corpus_record(cases: Iterable[Any], root: str | os.PathLike) -> dict:
    cases = list(cases)
    return {"sha256": corpus_digest(cases), "files_sha256": corpus_files_digest(root), "cases": len(cases)}


# ------------------------------------------------------------------------------------- who and where
RUNNER_PACKAGES = ("onnx-light-conformance", "numpy", "onnx", "protobuf", "ml_dtypes")


def runner_record() -> dict:
    """The runner's own versions: the suite and the packages its judging depends on."""
    from conformance import SUITE_VERSION

    versions = {}
    for name in RUNNER_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {"suite_version": SUITE_VERSION, "python": platform.python_version(),
            "implementation": sys.implementation.name, "packages": versions}


def machine_record() -> dict:
    """The machine facts a certifier asks for: OS, architecture, CPU model and count, memory."""
    memory = None
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    return {"system": platform.system(), "release": platform.release(), "platform": platform.platform(),
            "machine": platform.machine(), "cpu": _cpu_model(), "cpus": os.cpu_count(), "memory_bytes": memory}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
