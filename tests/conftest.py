"""Test setup: the repository root and this folder are importable (clause_coverage lives here); the
inherently slow tests are marked ``slow``; skips and deselections are summed up in one line each.

The README's test command (``python -m pytest -n 2``) runs everything but the ``slow`` tests (pyproject's
``addopts`` deselects them) so that it finishes in minutes; CI runs them in a step of their own
(``python -m pytest -n 2 -m slow``), so nothing goes untested.
"""

from __future__ import annotations

import collections
import fcntl
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
TESTS = pathlib.Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: Test files that are slow by nature, and why. Everything in them is marked ``slow``.
SLOW_FILES = {
    "test_native_example.py": "builds the C++ example runtime and certifies it through the testee",
    "test_native_sanitizer.py": "builds and runs the ASan/UBSan configuration",
    "test_native_vendor_walkthrough.py": "builds the README walk-through's runtime from an empty directory",
    "test_native_guide.py": "builds the C++ guide runtime",
    "test_native_sdk.py": "builds the C++ SDK's test runtimes",
    "test_native_size_gate.py": "builds the proto libraries with protoc and gates them",
    "test_native_payload_race.py": "builds a native reader and races it against file swaps",
    "test_native_protocol_parity.py": "builds the C++ SDK to compare it with the Python protocol",
    "test_peer_deviations.py": "runs every peer runtime on the whole corpus",
    "test_peer_adapters.py": "loads OpenVINO, tract and onnxruntime",
    "test_audit.py": "audits the fault catalogue (whole-catalogue runs and scoping checks)",
    "test_packaging.py": "builds the wheel and sdist and installs them into fresh environments",
    "test_scaffold.py": "generates adapter skeletons and runs the whole corpus on them",
    "test_testee_hostile.py": "waits out hung and crashing testees",
    "test_concurrency_stress.py": "repeats the concurrency cases many times",
    "test_dashboard_browser.py": "drives Chromium through Playwright",
    "test_fuzz_statediff.py": "runs fuzz campaigns until they find planted faults",
}

#: What installs an optional module a test may skip for (pytest.importorskip names the module).
INSTALL = {
    "onnxruntime": 'pip install -e ".[peers]"',
    "openvino": 'pip install -e ".[openvino]"',
    "tract": 'pip install -e ".[tract]"',
    "torch": 'pip install -e ".[torch]"',
    "jinja2": 'pip install -e ".[dashboard]"',
    "playwright": 'pip install -e ".[dashboard]"',
    "yaml": 'pip install -e ".[test]"',
    "grpc_tools": 'pip install -e ".[test]"',
    "build": 'pip install -e ".[test]"',
    "atheris": 'pip install -e ".[fuzz]"',
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark the slow files' tests before ``-m`` selects (this hook runs before the mark plugin's)."""
    for item in items:
        if item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)


def _skip_reason(report) -> str:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    missing = re.match(r"could not import '([\w.]+)'", reason)
    if missing:
        module = missing.group(1).split(".")[0]
        return f"{module} is not installed ({INSTALL.get(module, 'pip install ' + module)})"
    return reason


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """One line for the deselected slow tests and one for the skips, each saying what would run them."""
    if "not slow" in (config.getoption("markexpr") or ""):  # (xdist workers deselect; no count reaches here)
        terminalreporter.write_line(f"slow tests deselected ({len(SLOW_FILES)} files: native builds, peers, the "
                                    f"audit, packaging): run them with `python -m pytest -n 2 -m slow` (CI does)")
    reasons = collections.Counter(_skip_reason(report) for report in terminalreporter.stats.get("skipped", []))
    if reasons:
        parts = "; ".join(f"{count} × {reason}" for reason, count in reasons.most_common())
        terminalreporter.write_line(f"{sum(reasons.values())} skipped: {parts}")


@pytest.fixture(scope="session")
def reference_report(tmp_path_factory, worker_id) -> pathlib.Path:
    """One whole-corpus run of the reference runtime (its report directory), made once per test session and
    shared by every xdist worker: the tests that read a full report need not each pay for a run. The
    command's output is kept beside it as ``<directory>.out``. Tests that alter a report copy it first."""
    shared = tmp_path_factory.getbasetemp()
    if worker_id != "master":  # each worker has its own basetemp under the session's
        shared = shared.parent
    report = shared / "reference-report"
    with open(shared / "reference-report.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (shared / "reference-report.out").exists():
            done = subprocess.run([sys.executable, "-m", "conformance", "run", "-j", "2", "--quiet",
                                   "--report-dir", str(report)], cwd=ROOT, capture_output=True, text=True,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=900)
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
            (shared / "reference-report.out").write_text(done.stdout)
    return report
