"""The native toolchain for the tests of the C++ SDK, its example runtime and the protoc size gate.

Builds go to build/native/<config> (the trees ci/native.sh builds, so in CI the tests find them up to
date). A file lock serializes builds across pytest-xdist workers. Tests skip only when the toolchain
itself is absent (cmake, a C++ compiler, protoc, the protobuf headers).
"""

from __future__ import annotations

import fcntl
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SDK = ROOT / "conformance" / "sdk" / "cpp"
BUILD = ROOT / "build" / "native"
EXAMPLE = "example/onnx-light-example-testee"
PROTOBUF_HEADER = pathlib.Path("/usr/include/google/protobuf/message_lite.h")
#: ci/native.sh's configurations.
CONFIGS = {
    "release": ["-DCMAKE_BUILD_TYPE=Release"],
    "sanitize": ["-DCMAKE_BUILD_TYPE=RelWithDebInfo", "-DONNX_LIGHT_TESTEE_SANITIZE=address,undefined"],
}


def missing_toolchain(*tools: str) -> str | None:
    """Why the native toolchain cannot run here, or None when it can."""
    for tool in tools or ("cmake", "g++", "protoc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (ci/native.sh installs the native toolchain)"
    if not PROTOBUF_HEADER.exists():
        return "the protobuf headers (libprotobuf-dev) are not installed"
    return None


def require_toolchain(*tools: str) -> None:
    reason = missing_toolchain(*tools)
    if reason:
        pytest.skip(reason)


def build(config: str) -> pathlib.Path:
    """Configure and build one configuration of the SDK and the example; returns its build tree."""
    require_toolchain()
    tree = BUILD / config
    BUILD.mkdir(parents=True, exist_ok=True)
    with open(BUILD / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (tree / "CMakeCache.txt").exists():
            generator = ["-G", "Ninja"] if shutil.which("ninja") else []
            _run(["cmake", "-S", str(SDK), "-B", str(tree), *generator, *CONFIGS[config]])
        _run(["cmake", "--build", str(tree), "-j2"])
    return tree


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise AssertionError(f"{' '.join(command)} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
