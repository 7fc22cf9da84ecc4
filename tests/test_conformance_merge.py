"""Sharded certification: ``run --shard i/4`` four times, then ``merge`` into one report and one bundle that
``verify-bundle`` accepts; shards that are missing, duplicated or from another run are rejected."""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest

from conformance import bundle, reports
from conformance.cases import load_cases, select
from conformance.cli import main
from conformance.execute import Result
from conformance.runner import RunInfo

SELECTION = ["--cases", "Required.Wire"]  # cases over several profiles, split over four shards
SHARDS = 4


def _run(directory: pathlib.Path, *extra: str) -> int:
    return main(["run", *SELECTION, "--quiet", "--report-dir", str(directory), *extra])


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> pathlib.Path:
    """Shards s1..s4 of the selection, the same selection unsharded, and a 1/3 shard."""
    root = tmp_path_factory.mktemp("runs")
    for index in range(1, SHARDS + 1):
        assert _run(root / f"s{index}", "--shard", f"{index}/{SHARDS}") == 0
    assert _run(root / "whole") == 0
    assert _run(root / "third", "--shard", "1/3") == 0
    return root


@pytest.fixture
def shards(runs, tmp_path) -> list[pathlib.Path]:
    """A private copy of the four shards, free to be altered."""
    copies = []
    for index in range(1, SHARDS + 1):
        copies.append(pathlib.Path(shutil.copytree(runs / f"s{index}", tmp_path / f"s{index}")))
    return copies


def _merge(capsys, directories, out: pathlib.Path) -> tuple[int, str]:
    capsys.readouterr()
    status = main(["merge", *map(str, directories), "--report-dir", str(out)])
    return status, capsys.readouterr().out


def _rejected(capsys, directories, out: pathlib.Path, *fragments: str) -> str:
    status, text = _merge(capsys, directories, out)
    assert status == 2, text
    assert "nothing written" in text and not out.exists()
    for fragment in fragments:
        assert fragment in text, text
    return text


def _rewrite(directory: pathlib.Path, results=None, run=None) -> None:
    """Rewrite a shard's report and bundle consistently (as a runner that recorded different facts would),
    so that only the merge's own checks can catch the difference."""
    recorded = json.loads((directory / "results.json").read_text())
    waivers = json.loads((directory / bundle.MANIFEST).read_text())["waivers"]
    entries = results(recorded["results"]) if results else recorded["results"]
    info = RunInfo(**(run(recorded["run"]) if run else recorded["run"]))
    shutil.rmtree(directory / "cases")
    outcome = [Result(**entry) for entry in entries]
    reports.write_all(directory, outcome, info, recorded["problems"])
    bundle.write(directory, outcome, info, waivers)


def _results(directory: pathlib.Path) -> list[dict]:
    return json.loads((directory / "results.json").read_text())["results"]


# ------------------------------------------------------------------------------------------------ merged
def test_four_shards_merge_into_the_report_and_bundle_of_the_whole_run(runs, tmp_path, capsys):
    out = tmp_path / "merged"
    status, text = _merge(capsys, [runs / f"s{i}" for i in (3, 1, 4, 2)], out)  # any order
    assert status == 0, text
    total = len(select(load_cases(), ["Required.Wire"]))
    assert total >= SHARDS
    assert text.strip().endswith(f"{total} passed, 0 failed, 0 not supported, 0 expected failures")
    sizes = [len(_results(runs / f"s{i}")) for i in range(1, 5)]
    assert sum(sizes) == total and max(sizes) - min(sizes) <= 1  # round-robin shards
    whole = runs / "whole"
    strip = lambda entries: [(e["id"], e["verdict"], e["profile"], e["level"]) for e in entries]  # noqa: E731
    assert strip(_results(out)) == strip(_results(whole))  # every case once, in selection order
    merged = json.loads((out / bundle.MANIFEST).read_text())
    single = json.loads((whole / bundle.MANIFEST).read_text())
    for key in ("suite", "spec", "adapter", "profiles", "totals", "cases", "waivers"):
        assert merged[key] == single[key], key
    assert set(merged["files"]) == set(bundle.REPORT_FILES)
    assert len(list((out / "cases").iterdir())) == total
    assert (out / "junit.xml").read_text().count("<testcase ") == total
    run = json.loads((out / "results.json").read_text())["run"]
    assert run["selection"]["shard"] is None and run["selection"]["count"] == total
    assert [s["shard"] for s in run["selection"]["shards"]] == ["1/4", "2/4", "3/4", "4/4"]
    assert bundle.check(out)[1] == []
    assert main(["verify-bundle", str(out), "--integrity-only"]) == 0


def test_failure_list_problems_of_the_shards_carry_into_the_merge(runs, tmp_path, capsys):
    passing = _results(runs / "s2")[0]["id"]
    listed = tmp_path / "failures.txt"
    listed.write_text(f"{passing}  # a failure that no longer happens\n")
    directories = []
    for index in range(1, SHARDS + 1):
        directories.append(tmp_path / f"s{index}")
        _run(directories[-1], "--shard", f"{index}/{SHARDS}", "--failure-list", str(listed))
    status, text = _merge(capsys, directories, tmp_path / "merged")
    assert status == 1
    assert f"FAILURE LIST: line 1: {passing} is listed as failing but now passes" in text
    assert "Failure-list problems" in (tmp_path / "merged" / "summary.md").read_text()
    manifest = json.loads((tmp_path / "merged" / bundle.MANIFEST).read_text())
    assert manifest["waivers"] == [{"pattern": passing, "message": "a failure that no longer happens"}]
    assert bundle.check(tmp_path / "merged")[1] == []


# ---------------------------------------------------------------------------------------------- missing
def test_a_missing_shard_is_rejected(shards, tmp_path, capsys):
    _rejected(capsys, shards[:3], tmp_path / "merged", "MERGE: shard 4/4 is missing")


def test_a_case_of_the_selection_in_no_shard_is_rejected(shards, tmp_path, capsys):
    dropped = _results(shards[1])[-1]["id"]
    _rewrite(shards[1], results=lambda entries: entries[:-1])
    assert bundle.check(shards[1])[1] == []  # the shard on its own is a sound bundle
    _rejected(capsys, shards, tmp_path / "merged", f"MERGE: {dropped} of the selection is in no shard")


# ------------------------------------------------------------------------------------------- duplicated
def test_the_same_shard_twice_is_rejected(shards, tmp_path, capsys):
    copy = shutil.copytree(shards[2], tmp_path / "s3-again")
    _rejected(capsys, shards + [copy], tmp_path / "merged", "MERGE: shard 3/4 is given 2 times")
    _rejected(capsys, [shards[0], shards[1], shards[2], shards[2]], tmp_path / "merged",
              "MERGE: shard 3/4 is given 2 times", "MERGE: shard 4/4 is missing")


def test_a_case_in_two_shards_is_rejected(shards, tmp_path, capsys):
    borrowed = _results(shards[1])[0]
    _rewrite(shards[0], results=lambda entries: entries + [borrowed])
    _rejected(capsys, shards, tmp_path / "merged", f"MERGE: {borrowed['id']} is in more than one shard: shard 1/4")


# ------------------------------------------------------------------------------------------- mismatched
def test_a_shard_of_another_shard_count_is_rejected(runs, shards, tmp_path, capsys):
    _rejected(capsys, [runs / "third"] + shards[1:], tmp_path / "merged", "the shards differ in shard count")


def test_a_shard_of_another_adapter_is_rejected(shards, tmp_path, capsys):
    other = tmp_path / "onnx-reference"
    _run(other, "--shard", f"4/{SHARDS}", "--adapter", "onnx-reference")
    _rejected(capsys, shards[:3] + [other], tmp_path / "merged", "the shards differ in adapter name",
              "the shards differ in adapter identity")


def test_a_shard_of_another_selection_is_rejected(shards, tmp_path, capsys):
    other = tmp_path / "level"
    main(["run", *SELECTION, "--level", "Required", "--quiet", "--shard", f"4/{SHARDS}", "--report-dir", str(other)])
    _rejected(capsys, shards[:3] + [other], tmp_path / "merged", "the shards differ in level")


@pytest.mark.parametrize("field,value,message", [
    (("suite", "version"), "0.9.0", "suite version 0.9.0 is not this suite's"),
    (("spec", "revision"), "2025-01-01", "spec revision"),
])
def test_a_shard_of_another_suite_spec_or_corpus_is_rejected(shards, tmp_path, capsys, field, value, message):
    def change(run: dict) -> dict:
        run[field[0]] = {**run[field[0]], field[1]: value}
        return run

    _rewrite(shards[2], run=change)
    _rejected(capsys, shards, tmp_path / "merged", message)


def _edit_manifest(directory: pathlib.Path, change) -> None:
    """Change a shard's manifest and recompute its own digest, as anyone holding the files can."""
    manifest = json.loads((directory / bundle.MANIFEST).read_text())
    manifest.pop("manifest_sha256")
    change(manifest)
    manifest["manifest_sha256"] = bundle._digest(bundle._canonical(manifest))
    (directory / bundle.MANIFEST).write_text(json.dumps(manifest))


def test_a_shard_of_another_corpus_is_rejected(shards, tmp_path, capsys):
    _edit_manifest(shards[2], lambda m: m["corpus"].update(sha256="0" * 64))
    _rejected(capsys, shards, tmp_path / "merged", f"the run's cases digest {'0' * 64} is not this corpus's")


def test_shards_of_another_corpus_are_rejected_even_when_they_agree(shards, tmp_path, capsys):
    for shard in shards:
        _edit_manifest(shard, lambda m: m["corpus"].update(files_sha256="f" * 64))
    _rejected(capsys, shards, tmp_path / "merged", f"case definitions and builders digest {'f' * 64}")


def test_an_unsharded_run_or_an_altered_shard_is_not_a_shard(runs, shards, tmp_path, capsys):
    _rejected(capsys, shards[:3] + [runs / "whole"], tmp_path / "merged", "not a shard (its run had no --shard i/n)")
    results = json.loads((shards[0] / "results.json").read_text())
    results["results"][0]["verdict"] = "failed"
    (shards[0] / "results.json").write_text(json.dumps(results))
    _rejected(capsys, shards, tmp_path / "merged", "results.json does not match its recorded SHA-256")


def test_the_vendor_workflow_runs_every_shard_and_merges_them():
    yaml = pytest.importorskip("yaml")
    workflow = yaml.safe_load((pathlib.Path(__file__).resolve().parents[1] / "ci" / "vendor-certify.yml").read_text())
    shards = int(workflow["env"]["SHARDS"])
    assert workflow["jobs"]["shard"]["strategy"]["matrix"]["shard"] == list(range(1, shards + 1))
    assert workflow["jobs"]["shard"]["env"]["SHARD"] == "${{ matrix.shard }}"
    run = "\n".join(step.get("run", "") for step in workflow["jobs"]["shard"]["steps"])
    assert '--shard "$SHARD/$SHARDS"' in run
    certify = workflow["jobs"]["certify"]
    assert certify["needs"] == "shard"
    commands = [step.get("run", "") for step in certify["steps"]]
    assert any(c.startswith("python -m conformance merge shards/") for c in commands)
    assert "python -m conformance verify-bundle certification --integrity-only" in commands
