"""Command-line manners: a reader that closes the pipe early ends a command quietly, and a peer
runtime's own log lines stay out of the suite's output."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from reference_impl.broken_pipe import BROKEN_PIPE_STATUS

ROOT = pathlib.Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "tests" / "fixtures" / "elf" / "default.so"


@pytest.mark.parametrize("command", [
    ["conformance", "list", "--long"],
    ["fuzz", "list"],
    ["size_gate", "measure", str(LIBRARY), "--symbols"],
    ["reference_impl", "demo"],
], ids=lambda command: command[0])
def test_a_closed_output_pipe_ends_the_command_quietly(command):
    """As `python -m ... | head -0`: the reader is gone before the first line, so every write fails."""
    reader, writer = os.pipe()
    os.close(reader)
    try:
        result = subprocess.run([sys.executable, "-m", *command], cwd=ROOT, stdout=writer, stderr=subprocess.PIPE,
                                text=True, timeout=120)
    finally:
        os.close(writer)
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr, result.stderr
    assert "Exception ignored" not in result.stderr, result.stderr
    assert result.returncode == BROKEN_PIPE_STATUS == 141


def test_an_open_pipe_still_gets_everything():
    result = subprocess.run([sys.executable, "-m", "conformance", "list"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120, check=True)
    listed = result.stdout.splitlines()
    assert result.stderr.strip() == f"{len(listed)} cases" and len(listed) > 100


def test_onnxruntime_log_lines_do_not_reach_the_output(tmp_path):
    """A run that onnxruntime rejects (a TensorScatter write past the cache's capacity) makes onnxruntime log
    an error line of its own at its default severity; the adapter silences it."""
    pytest.importorskip("onnxruntime")
    result = subprocess.run([sys.executable, "-m", "conformance", "run", "--adapter", "onnxruntime", "--quiet",
                             "--cases", "Required.KV.Capacity.OverflowWritesNothing",
                             "--report-dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.stdout.strip().endswith("1 passed, 0 failed, 0 not supported, 0 expected failures"), result.stdout
    assert "onnxruntime" not in result.stderr, result.stderr
