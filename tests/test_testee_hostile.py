"""The runner against an untrusted testee (docs/security.md, docs/testee-protocol.md "Limits"): frames
are capped in bytes and objects and read as the bytes arrive; a testee that cannot be started, exits,
prints garbage or never answers ``hello`` ends the run with one line, the summary line and exit status 2
instead of a traceback; one that lies about a value, crashes, hangs or talks during the run fails the
case at hand, saying what happened, and the run goes on and writes its report."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import threading
import tracemalloc

import numpy as np
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


# ------------------------------------------------------------------- lying, crashing and hanging testees
# tests/hostile_testee.py serves through the reference testee and misbehaves once, on the second decode:
# the second of these four decode cases must fail with what happened, the others pass on a restarted or
# still-running testee, and the run must write its report.
HOSTILE = os.path.join(ROOT, "tests", "hostile_testee.py")
FOUR_DECODES = "Required.Affine.AgreesWithDequantizeLinear.Int4*"
SECOND = "Required.Affine.AgreesWithDequantizeLinear.Int4_blocked_ZeroPoint"


def _run_hostile(mode: str, tmp_path, timeout: float = 30) -> tuple[subprocess.CompletedProcess, dict]:
    mark = tmp_path / "mark"
    report = tmp_path / "report"
    done = subprocess.run([sys.executable, "-m", "conformance", "run", "--quiet", "--timeout", str(timeout),
                           "--testee", f"{sys.executable} {HOSTILE} {mode} 2 {mark}", "--cases", FOUR_DECODES,
                           "--report-dir", str(report)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert (report / "results.json").exists(), (done.stdout[-2000:], done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    results = {r["id"]: r for r in json.loads((report / "results.json").read_text())["results"]}
    assert len(results) == 4 and results[SECOND]["verdict"] == "failed", results[SECOND]
    assert all(r["verdict"] == "passed" for case_id, r in results.items() if case_id != SECOND), results
    assert done.stdout.splitlines()[-1] == "3 passed, 1 failed, 0 not supported, 0 expected failures"
    junit = (report / "junit.xml").read_text()
    assert f'name="{SECOND}"' in junit and "<failure" in junit
    return done, results[SECOND]


@pytest.mark.parametrize(("mode", "words"), [
    ("strided", "shape [64] with strides [268435456] reaches element 16911433728, but the data holds 1 float32 "
                "element(s) (4 bytes)"),
    ("negative", "stride -1 of dimension 0 reaches before the start of the data"),
    ("past", "shape [64] with strides [1] reaches element 63, but the data holds 1 uint8 element(s) (1 bytes)"),
])
def test_a_tensor_reaching_past_its_data_fails_the_case(mode, words, tmp_path):
    """Strides the runner would once have handed to as_strided: a segfault, or its own heap in the report."""
    _, result = _run_hostile(mode, tmp_path)
    assert result["message"] == f"testee failure: the testee's answer to decode is malformed: {words}"


def test_a_frame_of_millions_of_empty_tensors_is_refused_before_it_is_parsed(tmp_path):
    _, result = _run_hostile("objects", tmp_path)
    assert "a 22000017-byte Response frame holds more than 262144 objects" in result["message"]
    assert result["message"].endswith("(answering decode); killed; it will be restarted")


@pytest.mark.parametrize(("mode", "words"), [
    ("exit", "the testee exited with status 3 while answering decode; it will be restarted"),
    ("segv", "the testee was killed by SIGSEGV while answering decode; it will be restarted"),
    ("text", "the testee wrote text on stdout (first bytes: 'hell') (answering decode); killed; it will be "
             "restarted"),
])
def test_a_testee_that_dies_or_talks_fails_the_case_saying_how(mode, words, tmp_path):
    _, result = _run_hostile(mode, tmp_path)
    assert result["message"] == f"testee failure: {words}"


def test_a_hung_testee_is_killed_with_its_children(tmp_path):
    """The hung testee started a child that ignores its input: killing the testee alone would orphan it."""
    _, result = _run_hostile("hang", tmp_path, timeout=10)
    assert result["message"] == ("testee failure: the testee did not answer decode within 10 s; killed; it will "
                                 "be restarted")
    child = int((tmp_path / "mark").read_text())
    assert not _alive(child), f"the hung testee's child {child} outlived it"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead, only not yet reaped
    except OSError:
        return False


def test_ownerless_answers_are_released_when_their_case_ends(tmp_path):
    """Each answer lends 32 MiB: kept for the run's life they would add up; released per case they do not."""
    from conformance.cases import load_cases, select
    from conformance.execute import FAILED, run_case

    cases = select(load_cases(), [FOUR_DECODES], None, None, None)
    adapter = runner_side.TesteeAdapter(f"{sys.executable} {HOSTILE} flood 0 {tmp_path / 'mark'}", timeout=60)
    tracemalloc.start()
    try:
        for case in cases:
            result = run_case(case, adapter)
            assert result.verdict == FAILED and "dtype uint8" in result.message, result.message
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
        adapter.shutdown()
    assert held < 32 << 20, f"{held >> 20} MiB still held after {len(cases)} cases"


# -------------------------------------------------------------------------------- values from the wire
def _tensor(dtype: str, shape: list[int], data: bytes, strides: list[int] | None = None, **flags):
    value = P.MESSAGES["Value"]()
    value.tensor.dtype, value.tensor.data = dtype, data
    value.tensor.shape.extend(shape)
    value.tensor.strides.extend(strides or [])
    for name, flag in flags.items():
        setattr(value.tensor, name, flag)
    return value


@pytest.mark.parametrize(("value", "words"), [
    (_tensor("float32", [64], b"\0" * 4, [2**28]), "reaches element 16911433728"),
    (_tensor("float32", [2, 3], b"\0" * 24, [2**62, 1]), "reaches element 4611686018427387906"),
    (_tensor("int8", [3, 3], b"\0" * 9, [3, -1]), "stride -1 of dimension 1 reaches before the start"),
    (_tensor("uint8", [64], b"\1", [1]), "reaches element 63, but the data holds 1 uint8"),
    (_tensor("float32", [2**40], b"\0" * 4, [0]), "decode to more than"),
    (_tensor("float32", [4], b"\0" * 4, [1, 1]), "2 strides for a tensor of 1 dimensions"),
    (_tensor("float32", [8], b"\0" * 4), "needs 32 bytes of data; 4 came"),
    (_tensor("float32", [-1], b""), "negative dimension"),
    (_tensor("float32", [1] * 65, b"\0" * 4), "65 dimensions"),
    (_tensor("object", [1], b"\0" * 8), "not a fixed-width numeric type"),
    (_tensor("float32", [4], b"\0" * 16, ownerless=True), None),
])
def test_tensor_numbers_are_checked_against_the_bytes_sent(value, words):
    lending = P.Lending(limit=8)
    if words is None:  # 16 ownerless bytes against a lending limit of 8
        words = "ownerless values received in one case exceed 8 bytes"
    with pytest.raises(P.ProtocolError, match=re.escape(words)):
        P.from_proto(value, None, lending)


def test_strided_and_broadcast_tensors_decode_within_their_data_and_budget():
    """Honest strided and broadcast layouts still decode; a broadcast cannot turn 256 bytes on the wire into
    256 MiB of elements."""
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    value = P.MESSAGES["Value"]()
    P.to_proto(base[:, ::2], value)
    assert list(value.tensor.strides) == [6, 2]
    assert np.array_equal(P.from_proto(value), base[:, ::2])
    broadcast = P.from_proto(_tensor("int16", [3, 2], np.array([7, 8], np.int16).tobytes(), [0, 1]))
    assert np.array_equal(broadcast, [[7, 8]] * 3)
    assert P.from_proto(_tensor("float32", [0, 5], b"", [9, 1])).shape == (0, 5)
    with pytest.raises(P.ProtocolError, match="decode to more than 67108864 bytes"):
        P.from_proto(_tensor("float32", [1 << 20, 64], b"\0" * 256, [0, 1]))
