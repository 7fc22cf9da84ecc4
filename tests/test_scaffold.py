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


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("conformance: ") and "Traceback" not in err, err
    return err


def test_a_long_name_and_a_file_as_dir_are_one_line_errors(tmp_path, capsys):
    assert main(["new-adapter", "a" * 5000, "--dir", str(tmp_path), "--no-run"]) == 2
    assert "at most 64" in _one_line_error(capsys)
    assert main(["new-adapter", "a" * 65, "--dir", str(tmp_path), "--no-run"]) == 2
    _one_line_error(capsys)
    (tmp_path / "plain").write_text("kept")
    assert main(["new-adapter", "rt", "--dir", str(tmp_path / "plain"), "--no-run"]) == 2
    assert "not a directory" in _one_line_error(capsys)
    assert main(["new-adapter", "rt", "--dir", str(tmp_path / ("d" * 5000)), "--no-run"]) == 2
    assert len(_one_line_error(capsys)) < 400
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain"] and (tmp_path / "plain").read_text() == "kept"


@pytest.mark.parametrize("planted", ["rt_adapter.py", "rt-failures.txt", "rt-report"])
def test_a_planted_symbolic_link_is_refused_and_its_target_untouched(tmp_path, capsys, planted):
    """Links planted before the command: a dangling one (the target would be created) and one to a file
    (the target would be overwritten) are refused before the suite runs; nothing is written."""
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (outside / "victim").write_text("victim")
    for target in (outside / "victim", outside / "absent"):
        (work / planted).symlink_to(target)
        assert main(["new-adapter", "rt", "--dir", str(work)]) == 2
        assert "symbolic link" in _one_line_error(capsys)
        assert sorted(p.name for p in work.iterdir()) == [planted]
        (work / planted).unlink()
    assert sorted(p.name for p in outside.iterdir()) == ["victim"] and (outside / "victim").read_text() == "victim"


def test_links_planted_while_the_suite_runs_are_not_written_through(tmp_path, capsys, monkeypatch):
    from conformance import runner

    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (outside / "victim").write_text("victim")
    real_run = runner.run

    def run_then_plant(*args, **kwargs):
        done = real_run(*args, **kwargs)
        (work / "rt-failures.txt").symlink_to(outside / "victim")
        (work / "rt-report").symlink_to(outside)
        return done

    monkeypatch.setattr(runner, "run", run_then_plant)
    assert main(["new-adapter", "rt", "--dir", str(work)]) == 2
    assert "rt-failures.txt is a symbolic link" in _one_line_error(capsys)
    assert sorted(p.name for p in outside.iterdir()) == ["victim"] and (outside / "victim").read_text() == "victim"
    (work / "rt-failures.txt").unlink()
    monkeypatch.setattr(runner, "run", real_run)
    assert main(["new-adapter", "rt2", "--dir", str(work)]) == 0  # the same directory, nothing planted
    assert (work / "rt2-failures.txt").is_file() and not (work / "rt2-report").is_symlink()
    assert (work / "rt2-report" / "manifest.json").is_file() and (work / "rt2-report" / "cases").is_dir()


def test_an_existing_failure_list_is_not_replaced(tmp_path, capsys):
    (tmp_path / "rt-failures.txt").write_text("# curated by hand\n")
    assert main(["new-adapter", "rt", "--dir", str(tmp_path)]) == 2
    assert "already exists" in _one_line_error(capsys)
    assert (tmp_path / "rt-failures.txt").read_text() == "# curated by hand\n"
    assert not (tmp_path / "rt_adapter.py").exists()
