"""size_gate on crafted input (docs/security.md): note sizes claiming gigabytes are bounded by the file
(``corrupt``, exit 2, no traceback, no bogus build ID) and a wheel member is streamed, not read whole."""

from __future__ import annotations

import io
import struct
import subprocess
import sys
import tracemalloc
import zipfile
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from size_gate import SizeGateError, measure_elf, measure_path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures" / "elf"
DEFAULT = FIXTURES / "default.so"


def _note_offset(path: Path) -> int:
    with open(path, "rb") as handle:
        return next(seg["p_offset"] for seg in ELFFile(handle).iter_segments() if seg["p_type"] == "PT_NOTE")


@pytest.mark.parametrize("word,value", [(0, 0xFFFFFFF0), (4, 0xFFFFFFF0), (4, 0x7FFFFFFF), (0, 0x1000)],
                         ids=["name-4GiB", "descriptor-4GiB", "descriptor-2GiB", "name-past-segment"])
def test_note_sizes_are_bounded_by_the_note_region(tmp_path, word, value):
    data = bytearray(DEFAULT.read_bytes())
    struct.pack_into("<I", data, _note_offset(DEFAULT) + word, value)
    crafted = tmp_path / "libsg_proto.so"
    crafted.write_bytes(bytes(data))
    with pytest.raises(SizeGateError) as info:
        measure_elf(io.BytesIO(bytes(data)), "crafted")
    assert info.value.code == "corrupt" and "note" in info.value.message
    done = subprocess.run([sys.executable, "-m", "size_gate", "measure", str(crafted)], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "corrupt" in done.stderr and done.stderr.count("\n") == 1


def test_the_untouched_fixture_keeps_its_build_id():
    assert measure_elf(io.BytesIO(DEFAULT.read_bytes()), "fixture").build_id


def test_a_wheel_member_is_streamed(tmp_path):
    """A 64 MiB member (the library padded with zeros, compressing to almost nothing) is measured with
    a peak far below its size; reading it whole then copying it to a buffer took about twice."""
    size = 64 << 20
    library = DEFAULT.read_bytes()
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("pkg/libsg_proto.so", library + bytes(size - len(library)))
    tracemalloc.start()
    try:
        metrics = measure_path(wheel, "libsg_proto.so")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert metrics.installed_bytes == size and metrics.build_id
    assert peak < size // 8, peak
