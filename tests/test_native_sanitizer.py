"""The sanitizer build (ASan+UBSan) of the SDK and the example: it passes the example's cases, the
documented wrapper lets it start under the fuzz harness's address-space cap, and a sanitizer report
fails both a conformance run and a differential fuzz campaign (shown with a runtime that has one
memory error and one misaligned read, tests/fixtures/native/faulty_testee.cc)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest
from native_toolchain import EXAMPLE, ROOT, SDK, build, require_toolchain

from conformance import protocol as P

FAULTY_SOURCE = ROOT / "tests" / "fixtures" / "native" / "faulty_testee.cc"
#: docs/testee-protocol.md: lift the soft address-space limit a fuzz campaign passes on to its testee.
WRAPPER = "sh -c 'ulimit -S -v unlimited && exec \"$0\"' {}"
#: The example's profiles, run against its sanitizer build (the state profiles run its graph executor).
PROFILES = ("affine", "external-data", "state", "bindings", "zero-copy")


@pytest.fixture(scope="module")
def tree():
    return build("sanitize")


def _environment(logs) -> dict:
    return dict(os.environ, ASAN_OPTIONS=f"abort_on_error=1:detect_leaks=1:log_path={logs}/asan",
                UBSAN_OPTIONS=f"halt_on_error=1:print_stacktrace=1:log_path={logs}/ubsan")


def _reports(logs, *streams: str) -> str:
    """ASan's reports (files under log_path) plus what reached stderr: UBSan prints there even with a
    log_path when it shares the process with ASan."""
    return "".join(path.read_text() for path in sorted(logs.iterdir())) + "".join(streams)


@pytest.fixture(scope="module")
def faulty(tree, tmp_path_factory):
    require_toolchain("g++")
    binary = tmp_path_factory.mktemp("faulty") / "faulty-testee"
    subprocess.run(["g++", "-std=c++17", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                    str(FAULTY_SOURCE), f"-I{SDK / 'include'}", f"-L{tree}", "-lonnx_light_testee_sdk",
                    "-lonnx_light_testee_protocol", "-lprotobuf-lite", "-pthread", "-o", str(binary)], check=True)
    return binary


def _hello(command: list[str], cap_bytes: int | None) -> int:
    """Exit status of a session that sends hello and shutdown, under a soft address-space cap."""
    def cap():
        if cap_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (cap_bytes, resource.getrlimit(resource.RLIMIT_AS)[1]))
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               preexec_fn=cap)
    frames = b""
    for request in (P.Request(id=1, hello=P.MESSAGES["Hello"]()), P.Request(id=2, shutdown=P.MESSAGES["Shutdown"]())):
        body = request.SerializeToString()
        frames += len(body).to_bytes(4, "little") + body
    process.communicate(frames, timeout=60)
    return process.returncode


def test_the_wrapper_lets_the_sanitizer_build_start_under_an_address_space_cap(tree):
    binary = str(tree / EXAMPLE)
    cap = 8 << 30  # what the fuzz harness leaves: its own size plus FUZZ_ADDRESS_SPACE_MB
    if resource.getrlimit(resource.RLIMIT_AS)[1] != resource.RLIM_INFINITY:
        pytest.skip("the hard address-space limit is finite here, so no wrapper can lift the soft one")
    assert _hello([binary], None) == 0
    assert _hello([binary], cap) != 0  # ASan cannot reserve its shadow memory
    assert _hello(["sh", "-c", 'ulimit -S -v unlimited && exec "$0"', binary], cap) == 0


def test_the_sanitizer_build_passes_the_example_cases(tree, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    done = subprocess.run([sys.executable, "-m", "conformance", "run", "--testee", WRAPPER.format(tree / EXAMPLE),
                           "--quiet", *(arg for name in PROFILES for arg in ("--profile", name)), "--report-dir",
                           str(tmp_path / "report")], cwd=ROOT, env=_environment(logs), capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Sanitizer" not in _reports(logs, done.stderr) and "runtime error" not in done.stderr


@pytest.mark.parametrize("case, report", [("Required.Affine.Storage.Int8PerTensor", "misaligned address"),
                                          ("Required.Affine.Storage.Int4PaddingNonzero", "heap-buffer-overflow")])
def test_a_sanitizer_report_fails_the_case(faulty, tmp_path, case, report):
    logs = tmp_path / "logs"
    logs.mkdir()
    done = subprocess.run([sys.executable, "-m", "conformance", "run", "--testee", WRAPPER.format(faulty),
                           "--cases", case, "--report-dir", str(tmp_path / "report")], cwd=ROOT,
                          env=_environment(logs), capture_output=True, text=True)
    assert done.returncode == 1
    result = json.loads((tmp_path / "report" / "results.json").read_text())["results"][0]
    assert result["verdict"] == "failed" and ("exited" in result["message"] or "killed by" in result["message"])
    assert report in _reports(logs, done.stderr)


def test_a_sanitizer_report_is_a_fuzz_finding(faulty, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    done = subprocess.run([sys.executable, "-m", "fuzz", "run", "differential", "--testee", WRAPPER.format(faulty),
                           "--time", "4", "--jobs", "1", "--seed", "1", "--quiet", "--fail-on-finding",
                           "--out", str(tmp_path / "run"), "--corpus", str(tmp_path / "corpus")], cwd=ROOT,
                          env=_environment(logs), capture_output=True, text=True)
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["findings"]
    job_logs = [path.read_text() for path in sorted((tmp_path / "run" / "logs").iterdir())]
    assert "AddressSanitizer" in _reports(logs) or "runtime error" in "".join(job_logs)
