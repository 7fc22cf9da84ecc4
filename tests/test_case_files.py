"""A case's ``files`` keys name files inside its working directory and nowhere else (conformance/
case_files.py): a data-only corpus with an absolute, '..', or otherwise escaping key is a one-line suite
error naming the case, and writing never follows a symbolic link planted in the working directory."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from conformance.adapters import SuiteError
from conformance.cases import load_cases

ROOT = pathlib.Path(__file__).resolve().parents[1]
CASE = '''
[[case]]
id = "Recommended.External.Files.Key"
clause = ["PAY-EXTERNAL-EXTENT"]
op = "decode"
profile = "external-data"
value = "w"
model_text = """
ir_version: 10
graph {{
  encoded_initializer {{
    name: "w"
    affine {{ storage_type: INT8 scale {{ data_type: 1 float_data: 0.5 }} }}
    logical_type {{ tensor_type {{ elem_type: 1 shape {{ dim {{ dim_value: 4 }} }} }} }}
    data_location: EXTERNAL
    external_data {{ key: "location" value: "w.bin" }}
    external_data {{ key: "length" value: "4" }}
  }}
}}
"""
files = {{ {key} = {{ hex = "02 04 FC 00" }}, "w.bin" = {{ hex = "02 04 FC 00" }} }}
expect = {{ values = {{ dtype = "float32", shape = [4], data = [1.0, 2.0, -2.0, 0.0] }} }}
'''
ESCAPING = ['"/tmp/escaped.bin"', '"../escaped.bin"', '"sub/../../escaped.bin"', '"sub/../w2.bin"', '"./w2.bin"',
            '"sub//w2.bin"', '"sub/"', '"C:escaped.bin"', '"sub\\\\..\\\\..\\\\escaped.bin"', '"line\\nbreak.bin"',
            '""', '"' + "x" * 300 + '"', '"w.bin/inner.bin"']


def _corpus(tmp_path, key: str):
    corpus = tmp_path / "corpus"
    (corpus / "cases").mkdir(parents=True, exist_ok=True)
    (corpus / "cases" / "files.toml").write_text(CASE.format(key=key))
    return corpus


def test_the_corpus_used_here_is_valid_with_a_key_inside(tmp_path):
    (case,) = load_cases(str(_corpus(tmp_path, '"sub/deeper/w2.bin"')))
    work = tmp_path / "work"
    work.mkdir()
    case.write_files(work)
    assert (work / "sub" / "deeper" / "w2.bin").read_bytes() == bytes.fromhex("0204fc00")


@pytest.mark.parametrize("key", ESCAPING)
def test_a_key_leaving_the_case_directory_is_a_one_line_suite_error_naming_the_case(tmp_path, key):
    corpus = _corpus(tmp_path, key)
    with pytest.raises(SuiteError) as error:
        load_cases(str(corpus))
    assert "Recommended.External.Files.Key" in str(error.value) and "files key" in str(error.value)
    assert "\n" not in str(error.value)
    done = subprocess.run([sys.executable, "-m", "conformance", "run", "--adapter", "reference", "--corpus",
                           str(corpus), "--quiet", "--report-dir", str(tmp_path / "report")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stderr.startswith("conformance: ") and "Recommended.External.Files.Key" in done.stderr
    assert "files key" in done.stderr
    assert not (tmp_path / "escaped.bin").exists() and not os.path.exists("/tmp/escaped.bin")


@pytest.mark.parametrize("planted", ["sub", "w.bin"])
def test_writing_never_follows_a_symbolic_link_in_the_working_directory(tmp_path, planted):
    (case,) = load_cases(str(_corpus(tmp_path, '"sub/w2.bin"')))
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (outside / "w.bin").write_bytes(b"kept")
    (work / planted).symlink_to(outside if planted == "sub" else outside / "w.bin")
    with pytest.raises(SuiteError) as error:
        case.write_files(work)
    assert "Recommended.External.Files.Key" in str(error.value)
    assert sorted(p.name for p in outside.iterdir()) == ["w.bin"] and (outside / "w.bin").read_bytes() == b"kept"


@pytest.mark.parametrize("model", ['"/etc/hostname"', '"../outside.txtpb"', '"sub/../../outside.txtpb"'])
def test_a_model_path_leaving_the_corpus_is_a_one_line_suite_error(tmp_path, model):
    corpus = tmp_path / "corpus"
    (corpus / "cases").mkdir(parents=True)
    (tmp_path / "outside.txtpb").write_text("ir_version: 10\n")
    entry = CASE.split("model_text")[0] + f"model = {model}\n" + 'expect = { accepted = true }\n'
    (corpus / "cases" / "model.toml").write_text(entry.replace("{{", "{").replace("}}", "}"))
    with pytest.raises(SuiteError) as error:
        load_cases(str(corpus))
    assert "model path" in str(error.value) and "Recommended.External.Files.Key" in str(error.value)


def test_a_filled_file_larger_than_the_cap_is_refused_before_allocating(tmp_path):
    corpus = _corpus(tmp_path, '"w2.bin"')
    manifest = corpus / "cases" / "files.toml"
    manifest.write_text(manifest.read_text().replace('"w2.bin" = { hex = "02 04 FC 00" }',
                                                     '"w2.bin" = { size = 1099511627776 }'))
    (case,) = load_cases(str(corpus))
    with pytest.raises(SuiteError, match="size <= "):
        case.build()
