"""``python -m reference_impl``: the demonstration and the verify command a user runs on a model file."""

from __future__ import annotations

import subprocess
import sys

from reference_impl import examples


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "reference_impl", *args], capture_output=True, text=True,
                          timeout=120)


def test_demo_prints_the_spec_figures():
    done = _run("demo")
    assert done.returncode == 0, done.stderr
    assert "codebook_32           12 bytes =   1 records x 12 bytes" in done.stdout
    assert "int4_block_8192     5120 bytes = 256 records x 20 bytes" in done.stdout


def test_verify_accepts_and_rejects_with_a_code(tmp_path):
    model = examples.spec_example_model()
    good = tmp_path / "good.onnx"
    good.write_bytes(model.SerializeToString())
    done = _run("verify", str(good))
    assert done.returncode == 0 and done.stdout.startswith("accepted")
    model.struct_types[0].type_id = 0
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(model.SerializeToString())
    done = _run("verify", str(bad))
    assert done.returncode == 1
    assert "TYPE_ID_ZERO at model.struct_types[0].type_id" in done.stdout and "Traceback" not in done.stderr
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\xff\xff\xff")
    done = _run("verify", str(garbage))
    assert done.returncode == 1 and "MODEL_PARSE_ERROR" in done.stdout


def test_verify_of_a_missing_file_is_a_clear_error(tmp_path):
    done = _run("verify", str(tmp_path / "missing.onnx"))
    assert done.returncode == 2 and "cannot read" in done.stderr and "Traceback" not in done.stderr


def test_verify_refuses_what_is_not_a_regular_file(tmp_path):
    """/dev/zero was read until memory ran out and a FIFO blocked forever: both are refused at once."""
    import os

    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)
    for path in ("/dev/zero", str(fifo), str(tmp_path)):
        done = _run("verify", path)
        assert done.returncode == 2 and "cannot read" in done.stderr and "Traceback" not in done.stderr, path
    assert "a character device" in _run("verify", "/dev/zero").stderr
    assert "a FIFO" in _run("verify", str(fifo)).stderr


def test_verify_refuses_a_file_larger_than_any_model_before_reading_it(tmp_path):
    from reference_impl.__main__ import MAX_MODEL_BYTES

    huge = tmp_path / "huge.onnx"
    with open(huge, "wb") as handle:
        handle.truncate(MAX_MODEL_BYTES + 1)  # sparse: no disk space, but reading it would take 2 GiB
    done = _run("verify", str(huge))
    assert done.returncode == 2 and "more than" in done.stderr and "Traceback" not in done.stderr
