"""size_gate metrics against binutils on real libraries and on libraries compiled for the test."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import shutil
import sys
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from size_gate import SizeGateError, measure_path

FIXTURES = Path(__file__).parent / "fixtures" / "elf"
ANY = "*.so*"


def _load(name: str):
    key = f"_size_gate_fixture_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, FIXTURES / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


oracle = _load("binutils_oracle")
gen = _load("fixturegen")
needs_binutils = pytest.mark.skipif(not oracle.available(), reason="binutils (readelf, nm, size) not installed")


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    return Path(next(iter(spec.submodule_search_locations))) if spec and spec.submodule_search_locations else None


def _real_libraries() -> dict[str, Path]:
    """onnxruntime's libraries, two NumPy extension modules and common system libraries, where present."""
    found: dict[str, Path] = {}
    ort = _package_dir("onnxruntime")
    if ort:
        for p in sorted((ort / "capi").glob("*.so*")):
            found[f"onnxruntime:{p.name}"] = p
    np_dir = _package_dir("numpy")
    if np_dir:
        for pattern in ("_core/_multiarray_umath*.so", "core/_multiarray_umath*.so", "linalg/_umath_linalg*.so"):
            for p in sorted(np_dir.glob(pattern))[:1]:
                found[f"numpy:{p.name}"] = p
    for soname in ("libz.so.1", "libstdc++.so.6", "libc.so.6"):
        for d in ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64", "/lib64", "/usr/lib"):
            hits = glob.glob(os.path.join(d, soname))
            if hits:
                found[f"system:{soname}"] = Path(os.path.realpath(hits[0]))
                break
    return found


REAL = _real_libraries()


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> dict[str, Path]:
    """Libraries compiled once per session with the system C compiler."""
    if gen.compiler() is None:
        pytest.skip("no C compiler")
    return gen.build_cached(tmp_path_factory.getbasetemp() / "size_gate_elf")


def assert_matches_binutils(path: Path) -> None:
    m = measure_path(path, ANY)
    ref = oracle.metrics(path)
    assert m.installed_bytes == ref["installed_bytes"]
    assert m.alloc_bytes == ref["alloc_bytes"]  # readelf -S: sections with flag A
    assert m.text_bytes == ref["text_bytes"]
    assert m.section_bytes_total == ref["section_bytes_total"]  # size -A total + BFD-internal tables
    assert list(m.needed) == ref["needed"]
    assert m.build_id == ref["build_id"]
    assert list(m.symbols) == ref["nm_symbols"]
    assert m.defined_symbols == len(ref["nm_symbols"])
    assert list(m.symbols) == oracle.readelf_defined(path)


# -- real libraries ------------------------------------------------------------------------------
@needs_binutils
@pytest.mark.parametrize("name", sorted(REAL))
def test_real_library_matches_binutils(name):
    assert_matches_binutils(REAL[name])


@needs_binutils
@pytest.mark.parametrize("name", [n for n in ("system:libz.so.1", "system:libstdc++.so.6") if n in REAL])
def test_real_library_without_section_headers(name, tmp_path):
    original = measure_path(REAL[name], ANY)
    copy = gen.drop_section_headers(REAL[name], tmp_path / "noshdr.so")
    m = measure_path(copy, ANY)
    assert m.section_headers is False and m.symbol_source == "DT_GNU_HASH"
    assert (m.alloc_bytes, m.text_bytes, m.section_bytes_total) == (None, None, None)
    assert list(m.symbols) == oracle.readelf_defined(copy, use_dynamic=True)
    assert m.symbols == original.symbols
    assert m.needed == original.needed and m.build_id == original.build_id
    assert m.version_definition_symbols == original.version_definition_symbols


def test_real_libraries_were_found():
    """The acceptance list names onnxruntime, NumPy and system libraries; make their absence visible."""
    if not REAL:
        pytest.skip("no onnxruntime, NumPy or system shared libraries on this machine")
    assert any(k.startswith("system:") for k in REAL) or any(k.startswith("onnxruntime:") for k in REAL)


# -- libraries compiled for the test ----------------------------------------------------------------
@needs_binutils
@pytest.mark.parametrize("variant", ["default", "hidden", "libm_needed", "versioned", "sysv", "stripped", "i386"])
def test_built_variant_matches_binutils(built, variant):
    if variant not in built:
        pytest.skip(f"{variant} could not be built here")
    assert_matches_binutils(built[variant])


def test_hidden_visibility_exports_only_marked_symbols(built):
    default = measure_path(built["default"], ANY)
    hidden = measure_path(built["hidden"], ANY)
    assert set(default.symbols) == set(gen.DEFAULT_SYMBOLS)
    assert set(hidden.symbols) == set(gen.API_SYMBOLS)
    assert hidden.defined_symbols == len(gen.API_SYMBOLS) < default.defined_symbols


def test_libm_needed_entry_is_a_full_soname(built):
    default = measure_path(built["default"], ANY)
    extra = measure_path(built["libm_needed"], ANY)
    assert list((Counter(extra.needed) - Counter(default.needed)).elements()) == ["libm.so.6"]


def test_version_definition_symbols_are_counted(built):
    m = measure_path(built["versioned"], ANY)
    defined_versions = {"SG_1", "SG_2"}  # the version script's version nodes
    assert m.version_definition_symbols == len(defined_versions)
    assert defined_versions <= set(m.symbols)
    assert {"sg_add@@SG_1", "sg_counter@@SG_2", "sg_len@@SG_2"} <= set(m.symbols)
    assert m.defined_symbols == len(gen.API_SYMBOLS) + len(defined_versions)


def test_stripped_copy_keeps_dynamic_metrics(built):
    if "stripped" not in built:
        pytest.skip("no strip/objcopy")
    default = measure_path(built["default"], ANY)
    stripped = measure_path(built["stripped"], ANY)
    assert stripped.installed_bytes < default.installed_bytes
    assert stripped.symbols == default.symbols and stripped.needed == default.needed
    assert stripped.alloc_bytes == default.alloc_bytes and stripped.text_bytes == default.text_bytes
    assert stripped.section_bytes_total < default.section_bytes_total


@pytest.mark.parametrize("variant,source", [("default", "DT_GNU_HASH"), ("sysv", "DT_HASH")])
def test_copy_without_section_headers_uses_hash_tables(built, variant, source, tmp_path):
    original = measure_path(built[variant], ANY)
    m = measure_path(gen.drop_section_headers(built[variant], tmp_path / "x.so"), ANY)
    assert m.symbol_source == source
    assert m.symbols == original.symbols and m.needed == original.needed
    assert m.installed_bytes == original.installed_bytes and m.alloc_bytes is None
    if oracle.available():
        assert list(m.symbols) == oracle.readelf_defined(tmp_path / "x.so", use_dynamic=True)


# -- committed fixtures (no compiler needed) -------------------------------------------------------
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())["fixtures"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_committed_fixture_matches_recorded_binutils_values(name):
    m = measure_path(FIXTURES / name, ANY)
    ref = EXPECTED[name]
    for key in ("installed_bytes", "alloc_bytes", "text_bytes", "section_bytes_total", "build_id"):
        assert getattr(m, key) == ref[key], key
    assert list(m.needed) == ref["needed"]
    assert list(m.symbols) == ref["symbols"]


@needs_binutils
@pytest.mark.parametrize("name", sorted(n for n in EXPECTED if "noshdr" not in n))
def test_committed_fixture_record_is_current(name):
    """expected.json must still be what binutils says (it is not trusted blindly)."""
    ref = oracle.metrics(FIXTURES / name)
    ref["symbols"] = ref.pop("nm_symbols")
    assert {k: ref[k] for k in EXPECTED[name]} == EXPECTED[name]


# -- directory and wheel inputs ---------------------------------------------------------------------
def test_directory_is_searched_by_pattern(tmp_path):
    lib = tmp_path / "pkg" / "lib" / "libsg_proto.so.1"
    lib.parent.mkdir(parents=True)
    shutil.copyfile(FIXTURES / "default.so", lib)
    (tmp_path / "pkg" / "libsg_proto.so").symlink_to(lib)  # same file twice: counted once
    (tmp_path / "pkg" / "other.so").write_bytes(b"not a library")
    m = measure_path(tmp_path, "*sg_proto*.so*")
    assert Path(m.path).resolve() == lib.resolve()
    assert m.symbols == measure_path(FIXTURES / "default.so", ANY).symbols
    with pytest.raises(SizeGateError) as err:
        measure_path(tmp_path, "*.so*")
    assert err.value.code == "ambiguous" and "other.so" in err.value.message
    with pytest.raises(SizeGateError) as err:
        measure_path(tmp_path, "libnothing*")
    assert err.value.code == "no-match" and err.value.path == str(tmp_path)


def test_wheel_records_compressed_size(tmp_path):
    wheel = tmp_path / "sg-1.0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.write(FIXTURES / "default.so", "sg/libsg_proto.so")
        zf.writestr("sg/__init__.py", "")
        zf.writestr("sg-1.0.dist-info/RECORD", "")
    m = measure_path(wheel, "*sg_proto*.so*")
    direct = measure_path(FIXTURES / "default.so", ANY)
    assert m.wheel_member == "sg/libsg_proto.so" and m.path.endswith("!sg/libsg_proto.so")
    assert m.installed_bytes == direct.installed_bytes and m.symbols == direct.symbols
    assert m.wheel_bytes == wheel.stat().st_size
    with zipfile.ZipFile(wheel) as zf:
        info = zf.getinfo("sg/libsg_proto.so")
    assert m.compressed_bytes == info.compress_size < m.installed_bytes
