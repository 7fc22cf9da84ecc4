"""The runner against an untrusted testee (docs/security.md): frames are capped and read as the bytes
arrive, and a testee that cannot be started, exits, prints garbage or never answers ``hello`` ends
the run with one line, the summary line and exit status 2 instead of a traceback."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import threading
import tracemalloc

import pytest

from conformance import protocol as P
from conformance.adapters import SuiteError
from conformance.adapters import testee_client as runner_side

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GARBAGE = (f"{sys.executable} -c \"import sys, time; sys.stdout.write('not a frame' * 99); sys.stdout.flush(); "
           "time.sleep(60)\"")
SILENT = f"{sys.executable} -c \"import time; time.sleep(60)\""
EXITS = f"{sys.executable} -c \"pass\""


def _pipe_with(data: bytes):
    """A raw (unbuffered) pipe holding ``data``, closed after it, as the testee's stdout would be."""
    read_end, write_end = os.pipe()
    writer = threading.Thread(target=lambda: (os.write(write_end, data), os.close(write_end)))
    writer.start()
    return os.fdopen(read_end, "rb", buffering=0), writer


def _peak_while(fn) -> int:
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


@pytest.mark.parametrize("claimed", [2**31 - 1, 60 << 20], ids=["beyond-the-cap", "within-the-cap"])
def test_a_length_prefix_reserves_nothing_before_the_bytes_arrive(claimed):
    """A prefix near 2**31 is refused at once; one within the cap whose bytes never come is read in
    chunks, so a lying prefix costs the bytes actually sent, not the bytes claimed."""
    stream, writer = _pipe_with(struct.pack("<I", claimed) + b"\x08\x01" * 8)

    def read():
        with pytest.raises(P.FramingError):
            P.read_frame(stream, P.Response, max_frame=64 << 20)

    assert _peak_while(read) < 4 << 20
    writer.join()
    stream.close()


def test_frames_that_do_not_parse_are_framing_errors():
    stream, writer = _pipe_with(struct.pack("<I", 4) + b"\xff\xff\xff\xff")
    with pytest.raises(P.FramingError, match="not a Response"):
        P.read_frame(stream, P.Response)
    writer.join()
    stream.close()


@pytest.mark.parametrize("command", ["/nonexistent/testee --flag", EXITS, GARBAGE, SILENT, "'unbalanced"],
                         ids=["missing", "exits", "garbage", "silent", "bad-quoting"])
def test_an_unusable_testee_is_a_suite_error(command):
    with pytest.raises(runner_side.TesteeUnavailable) as info:
        runner_side.TesteeAdapter(command, timeout=3)
    assert isinstance(info.value, SuiteError) and "\n" not in str(info.value)


def test_the_frame_cap_is_configurable(monkeypatch):
    monkeypatch.setenv("CONFORMANCE_MAX_FRAME", "8")  # smaller than any hello answer
    with pytest.raises(runner_side.TesteeUnavailable, match="exceeds the limit of 8 bytes"):
        runner_side.TesteeAdapter(f"{sys.executable} -m conformance.testee", timeout=30)
    monkeypatch.setenv("CONFORMANCE_MAX_FRAME", "lots")
    with pytest.raises(SuiteError, match="CONFORMANCE_MAX_FRAME"):
        runner_side.TesteeAdapter(f"{sys.executable} -m conformance.testee", timeout=30)


@pytest.mark.parametrize("command", ["/nonexistent/testee", EXITS, GARBAGE, SILENT],
                         ids=["missing", "exits", "garbage", "silent"])
def test_the_runner_reports_an_unusable_testee_in_one_line(command, tmp_path):
    done = subprocess.run([sys.executable, "-m", "conformance", "run", "--testee", command, "--timeout", "3",
                           "--cases", "Required.Affine.Storage", "--report-dir", str(tmp_path / "report")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    errors = [line for line in done.stderr.splitlines() if line.startswith("conformance:")]
    assert len(errors) == 1 and "is unusable" in errors[0], done.stderr
    assert done.stdout.splitlines()[-1].startswith("0 passed, 0 failed, 0 not supported, 0 expected failures")
