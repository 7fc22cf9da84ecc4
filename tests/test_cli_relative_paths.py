"""Paths as the user gives them: every command line of the project, started in a scratch directory with
relative paths, reads and writes where the user stands, and what it writes without being told where goes
under that directory, never into the package's own tree. Child processes of the harness run there too."""

from __future__ import annotations

import ast
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
REGRESSION = ROOT / "corpus" / "regressions" / "verify" / "c1acf6c98134.bin"
LIBRARY = ROOT / "tests" / "fixtures" / "elf" / "default.so"


def _python_m(cwd: pathlib.Path, *args: str, env: dict | None = None,
              timeout: float = 240) -> subprocess.CompletedProcess:
    """``python -m ARGS`` of this checkout from ``cwd``, with none of the caller's FUZZ_* settings."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("FUZZ_")}, **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _valid_model() -> bytes:
    from reference_impl import examples

    return examples.spec_example_model().SerializeToString()


def test_a_user_path_is_made_absolute_against_the_current_directory_and_nothing_else(tmp_path, monkeypatch):
    import argparse

    from reference_impl.cli_paths import default_under_cwd, user_path

    monkeypatch.chdir(tmp_path)
    assert user_path("fz/../corpus") == tmp_path / "fz" / ".." / "corpus"  # no folding: links keep their meaning
    assert user_path("/abs/x") == pathlib.Path("/abs/x")
    assert default_under_cwd("fuzz-runs", "corpus") == tmp_path / "fuzz-runs" / "corpus"
    for bad in ("", "a\0b"):
        with pytest.raises(argparse.ArgumentTypeError):
            user_path(bad)


def test_no_child_process_of_the_tools_is_given_a_directory_of_its_own():
    """fuzz/, size_gate/ and reference_impl/ start children only in the user's directory: no call passes
    ``cwd=`` (fuzz.children.start refuses one)."""
    offenders = []
    for package in ("fuzz", "size_gate", "reference_impl"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and any(k.arg == "cwd" for k in node.keywords):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


# ----------------------------------------------------------------------------------- python -m fuzz run
def test_fuzz_run_reads_relative_paths_from_the_current_directory(tmp_path):
    """Once every job died with `ERROR: The required directory "fz/corpus" does not exist` (jobs ran in
    the package root) and the campaign still exited 0 with a report of 0 executions."""
    result = _python_m(tmp_path, "fuzz", "run", "structured", "--time", "3", "--jobs", "1", "--out", "fz/report",
                       "--corpus", "fz/corpus", "--quiet")
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "fz" / "report" / "report.json").read_text())
    assert report["executions"] > 0, report
    assert report.get("job_failures") == [] and report["findings"] == []
    assert report["corpus"] == str(tmp_path / "fz" / "corpus") and (tmp_path / "fz" / "corpus").is_dir()


def test_fuzz_run_writes_its_defaults_under_the_current_directory(tmp_path):
    result = _python_m(tmp_path, "fuzz", "run", "verify", "--time", "20", "--runs", "20", "--no-seeds", "--quiet")
    assert result.returncode == 0, result.stderr
    (run,) = (tmp_path / "fuzz-runs").glob("verify-*")
    assert json.loads((run / "report.json").read_text())["executions"] >= 20
    assert (tmp_path / "fuzz-runs" / "corpus" / "verify").is_dir()


def test_a_relative_testee_command_is_found_from_the_current_directory(tmp_path):
    testee = tmp_path / "bin" / "testee"
    testee.parent.mkdir()
    testee.write_text(f"#!/bin/sh\nexec {sys.executable} -m conformance.testee \"$@\"\n")
    testee.chmod(0o755)
    result = _python_m(tmp_path, "fuzz", "run", "differential", "--testee", "bin/testee", "--runs", "20",
                       "--no-seeds", "--time", "60", "--out", "out", "--corpus", "corpus", "--quiet",
                       "--fail-on-finding")
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["executions"] >= 20 and report["findings"] == []


def test_a_campaign_whose_job_cannot_start_fails_with_the_jobs_error_line(tmp_path):
    """A testee that does not exist once gave a crash "finding" per job incarnation, counted as restarts
    after findings, and exit status 0; now the job is reported as dead and the command fails with its line."""
    result = _python_m(tmp_path, "fuzz", "run", "differential", "--testee", "./no-such-testee", "--time", "30",
                       "--out", "out", "--corpus", "corpus", "--quiet", "--fail-on-finding")
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert lines[0].startswith("fuzz run: error: job 0 died without a finding (exit status 3): ERROR: ")
    assert "cannot start './no-such-testee'" in lines[0]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["findings"] == [] and report["restarts"] == 0
    assert [f["job"] for f in report["job_failures"]] == [0]
    assert "Jobs that died without a finding" in (tmp_path / "out" / "report.md").read_text()


# ------------------------------------------------------------------------- triage, promote and replay
def test_fuzz_triage_replays_against_a_relative_subject_file(tmp_path):
    """The replay worker runs where the user stands, so a relative adapter file (from the environment or
    from --subject, which is made absolute) is the user's file; it once ran in the package root."""
    (tmp_path / "subject.py").write_text("from conformance.adapters.reference import ReferenceAdapter as Subject\n")
    (tmp_path / "run" / "findings").mkdir(parents=True)
    (tmp_path / "run" / "findings" / "crash-a").write_bytes(b"\x01" + _valid_model())
    result = _python_m(tmp_path, "fuzz", "triage", "run", "--target", "differential", "--no-minimize",
                       env={"FUZZ_SUBJECT": "subject.py:Subject"})
    assert result.returncode == 0, result.stdout + result.stderr
    groups = json.loads((tmp_path / "run" / "triage.json").read_text())
    assert [g["signature"] for g in groups] == ["not-reproducible"]
    result = _python_m(tmp_path, "fuzz", "triage", "run", "--target", "differential", "--no-minimize",
                       "--subject", "subject.py:Subject")
    assert result.returncode == 0, result.stdout + result.stderr
    groups = json.loads((tmp_path / "run" / "triage.json").read_text())
    assert groups[0]["environment"]["FUZZ_SUBJECT"] == f"{tmp_path / 'subject.py'}:Subject"


def test_fuzz_promote_writes_under_the_current_directory_by_default(tmp_path):
    (tmp_path / "finding.bin").write_bytes(_valid_model())
    result = _python_m(tmp_path, "fuzz", "promote", "finding.bin", "--target", "verify", "--cases-dir", "cases")
    assert result.returncode == 0, result.stderr
    (record,) = (tmp_path / "corpus" / "regressions" / "verify").glob("*.json")
    assert json.loads(record.read_text())["target"] == "verify"
    assert record.with_suffix(".bin").read_bytes() == _valid_model()
    assert (tmp_path / "cases" / "wire" / "fuzz-verify.toml").is_file()
    relocated = _python_m(tmp_path, "fuzz", "promote", "finding.bin", "--target", "verify",
                          "--regressions-dir", "elsewhere/regressions")
    assert relocated.returncode == 0, relocated.stderr
    assert (tmp_path / "elsewhere" / "regressions" / "verify" / record.with_suffix(".bin").name).is_file()
    assert (tmp_path / "elsewhere" / "regressions" / "cases" / "wire" / "fuzz-verify.toml").is_file()


def test_fuzz_replay_reads_relative_inputs(tmp_path):
    (tmp_path / "inputs").mkdir()
    (tmp_path / "inputs" / "model.bin").write_bytes(_valid_model())
    result = _python_m(tmp_path, "fuzz", "replay", "verify", "inputs/model.bin")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{tmp_path / 'inputs' / 'model.bin'}: no finding\n"


# ------------------------------------------------------------------------- size_gate and reference_impl
def test_size_gate_reads_and_writes_relative_paths(tmp_path):
    (tmp_path / "libs").mkdir()
    shutil.copy(LIBRARY, tmp_path / "libs" / "default.so")
    result = _python_m(tmp_path, "size_gate", "compare", "libs/default.so", "libs/default.so", "--json-out",
                       "report.json", "--format", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "report.json").read_text()) == json.loads(result.stdout)
    missing = _python_m(tmp_path, "size_gate", "measure", "libs/missing.so")
    assert missing.returncode == 2 and str(tmp_path / "libs" / "missing.so") in missing.stderr


def test_reference_impl_verify_reads_relative_paths(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "model.onnx").write_bytes(_valid_model())
    result = _python_m(tmp_path, "reference_impl", "verify", "models/model.onnx", "--base-dir", "models")
    assert result.returncode == 0 and result.stdout.startswith("accepted"), result.stderr


def test_conformance_reads_and_writes_relative_paths(tmp_path):
    """run, sign, verify-bundle and keygen take the user's relative paths; a relative testee path too."""
    testee = tmp_path / "bin" / "testee"
    testee.parent.mkdir()
    testee.write_text(f"#!/bin/sh\nexec {sys.executable} -m conformance.testee \"$@\"\n")
    testee.chmod(0o755)
    case = "Required.Affine.Storage.Int8PerTensor"
    run = _python_m(tmp_path, "conformance", "run", "--cases", case, "--testee", "bin/testee", "--quiet",
                    "--report-dir", "out/report")
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads((tmp_path / "out" / "report" / "results.json").read_text())["results"][0]["id"] == case
    assert _python_m(tmp_path, "conformance", "keygen", "--out", "keys/k").returncode == 0
    assert (tmp_path / "keys" / "k.pem").exists() and (tmp_path / "keys" / "k.pub.pem").exists()
    assert _python_m(tmp_path, "conformance", "sign", "out/report", "--key", "keys/k.pem").returncode == 0
    verified = _python_m(tmp_path, "conformance", "verify-bundle", "out/report", "--trusted-key", "keys/k.pub.pem")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert not (ROOT / "out").exists() and not (ROOT / "keys").exists()
