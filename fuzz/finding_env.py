"""The ``FUZZ_*`` settings a findings directory may carry into a replay, each with its validator.

A campaign records the settings its jobs ran with (``report.json``'s ``environment``), and triage,
promotion and replay reproduce findings under them. A findings directory is a CI artifact anyone can
hand over, so what it records is data: only the keys of ``SETTINGS`` are taken, each only when its
validator accepts the value; every other key (``LD_PRELOAD``, ``PATH``, ``FUZZ_STATS_FILE``, ...) makes
the whole directory unusable. A recorded testee command (``FUZZ_TESTEE``) is never run: the user names
the testee on the command line (``--testee``), or replays against another subject (``--subject``).
Adapter files (``path/to/file.py:attribute``) and modules outside the project's subjects are never
loaded from a recorded ``FUZZ_SUBJECT`` either. docs/fuzzing.md has the table.
"""

from __future__ import annotations

import math
import pathlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fuzz.findings_io import FindingsDirectory, FindingsError, records_near, shown

#: The key whose recorded value is never used (a command line would run).
TESTEE_KEY = "FUZZ_TESTEE"
#: The longest recorded value taken.
MAX_VALUE_CHARS = 256
#: ``module:attribute`` subjects of the harness itself.
HARNESS_SUBJECTS = ("fuzz.subjects:faulty_reference", "fuzz.subjects:FaultyReference")

_DECIMAL = re.compile(r"^[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]{1,3})?$")
_INTEGER = re.compile(r"^[0-9]{1,9}$")


def _flag(value: str) -> str | None:
    return None if value in ("0", "1") else "must be 0 or 1"


def _decimal(low: float, high: float, positive: bool = False) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        number = float(value) if _DECIMAL.match(value) else math.nan
        if not (low <= number <= high) or (positive and number == 0):
            return f"must be a decimal number {'above' if positive else 'from'} {low:g} up to {high:g}"
        return None
    return check


def _integer(low: int, high: int) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        if not _INTEGER.match(value) or not low <= int(value) <= high:
            return f"must be a whole number from {low} to {high}"
        return None
    return check


def _fault(value: str) -> str | None:
    from fuzz.subjects import FAULTS

    return None if value in FAULTS else f"must be one of the injected faults ({', '.join(FAULTS)})"


def _subject(value: str) -> str | None:
    from conformance.adapters import BUILTIN

    if value in BUILTIN or value in BUILTIN.values() or value in HARNESS_SUBJECTS:
        return None
    module, _, attribute = value.partition(":")
    if module.startswith("conformance.audit.faults") and attribute.isidentifier():
        from conformance.audit.catalogue import MODULES, adapter_spec, current_spec, faults

        current = current_spec(value)
        if current.partition(":")[0].removeprefix("conformance.audit.") in MODULES and \
                current in {adapter_spec(f) for f in faults()}:
            return None
    return ("must be a builtin adapter name, fuzz.subjects:faulty_reference or a fault of the audit catalogue "
            "(module:Class); adapter files and other modules are not loaded from a findings directory")


#: key -> (validator returning a problem or None, what the setting does)
SETTINGS: dict[str, tuple[Callable[[str], str | None], str]] = {
    "FUZZ_SUBJECT": (_subject, "the subject the differential and statediff targets compare with the oracle"),
    "FUZZ_FAULT": (_fault, "the fault fuzz.subjects:faulty_reference injects"),
    "FUZZ_STRICT": (_flag, "1: known oracle issues are findings too"),
    "FUZZ_PROBE_KNOWN": (_flag, "0: generator variants that hit open oracle issues are off"),
    "FUZZ_RTOL": (_decimal(0.0, 1.0), "relative tolerance of value comparisons"),
    "FUZZ_ATOL": (_decimal(0.0, 1e6), "absolute tolerance of value comparisons"),
    "FUZZ_TESTEE_TIMEOUT": (_decimal(0.0, 3600.0, positive=True), "seconds a testee request may take"),
    "FUZZ_TIME_BUDGET": (_decimal(0.0, 3600.0, positive=True), "CPU seconds per input before a slow finding"),
    "FUZZ_HANG_AFTER": (_decimal(0.0, 3600.0), "CPU seconds before an input is interrupted as a hang"),
    "FUZZ_MEMORY_BUDGET_MB": (_integer(1, 1 << 20), "peak RSS growth per input before a memory finding"),
    "FUZZ_ADDRESS_SPACE_MB": (_integer(1, 1 << 20), "address space the harness allows beyond its start-up size"),
}


def recordable(environment: Mapping[str, str]) -> dict[str, str]:
    """What a campaign records of its jobs' environment: the settings above and the testee command."""
    return {key: environment[key] for key in (*SETTINGS, TESTEE_KEY) if environment.get(key)}


def validated(recorded: object, where: str) -> tuple[dict[str, str], str | None]:
    """(settings to replay with, the recorded testee command or None) of a recorded ``environment``.
    Raises FindingsError naming ``where`` on any key outside ``SETTINGS`` or any value its validator
    refuses."""
    if recorded is None:
        return {}, None
    if not isinstance(recorded, dict):
        raise FindingsError(f"{where}: 'environment' must be an object of strings, not {type(recorded).__name__}")
    settings, testee = {}, None
    for key, value in recorded.items():
        if not isinstance(value, str):
            raise FindingsError(f"{where}: environment {shown(key)} must be a string, not {type(value).__name__}")
        if key == TESTEE_KEY:
            testee = value
            continue
        if key not in SETTINGS:
            raise FindingsError(f"{where}: environment key {shown(key)} is not a setting a finding may carry "
                                f"(allowed: {', '.join(SETTINGS)}, and {TESTEE_KEY}, which is never run)")
        check, _ = SETTINGS[key]
        problem = "is too long" if len(value) > MAX_VALUE_CHARS else check(value)
        if problem:
            raise FindingsError(f"{where}: environment {key}={shown(value)} refused: {problem}")
        settings[key] = value
    return settings, testee


def replay_environment(settings: Mapping[str, str], recorded_testee: str | None, subject: str | None = None,
                       testee: str | None = None, fault: str | None = None) -> dict[str, str]:
    """The validated ``settings`` with the command line's choices on top. A testee runs only when the
    command line names it; findings recorded against a testee need ``--testee`` or ``--subject``."""
    environment = dict(settings)
    if testee:
        environment.pop("FUZZ_SUBJECT", None)
        environment[TESTEE_KEY] = testee
    elif subject:
        environment["FUZZ_SUBJECT"] = subject
    elif recorded_testee:
        raise FindingsError(f"the findings were recorded against the testee command {shown(recorded_testee)}, "
                            "which is never run from a findings directory: pass --testee COMMAND (or "
                            "--subject SPEC) to replay them")
    if fault:
        environment["FUZZ_FAULT"] = fault
    return environment


@dataclass(frozen=True)
class Context:
    """What a findings directory records about its campaign, validated: target and replay settings."""

    target: str | None
    settings: dict[str, str]
    testee: str | None  # recorded, never run


def context_of(record: object, what: str) -> Context:
    """The validated context of a ``report.json`` (an object) or ``triage.json`` (a list of objects)."""
    from fuzz.targets import TARGETS

    if isinstance(record, list):
        if not all(isinstance(entry, dict) for entry in record):
            raise FindingsError(f"{what} must be a list of objects")
        record = record[0] if record else {}
    if not isinstance(record, dict):
        raise FindingsError(f"{what} must be a JSON object, not {type(record).__name__}")
    target = record.get("target")
    if target is not None and target not in TARGETS:
        raise FindingsError(f"{what}: target {shown(target)} is not one of {', '.join(TARGETS)}")
    settings, testee = validated(record.get("environment"), what)
    return Context(target, settings, testee)


def directory_context(found: FindingsDirectory) -> Context:
    """The context a campaign's ``report.json`` records for its findings directory."""
    report = found.report()
    return context_of(*report) if report is not None else Context(None, {}, None)


def finding_context(path: pathlib.Path) -> Context:
    """The context recorded next to a single finding: the nearest record that says anything (every
    record found is validated, so a malformed one is refused even when a nearer one would do)."""
    contexts = [context_of(record, what) for record, what in records_near(path)]
    return next((c for c in contexts if c.target or c.settings or c.testee), Context(None, {}, None))


def check_replay_environment(environment: Mapping[str, str]) -> None:
    """Refuse (ValueError) any key a replay worker must not be given."""
    stray = sorted(set(environment) - set(SETTINGS) - {TESTEE_KEY})
    if stray:
        raise ValueError(f"not replay settings: {', '.join(stray)}")


__all__ = ["SETTINGS", "TESTEE_KEY", "Context", "check_replay_environment", "context_of", "directory_context",
           "finding_context", "recordable", "replay_environment", "validated"]
