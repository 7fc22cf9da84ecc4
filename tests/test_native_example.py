"""The example runtime (conformance/sdk/cpp/example) certified by the suite through the testee for its
five profiles (affine, external-data and the state profiles state, bindings and zero-copy), plus what the
suite cannot set up: a payload file reached through a symbolic link that leaves the model
directory."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import pytest
from native_toolchain import EXAMPLE, ROOT, build

from conformance.adapters import Rejected, load_adapter
from reference_impl import schema

FAILURE_LIST = ROOT / "conformance" / "sdk" / "cpp" / "example" / "expected-failures.txt"
EXTERNAL = '''
ir_version: 10
graph {
  encoded_initializer {
    name: "w"
    affine { storage_type: INT8 scale { data_type: 1 float_data: 0.5 } }
    logical_type { tensor_type { elem_type: 1 shape { dim { dim_value: 4 } } } }
    data_location: EXTERNAL
    external_data { key: "location" value: "w.bin" }
    external_data { key: "offset" value: "4097" }
    external_data { key: "length" value: "4" }
  }
}
'''


@pytest.fixture(scope="module")
def testee():
    return str(build("release") / EXAMPLE)


def test_the_example_is_certified_for_the_profiles_it_claims(testee, tmp_path):
    done = subprocess.run([sys.executable, "-m", "conformance", "run", "--testee", testee, "--quiet",
                           "--failure-list", str(FAILURE_LIST), "--report-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    claimed = ["affine", "external-data", "state", "bindings", "zero-copy"]
    assert sorted(manifest["adapter"]["profiles"]) == sorted(claimed)
    assert manifest["profiles"] == dict.fromkeys(claimed, "certified")
    required = [c for c in manifest["cases"] if c["profile"] in manifest["profiles"] and c["level"] == "Required"]
    assert all(c["verdict"] == "passed" for c in required)
    by_profile = {name: sum(c["profile"] == name for c in required) for name in claimed}
    assert by_profile["state"] >= 90 and by_profile["bindings"] >= 60 and by_profile["zero-copy"] >= 60, by_profile
    verified = subprocess.run([sys.executable, "-m", "conformance", "verify-bundle", str(tmp_path),
                               "--integrity-only"], cwd=ROOT,
                              capture_output=True, text=True)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_external_payload_is_read_at_an_unaligned_offset_past_the_first_page(testee, tmp_path):
    (tmp_path / "w.bin").write_bytes(b"\x7f" * 4097 + bytes([2, 4, 0xFC, 0]) + b"\x7f")
    adapter = load_adapter(testee=testee)
    try:
        values = adapter.decode(schema.parse_text(EXTERNAL).SerializeToString(), "w", str(tmp_path))
    finally:
        adapter.shutdown()
    assert values.dtype.name == "float32" and values.tolist() == [1.0, 2.0, -2.0, 0.0]


def test_a_symbolic_link_out_of_the_model_directory_is_refused(testee, tmp_path):
    """No '..' in the location, yet the file it names resolves outside the model directory. A link that
    stays inside is refused too, as the oracle does: the location is opened component by component
    without following links, so no check of where a link leads can be raced (docs/security.md)."""
    outside = tmp_path / "outside"
    model_dir = tmp_path / "model"
    outside.mkdir()
    model_dir.mkdir()
    (outside / "w.bin").write_bytes(b"\x00" * 4101)
    os.symlink(outside / "w.bin", model_dir / "w.bin")
    adapter = load_adapter(testee=testee)
    try:
        with pytest.raises(Rejected) as rejected:
            adapter.verify(schema.parse_text(EXTERNAL).SerializeToString(), str(model_dir))
        (model_dir / "w.bin").unlink()
        os.symlink("inner/w.bin", model_dir / "w.bin")
        (model_dir / "inner").mkdir()
        (model_dir / "inner" / "w.bin").write_bytes(b"\x00" * 4097 + struct.pack("<4b", 2, 4, -4, 0))
        with pytest.raises(Rejected) as inside:
            adapter.verify(schema.parse_text(EXTERNAL).SerializeToString(), str(model_dir))
        (model_dir / "w.bin").unlink()
        os.rename(model_dir / "inner" / "w.bin", model_dir / "w.bin")  # the same bytes, no link: accepted
        adapter.verify(schema.parse_text(EXTERNAL).SerializeToString(), str(model_dir))
    finally:
        adapter.shutdown()
    assert rejected.value.code == inside.value.code == "EXTERNAL_PATH_INVALID"
