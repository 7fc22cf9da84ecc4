"""The example runtime opens external payloads race-free (conformance/sdk/cpp/example/payload.cc): while
another process swaps a component of the location between a real entry inside the model directory and a
symbolic link to a file outside it, thousands of decodes either read the file inside or are refused,
never the file outside. Checking a resolved path, then opening it by name, read the outside file in
about one decode in two hundred."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest
from native_toolchain import EXAMPLE, build

from conformance.adapters import Rejected, load_adapter
from reference_impl import schema

DECODES = 10_000
INSIDE, OUTSIDE = bytes([2, 4, 0xFC, 0]), bytes([6, 6, 6, 6])
MODEL = '''
ir_version: 10
graph {{
  encoded_initializer {{
    name: "w"
    affine {{ storage_type: INT8 scale {{ data_type: 1 float_data: 0.5 }} }}
    logical_type {{ tensor_type {{ elem_type: 1 shape {{ dim {{ dim_value: 4 }} }} }} }}
    data_location: EXTERNAL
    external_data {{ key: "location" value: "{location}" }}
    external_data {{ key: "length" value: "4" }}
  }}
}}
'''
#: Swaps two directory entries atomically (renameat2 RENAME_EXCHANGE) for as long as it runs: the path
#: is at every moment either the real entry or the link, never missing. A separate process, so the swaps
#: never wait for the test's interpreter.
SWAPPER = '''
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
first, second = (os.fsencode(p) for p in sys.argv[1:])
while True:
    if libc.renameat2(-100, first, -100, second, 2) != 0:
        raise OSError(ctypes.get_errno(), "renameat2")
'''


def _exchange(first, second) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    return hasattr(libc, "renameat2") and libc.renameat2(-100, os.fsencode(first), -100, os.fsencode(second), 2) == 0


@pytest.fixture(scope="module")
def testee():
    return str(build("release") / EXAMPLE)


@pytest.mark.parametrize("location", ["w.bin", "sub/w.bin"], ids=["file-swapped", "directory-swapped"])
def test_a_component_swapped_for_a_link_outside_is_never_read(testee, tmp_path, location):
    model_dir, outside = tmp_path / "model", tmp_path / "outside"
    model_dir.mkdir()
    outside.mkdir()
    (outside / "w.bin").write_bytes(OUTSIDE)
    component = location.split("/")[0]
    if component == "sub":
        (model_dir / "sub").mkdir()
        (model_dir / "sub" / "w.bin").write_bytes(INSIDE)
        (model_dir / "sub.link").symlink_to(outside)
    else:
        (model_dir / "w.bin").write_bytes(INSIDE)
        (model_dir / "w.bin.link").symlink_to(outside / "w.bin")
    real, link = model_dir / component, model_dir / f"{component}.link"
    if not _exchange(real, link) or not _exchange(real, link):
        pytest.skip("this file system cannot exchange two entries atomically (renameat2 RENAME_EXCHANGE)")
    model = schema.parse_text(MODEL.format(location=location)).SerializeToString()
    counts = {"inside": 0, "outside": 0, "refused": 0}
    adapter = load_adapter(testee=testee)
    swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(real), str(link)])
    try:
        for _ in range(DECODES):
            try:
                values = adapter.decode(model, "w", str(model_dir)).tolist()
            except Rejected as rejected:
                assert rejected.code in ("EXTERNAL_PATH_INVALID", "EXTERNAL_FILE_INVALID"), rejected
                counts["refused"] += 1
                continue
            counts["inside" if values == [1.0, 2.0, -2.0, 0.0] else "outside"] += 1
        assert swapper.poll() is None, "the swapper stopped"
    finally:
        swapper.kill()
        swapper.wait()
        adapter.shutdown()
    assert counts["outside"] == 0, counts
    assert counts["inside"] and counts["refused"], counts  # both states of the path were seen
