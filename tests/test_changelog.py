"""CHANGELOG.md keeps both versions: the suite's (SUITE_VERSION, with an Unreleased section for the next
release) and the adapter contract's (ADAPTER_CONTRACT_VERSION, its newest entry), and the command line
prints both."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

from conformance import SUITE_VERSION
from conformance.adapters import ADAPTER_CONTRACT_VERSION

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHANGELOG = ROOT / "CHANGELOG.md"


def _section(title: str) -> str:
    return CHANGELOG.read_text().split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _versions(section: str) -> list[str]:
    return re.findall(r"^### \[([^\]]+)\]", section, re.M)


def test_the_suite_section_has_unreleased_and_the_current_version():
    versions = _versions(_section("Suite"))
    assert versions[0] == "Unreleased" and versions[1] == SUITE_VERSION


def test_the_adapter_contract_section_starts_at_the_current_contract_version():
    assert re.fullmatch(r"\d+\.\d+\.\d+", ADAPTER_CONTRACT_VERSION)
    versions = _versions(_section("Adapter contract"))
    assert versions[0] == ADAPTER_CONTRACT_VERSION and versions[-1] == "1.0.0"
    for item in ("read-only view", "DOUBLE", 'Rejected("STATE_UNRETAINABLE"', "`id()`"):
        assert item in _section("Adapter contract")


def test_version_prints_the_suite_and_the_adapter_contract():
    done = subprocess.run([sys.executable, "-m", "conformance", "--version"], capture_output=True, text=True,
                          cwd=ROOT)
    assert done.returncode == 0
    assert f" {SUITE_VERSION} " in done.stdout and f"adapter contract {ADAPTER_CONTRACT_VERSION}" in done.stdout
