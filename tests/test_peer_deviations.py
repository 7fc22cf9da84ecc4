"""docs/peer-deviations.md is current: it lists exactly the failing cases of every installed peer, and each
reproduction in it runs standalone (onnx.helper, the runtime and NumPy, no suite code)."""

from __future__ import annotations

import importlib.util
import pathlib
import re
import subprocess
import sys

import pytest

from conformance.cases import load_cases
from conformance.execute import FAILED
from conformance.runner import RunConfig, run

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "peer-deviations.md"
#: Section title prefix in the document -> (adapter name, module the runtime needs).
PEERS = {"onnxruntime": ("onnxruntime", "onnxruntime"), "onnx reference evaluator": ("onnx-reference", "onnx"),
         "OpenVINO": ("openvino", "openvino"), "tract": ("tract", "tract")}


def _sections() -> dict[str, set[str]]:
    listed: dict[str, set[str]] = {}
    current = None
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            current = next((adapter for title, (adapter, _) in PEERS.items() if line[3:].startswith(title)), None)
            if current:
                listed[current] = set()
        elif current and (match := re.match(r"\| `([^`]+)` \|", line)):
            listed[current].add(match.group(1))
    return listed


def test_every_peer_has_a_section():
    assert set(_sections()) == {adapter for adapter, _ in PEERS.values()}


@pytest.mark.parametrize("adapter,module", list(PEERS.values()), ids=[a for a, _ in PEERS.values()])
def test_listed_failures_are_the_current_failures(adapter, module):
    pytest.importorskip(module)
    results, _ = run(list(load_cases()), RunConfig(adapter=adapter, progress=False))
    failing = {r.id for r in results if r.verdict == FAILED}
    listed = _sections()[adapter]
    assert failing - listed == set(), f"failing but not in docs/peer-deviations.md: {sorted(failing - listed)}"
    assert listed - failing == set(), f"listed but no longer failing: {sorted(listed - failing)}"


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
