"""``python -m conformance new-adapter``: the skeletons load, follow docs/adapters.md and run clean against
their own first failure list."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from conformance.adapters import Adapter, StateHandle, SuiteError, contract_gaps
from conformance.adapters.lowering import LoweredAdapter, LoweredSession
from conformance.cli import main


def _module(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lowered_skeleton_runs_clean_against_its_first_failure_list(tmp_path, capsys):
    assert main(["new-adapter", "my-rt", "--lowered", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    adapter_file, listing = tmp_path / "my_rt_adapter.py", tmp_path / "my-rt-failures.txt"
    assert adapter_file.exists() and listing.exists() and (tmp_path / "my-rt-report" / "summary.md").exists()
    module = _module(adapter_file)
    assert issubclass(module.MyRtAdapter, LoweredAdapter)
    assert contract_gaps(module.MyRtAdapter, Adapter, ("stateless",)) == []
    assert contract_gaps(module.MyRtSession, LoweredSession) == []
    assert "TODO(my-rt)" in adapter_file.read_text()
    # The printed next command works as written: every failure is listed, nothing else fails.
    command = next(line.strip() for line in out.splitlines() if "--failure-list" in line and "update" not in line)
    done = subprocess.run([sys.executable, *command.split()[1:], "--quiet", "--cases", "Required.Affine.Storage",
                           "--cases", "Required.State.Concurrency"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_plain_skeleton_claims_nothing_until_filled_in(tmp_path):
    assert main(["new-adapter", "rt2", "--dir", str(tmp_path), "--no-run"]) == 0
    module = _module(tmp_path / "rt2_adapter.py")
    assert contract_gaps(module.Rt2Adapter, Adapter) == []
    assert contract_gaps(module.Rt2State, StateHandle) == []
    assert module.Rt2Adapter().profiles() == set()


def test_bad_names_and_existing_files_are_one_line_errors(tmp_path, capsys):
    assert main(["new-adapter", "9lives", "--dir", str(tmp_path), "--no-run"]) == 2
    assert main(["new-adapter", "ok", "--dir", str(tmp_path), "--no-run"]) == 0
    assert main(["new-adapter", "ok", "--dir", str(tmp_path), "--no-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("conformance: ") for line in err)
    with pytest.raises(SuiteError):
        from conformance.scaffold import write

        write("class", False, tmp_path)
