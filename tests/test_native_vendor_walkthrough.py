"""The walk-through of conformance/sdk/cpp/README.md works as written: its CMakeLists.txt and main.cc, in an
empty directory, make a runtime that its own shell steps build, certify for the affine profile, sign and
verify (the first step, which clones and installs the suite, is this checkout)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from native_toolchain import SDK, require_toolchain

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = SDK.parents[2]
README = SDK / "README.md"


def _section() -> str:
    return README.read_text().split("## Walk-through:", 1)[1].split("\n## ", 1)[0]


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", _section(), re.S)


def test_the_walkthrough_has_one_cmake_file_one_main_and_its_certifying_commands():
    assert len(_blocks("cmake")) == 1 and len(_blocks("cpp")) == 1
    for shown in ("affine.storage_type()", "affine.has_axis()", "value.logical_type()", "value.raw_data()",
                  "testee::Value::Tensor(", "testee::Rejected("):  # generated names, a tensor, a code
        assert shown in _blocks("cpp")[0]
    setup, *steps = _blocks("sh")
    assert 'export SUITE=' in setup and 'pip install -e "$SUITE"' in setup
    commands = "".join(steps)
    for command in ("python -m conformance run --testee build/my-testee --report-dir cert",
                    "python -m conformance keygen --out vendor",
                    "python -m conformance sign cert --key vendor.pem",
                    "python -m conformance verify-bundle cert --trusted-key vendor.pub.pem"):
        assert command in commands


def test_the_walkthrough_installs_what_signing_imports():
    """keygen, sign and verify-bundle --trusted-key import cryptography: the plain install of step 1 holds it."""
    assert re.search(r'pip install -e "\$SUITE"', _blocks("sh")[0]), "step 1 does not install the suite"
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(requirement.startswith("cryptography") for requirement in declared)


def test_the_walkthrough_runtime_is_certified_for_affine_signed_and_verified(tmp_path):
    require_toolchain()
    (tmp_path / "CMakeLists.txt").write_text(_blocks("cmake")[0])
    (tmp_path / "main.cc").write_text(_blocks("cpp")[0])
    python_dir = os.path.dirname(sys.executable)
    environment = dict(os.environ, SUITE=str(ROOT), PYTHONPATH=str(ROOT),
                       PATH=f"{python_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    script = "set -euo pipefail\n" + "".join(_blocks("sh")[1:])
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=environment, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    manifest = json.loads((tmp_path / "cert" / "manifest.json").read_text())
    assert manifest["profiles"] == {"affine": "certified"}
    assert (tmp_path / "cert" / "attestation.dsse.json").is_file()
    assert "certification: affine certified" in done.stdout + done.stderr

