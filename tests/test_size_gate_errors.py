"""Unusable input: every problem is one classified SizeGateError naming the file, never a traceback."""

from __future__ import annotations

import io
import os
import random
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from size_gate import ERROR_CODES, LibraryMetrics, SizeGateError, measure_elf, measure_path
from size_gate.cli import main

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures" / "elf"
DEFAULT = FIXTURES / "default.so"
NOSHDR = FIXTURES / "default-noshdr.so"


def _error(data: bytes, name: str = "lib.so") -> SizeGateError:
    with pytest.raises(SizeGateError) as err:
        measure_elf(io.BytesIO(data), name)
    assert err.value.path == name and err.value.code in ERROR_CODES
    assert name in str(err.value)
    return err.value


def _patch(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def _section_offset(path: Path, name: str) -> int:
    with open(path, "rb") as f:
        return ELFFile(f).get_section_by_name(name)["sh_offset"]


# -- not ELF ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("content,code", [
    (b"", "not-elf"),
    (b"/* GNU ld script */\nGROUP ( /lib/libc.so.6 )\n", "not-elf"),
    (b"\x89PNG\r\n\x1a\n" + bytes(64), "not-elf"),
    (b"\x7fEL", "truncated"),
    (b"\x7fELF\x02\x01", "truncated"),
    (b"\x7fELF\x03\x01\x01" + bytes(64), "corrupt"),
    (b"\x7fELF\x02\x07\x01" + bytes(64), "corrupt"),
])
def test_non_elf_and_bad_identification(content, code):
    assert _error(content).code == code


def test_relocatable_object_is_not_a_shared_library():
    data = _patch(DEFAULT.read_bytes(), 0x10, "<H", 1)  # e_type = ET_REL
    err = _error(data)
    assert err.code == "not-shared-library" and "ET_REL" in err.message


# -- truncated -------------------------------------------------------------------------------------
def test_every_truncation_of_a_library_is_reported_as_truncated():
    data = DEFAULT.read_bytes()
    cuts = sorted({1, 3, 4, 5, 16, 40, 63, 64, 65, 120, len(data) // 2, len(data) - 1}
                  | set(range(7, len(data), 211)))
    for n in cuts:
        err = _error(data[:n])
        assert err.code == "truncated", (n, err)
        assert "end" in err.message


def test_truncating_a_library_without_section_headers_never_crashes():
    data = NOSHDR.read_bytes()
    full = measure_elf(io.BytesIO(data), "x")
    for n in range(1, len(data), 97):
        try:
            m = measure_elf(io.BytesIO(data[:n]), "x")
        except SizeGateError as err:
            assert err.code == "truncated", (n, err)
        else:  # only trailing non-loaded bytes were cut
            assert m.symbols == full.symbols and m.needed == full.needed


# -- corrupt ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("offset,fmt,value,code,words", [
    (0x3A, "<H", 7, "corrupt", "entry size"),            # e_shentsize too small
    (0x3E, "<H", 999, "corrupt", "e_shstrndx"),          # section name table index out of range
    (0x28, "<Q", 1 << 40, "truncated", "section header table"),  # e_shoff far past the end
    (0x20, "<Q", 1 << 40, "truncated", "program header table"),  # e_phoff far past the end
    (0x3C, "<H", 0xFF00, "truncated", "section header table"),   # e_shnum larger than the file
])
def test_corrupt_header_fields(offset, fmt, value, code, words):
    err = _error(_patch(DEFAULT.read_bytes(), offset, fmt, value))
    assert err.code == code and words in err.message


def test_symbol_name_outside_string_table():
    data = DEFAULT.read_bytes()
    with open(DEFAULT, "rb") as f:
        dynsym = ELFFile(f).get_section_by_name(".dynsym")
        index = next(i for i, s in enumerate(dynsym.iter_symbols()) if s["st_shndx"] != "SHN_UNDEF")
        at = dynsym["sh_offset"] + index * dynsym["sh_entsize"]  # that defined symbol's st_name
    err = _error(_patch(data, at, "<I", 0xFFFFFFF0))
    assert err.code == "corrupt" and "string table" in err.message


def test_hostile_gnu_hash_bucket_count_is_refused_quickly():
    data = NOSHDR.read_bytes()  # same bytes as default.so apart from the section-header fields
    at = _section_offset(DEFAULT, ".gnu.hash")
    err = _error(_patch(data, at, "<I", 0xFFFFFFFF))  # nbuckets = 4 Gi
    assert err.code == "truncated" and "DT_GNU_HASH" in err.message


def test_gnu_hash_chain_running_into_the_end_of_the_file_is_corrupt():
    data = NOSHDR.read_bytes()
    at = _section_offset(DEFAULT, ".gnu.hash")
    nbuckets, symoffset, bloom_size, _ = struct.unpack_from("<4I", data, at)
    chains_at = at + 16 + 8 * bloom_size + 4 * nbuckets
    # Every bucket starts the chain of symbol index `last`, whose chain word would lie just past the end.
    last = symoffset + (len(data) - chains_at) // 4
    patched = bytearray(data)
    struct.pack_into(f"<{nbuckets}I", patched, at + 16 + 8 * bloom_size, *[last] * nbuckets)
    err = _error(bytes(patched[:chains_at + 4 * (last - symoffset)]))
    assert err.code == "corrupt" and "DT_GNU_HASH chain" in err.message


def test_random_corruption_yields_metrics_or_a_classified_error():
    """Mutated libraries either still measure or raise SizeGateError; nothing else escapes."""
    rng = random.Random(20260920)
    outcomes = {"measured": 0, "error": 0}
    for source in (DEFAULT, NOSHDR, FIXTURES / "versioned.so", FIXTURES / "i386.so"):
        original = source.read_bytes()
        for _ in range(150):
            data = bytearray(original)
            for _ in range(rng.randint(1, 4)):
                at = rng.randrange(len(data) if rng.random() < 0.5 else 0x40)
                data[at] = rng.randrange(256)
            try:
                result = measure_elf(io.BytesIO(bytes(data)), "fuzzed.so")
            except SizeGateError as err:
                assert err.code in ERROR_CODES and err.path == "fuzzed.so"
                outcomes["error"] += 1
            else:
                assert isinstance(result, LibraryMetrics)
                outcomes["measured"] += 1
    assert outcomes["measured"] and outcomes["error"]


# -- paths, directories, wheels --------------------------------------------------------------------
def test_missing_path(tmp_path):
    with pytest.raises(SizeGateError) as err:
        measure_path(tmp_path / "absent.so", "*")
    assert err.value.code == "not-found" and err.value.path == str(tmp_path / "absent.so")


@pytest.mark.parametrize("content", [b"PK\x03\x04 this is not really a zip", b"plain text"])
def test_broken_wheel(tmp_path, content):
    wheel = tmp_path / "broken-1.0-py3-none-any.whl"
    wheel.write_bytes(content)
    with pytest.raises(SizeGateError) as err:
        measure_path(wheel, "*.so*")
    assert err.value.code == "bad-wheel" and err.value.path == str(wheel)


def test_wheel_without_the_library(tmp_path):
    wheel = tmp_path / "pure-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("pure/__init__.py", "")
    with pytest.raises(SizeGateError) as err:
        measure_path(wheel, "*onnx_proto*.so*")
    assert err.value.code == "no-match" and "1 files searched" in err.value.message


def test_wheel_member_that_is_not_elf(tmp_path):
    wheel = tmp_path / "odd-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("odd/libonnx_proto.so", "INPUT(-lfoo)")
    with pytest.raises(SizeGateError) as err:
        measure_path(wheel, "*onnx_proto*.so*")
    assert err.value.code == "not-elf" and err.value.path == f"{wheel}!odd/libonnx_proto.so"


# -- command line ------------------------------------------------------------------------------------
def test_cli_exit_2_names_file_and_problem(tmp_path, capsys):
    bad = tmp_path / "libonnx_proto.so"
    bad.write_bytes(DEFAULT.read_bytes()[:1000])
    assert main(["measure", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("size_gate: error [truncated] " + str(bad)) and err.count("\n") == 1


def test_cli_unwritable_report_is_exit_2(tmp_path, capsys):
    assert main(["compare", str(DEFAULT), str(DEFAULT), "--json-out", str(tmp_path)]) == 2
    assert "[io-error]" in capsys.readouterr().err


def test_cli_as_a_new_user_runs_it(tmp_path):
    """`python -m size_gate` on a text file: exit 2, one line on stderr, no traceback."""
    notes = tmp_path / "notes.txt"
    notes.write_text("not a library\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "size_gate", "check", str(notes)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, check=False)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert done.stderr == (f"size_gate: error [not-elf] {notes}: the file does not start with the ELF "
                           f"magic 7f 45 4c 46 (found 6e 6f 74 20)\n")


def test_unreadable_special_file():
    if not Path("/dev/null").exists():
        pytest.skip("no /dev/null")
    with pytest.raises(SizeGateError) as err:
        measure_path("/dev/null", "*")
    assert err.value.code == "unreadable"


def test_directory_copy_is_independent(tmp_path):
    """A directory holding only non-matching files gives no-match, not a crash."""
    shutil.copyfile(DEFAULT, tmp_path / "libother.so")
    with pytest.raises(SizeGateError) as err:
        measure_path(tmp_path, "*onnx_proto*")
    assert err.value.code == "no-match"
