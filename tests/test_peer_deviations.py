"""docs/peer-deviations.md and the README's peer table are current: the document lists exactly the failing
cases of every installed peer, the table its per-profile counts, and each reproduction in the document
runs standalone (onnx.helper, the runtime and NumPy, no suite code)."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
from collections import Counter, defaultdict
from types import SimpleNamespace

import pytest

from conformance.cases import load_cases
from conformance.execute import FAILED, NOT_SUPPORTED, PASSED, PASSED_WITHOUT_CODE
from conformance.runner import RunConfig, run

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "peer-deviations.md"
#: Section title prefix in the document -> (adapter name, module the runtime needs).
PEERS = {"onnxruntime": ("onnxruntime", "onnxruntime"), "onnx reference evaluator": ("onnx-reference", "onnx"),
         "OpenVINO": ("openvino", "openvino"), "tract": ("tract", "tract")}
#: the class suffix of a failure that depends on the CPU the runtime runs on (it picks kernels by instruction set)
CPU_DEPENDENT = "(CPU-dependent)"


def _sections() -> dict[str, set[str]]:
    return {adapter: set(rows) for adapter, rows in _rows().items()}


def _rows() -> dict[str, dict[str, str]]:
    """adapter -> {case id: its class} from the document's tables."""
    listed: dict[str, dict[str, str]] = {}
    current = None
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            current = next((adapter for title, (adapter, _) in PEERS.items() if line[3:].startswith(title)), None)
            if current:
                listed[current] = {}
        elif current and (match := re.match(r"\| `([^`]+)` \| ([^|]+) \|", line)):
            listed[current][match.group(1)] = match.group(2).strip()
    return listed


def _cpu_dependent(adapter: str) -> set[str]:
    """Listed failures that hinge on the machine's CPU (the runtime picks its kernels by instruction set):
    they may pass elsewhere, and the README's table counts them as failures wherever they run."""
    return {case_id for case_id, kind in _rows()[adapter].items() if CPU_DEPENDENT in kind}


def test_every_peer_has_a_section():
    assert set(_sections()) == {adapter for adapter, _ in PEERS.values()}


@pytest.mark.parametrize("adapter,module", list(PEERS.values()), ids=[a for a, _ in PEERS.values()])
def test_listed_failures_are_the_current_failures(adapter, module):
    pytest.importorskip(module)
    results = _peer_results(adapter)
    failing = {r.id for r in results if r.verdict == FAILED}
    listed, variable = _sections()[adapter], _cpu_dependent(adapter)
    assert failing - listed == set(), f"failing but not in docs/peer-deviations.md: {sorted(failing - listed)}"
    assert listed - failing - variable == set(), f"listed but no longer failing: {sorted(listed - failing)}"
    assert _readme_table(adapter) == _table(results, variable), "the README's peer table is out of date"


#: A directory of whole-corpus peer reports (``<dir>/<adapter>/results.json``) to read instead of running the
#: peers again: .ci/run sets it to the reports of its own peer runs.
PEER_REPORTS = "CONFORMANCE_PEER_REPORTS"


def _peer_results(adapter: str) -> list:
    """The peer's verdicts on every case: from its report when PEER_REPORTS names one that covers exactly the
    current corpus, else from a run here."""
    cases = list(load_cases())
    recorded = pathlib.Path(os.environ.get(PEER_REPORTS, "/nonexistent")) / adapter / "results.json"
    if recorded.is_file():
        results = [SimpleNamespace(**r) for r in json.loads(recorded.read_text())["results"]]
        assert sorted(r.id for r in results) == sorted(c.id for c in cases), f"{recorded} is not a whole run"
        return results
    return run(cases, RunConfig(adapter=adapter, progress=False))[0]


def _readme_table(adapter: str) -> dict[str, str]:
    """profile -> "passed / passed without code / failed / not supported" from the README's peer table."""
    lines = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| ")]
    header = next(line for line in lines if line.startswith("| profile |"))
    titles = [cell.strip() for cell in header.strip("|").split("|")]
    column = next(i for i, title in enumerate(titles) for prefix, (name, _) in PEERS.items()
                  if name == adapter and title.startswith(prefix))
    rows = {}
    for line in lines[lines.index(header) + 2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == len(titles) and "/" in cells[column]:
            rows[cells[0]] = cells[column]
    return rows


def _table(results, cpu_dependent: set[str] = frozenset()) -> dict[str, str]:
    counts: dict[str, Counter] = defaultdict(Counter)
    for result in results:
        counts[result.profile][FAILED if result.id in cpu_dependent else result.verdict] += 1
    return {profile: " / ".join(str(c[v]) for v in (PASSED, PASSED_WITHOUT_CODE, FAILED, NOT_SUPPORTED))
            for profile, c in counts.items() if c[NOT_SUPPORTED] != sum(c.values())}


def _findings() -> dict[str, tuple[str, str]]:
    """finding id -> (the peer section's adapter or "shared", the finding's text up to the next heading)."""
    found: dict[str, tuple[str, str]] = {}
    section, current = "shared", None
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            section = next((adapter for title, (adapter, _) in PEERS.items() if line[3:].startswith(title)), "shared")
            current = None
        elif line.startswith("### "):
            current = line[4:].strip()
            found[current] = (section, "")
        elif current:
            found[current] = (section, found[current][1] + line + "\n")
    return found


def test_every_row_names_a_finding_and_every_peer_finding_has_rows_or_says_why_not():
    """A row links a finding of the document; a runtime's own finding without rows is a deviation the adapter
    works around, and says so ("no row") with what the adapter does instead."""
    findings, text = _findings(), DOC.read_text()
    linked = set(re.findall(r"\| \[([A-Z0-9-]+)\]\(#([a-z0-9-]+)\) \|", text))
    for name, anchor in linked:
        assert name in findings and anchor == name.lower(), name
    for name, (section, body) in findings.items():
        if section != "shared" and name not in {n for n, _ in linked}:
            assert "no row" in body.strip().split("\n\n")[0], f"{name} has no row and does not say why"


@pytest.mark.parametrize("path", ["conformance/adapters/ov.py", "conformance/adapters/tract_rt.py",
                                  "conformance/adapters/lowering.py"])
def test_findings_the_adapters_cite_are_in_the_document(path):
    cited = set(re.findall(r"\b((?:OV|T|R|E|L|W)-[A-Z0-9]+(?:-[A-Z0-9]+)*)\b", (ROOT / path).read_text()))
    assert cited - set(_findings()) == set()


def _reproductions() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_reproductions_use_no_suite_code():
    blocks = _reproductions()
    assert len(blocks) >= 10
    for code in blocks:
        assert not re.search(r"^\s*(from|import) (conformance|reference_impl|corpus)", code, flags=re.M), code[:200]


@pytest.mark.parametrize("index", range(len(_reproductions())))
def test_reproduction_runs_standalone(index, tmp_path):
    code = _reproductions()[index]
    for module in ("onnxruntime", "openvino", "tract"):
        if re.search(rf"^import {module}\b", code, flags=re.M) and importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")
    script = tmp_path / "repro.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip()
