"""A findings directory is data from elsewhere: `python -m fuzz triage` and `promote` take only the FUZZ_*
settings of fuzz.finding_env (each checked), never run a recorded testee command or load a recorded adapter
file, check the recorded target, refuse malformed files with one line and exit status 2, and write only
inside the findings or regressions directory, never through a link."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
REGRESSION = ROOT / "corpus" / "regressions" / "verify" / "c1acf6c98134.bin"


def _fuzz(cwd: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m fuzz ARGS`` of this checkout, from ``cwd``, with none of the caller's FUZZ_* settings;
    promotions go to ``cwd/reg``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUZZ_")}
    env["FUZZ_REGRESSIONS_DIR"] = str(cwd / "reg")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "fuzz", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=180)


def _refused(result: subprocess.CompletedProcess, command: str, *fragments: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"fuzz {command}: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def _run_dir(tmp_path: pathlib.Path, report: object = None, data: bytes | None = None) -> pathlib.Path:
    run = tmp_path / "run"
    (run / "findings").mkdir(parents=True)
    (run / "findings" / "crash-a").write_bytes(REGRESSION.read_bytes() if data is None else data)
    if report is not None:
        (run / "report.json").write_text(report if isinstance(report, str) else json.dumps(report))
    return run


def _minimized_finding(tmp_path: pathlib.Path, context: list, data: bytes) -> pathlib.Path:
    """A promotable finding as triage leaves it: ``run/minimized/<id>.bin`` under ``run/triage.json``."""
    (tmp_path / "run" / "minimized").mkdir(parents=True)
    (tmp_path / "run" / "triage.json").write_text(json.dumps(context))
    finding = tmp_path / "run" / "minimized" / "f.bin"
    finding.write_bytes(data)
    return finding


def _valid_model() -> bytes:
    from reference_impl import examples

    return examples.spec_example_model().SerializeToString()


# ------------------------------------------------------------------------------- recorded environment
@pytest.mark.parametrize("key,value", [("LD_PRELOAD", "/tmp/evil.so"), ("PATH", "/tmp/evil-bin"),
                                       ("FUZZ_STATS_FILE", "/etc/passwd")])
def test_a_recorded_key_outside_the_settings_table_makes_the_directory_unusable(tmp_path, key, value):
    run = _run_dir(tmp_path, {"target": "verify", "environment": {key: value}})
    _refused(_fuzz(tmp_path, "triage", "run", "--no-minimize"), "triage", repr(key), "not a setting")
    assert not (run / "triage.json").exists() and not (run / "minimized").exists()


def test_a_recorded_testee_command_is_never_run(tmp_path):
    sentinel = tmp_path / "testee-ran"
    testee = f"sh -c 'touch {sentinel}; exit 1'"
    _run_dir(tmp_path, {"target": "differential", "environment": {"FUZZ_TESTEE": testee}})
    _refused(_fuzz(tmp_path, "triage", "run", "--no-minimize"), "triage", "never run", "--testee")
    assert not sentinel.exists()
    finding = _minimized_finding(tmp_path, [{"target": "differential", "environment": {"FUZZ_TESTEE": testee}}],
                                 b"\x01" + _valid_model())
    _refused(_fuzz(tmp_path, "promote", str(finding)), "promote", "--testee")
    assert not sentinel.exists() and not (tmp_path / "reg").exists()
    # Named on the command line, another subject replays them; the recorded command still never runs.
    result = _fuzz(tmp_path, "triage", "run", "--no-minimize", "--subject", "reference")
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "run" / "triage.json").read_text())[0]["signature"] == "not-reproducible"
    assert not sentinel.exists()


@pytest.mark.parametrize("spec", ["{evil}:Adapter", "evil.py:Adapter", "os:getcwd", "fuzz.subjects:os"])
def test_a_recorded_subject_is_loaded_only_from_the_project(tmp_path, spec):
    sentinel = tmp_path / "adapter-imported"
    evil = tmp_path / "evil.py"
    evil.write_text(f"import pathlib\npathlib.Path({str(sentinel)!r}).touch()\n"
                    "from conformance.adapters.reference import ReferenceAdapter as Adapter\n")
    _run_dir(tmp_path, {"target": "differential", "environment": {"FUZZ_SUBJECT": spec.format(evil=evil)}})
    _refused(_fuzz(tmp_path, "triage", "run", "--no-minimize"), "triage", "FUZZ_SUBJECT")
    assert not sentinel.exists()


def test_the_settings_table_checks_every_value():
    from fuzz.finding_env import SETTINGS, validated
    from fuzz.findings_io import FindingsError

    good = {"FUZZ_SUBJECT": "conformance.audit.faults.state:PublishesAfterFailure", "FUZZ_FAULT": "code-swap",
            "FUZZ_STRICT": "1", "FUZZ_PROBE_KNOWN": "0", "FUZZ_RTOL": "1e-6", "FUZZ_ATOL": "0",
            "FUZZ_TESTEE_TIMEOUT": "10", "FUZZ_TIME_BUDGET": "2.5", "FUZZ_HANG_AFTER": "0",
            "FUZZ_MEMORY_BUDGET_MB": "1024", "FUZZ_ADDRESS_SPACE_MB": "4096"}
    assert set(good) == set(SETTINGS)
    assert validated({**good, "FUZZ_TESTEE": "./testee"}, "report.json") == (good, "./testee")
    bad = {"FUZZ_SUBJECT": "conformance.audit.faults_state:Patch", "FUZZ_FAULT": "rm -rf",
           "FUZZ_STRICT": "yes", "FUZZ_PROBE_KNOWN": "2", "FUZZ_RTOL": "nan", "FUZZ_ATOL": "-1",
           "FUZZ_TESTEE_TIMEOUT": "0", "FUZZ_TIME_BUDGET": "1e400", "FUZZ_HANG_AFTER": "inf",
           "FUZZ_MEMORY_BUDGET_MB": "1.5", "FUZZ_ADDRESS_SPACE_MB": "99999999999"}
    assert set(bad) == set(SETTINGS)
    for key, value in bad.items():
        with pytest.raises(FindingsError, match=key):
            validated({key: value}, "report.json")
    for recorded in ({"FUZZ_STRICT": 1}, {"FUZZ_FAULT": "code-swap" * 40}, ["FUZZ_STRICT=1"]):
        with pytest.raises(FindingsError):
            validated(recorded, "report.json")


def test_a_replay_worker_takes_replay_settings_and_known_targets_only():
    from fuzz.replay import ReplayWorker

    with pytest.raises(ValueError, match="LD_PRELOAD"):
        ReplayWorker("verify", environment={"LD_PRELOAD": "/tmp/evil.so"})
    with pytest.raises(ValueError, match="unknown target"):
        ReplayWorker("../verify")


def test_the_docs_list_exactly_the_settings_a_finding_may_carry():
    from fuzz.finding_env import SETTINGS, TESTEE_KEY

    text = (ROOT / "docs" / "fuzzing.md").read_text()
    section = text[text.index("## Findings from elsewhere"):]
    section = section[:section.index("\n## ", 1)]
    rows = {line.split("|")[1].strip().strip("`") for line in section.splitlines()
            if line.startswith("| `FUZZ_")}
    assert rows == {*SETTINGS, TESTEE_KEY}


# ------------------------------------------------------------------------------------- recorded target
def test_the_recorded_target_must_be_a_target(tmp_path):
    _run_dir(tmp_path, {"target": "../../escaped", "environment": {}})
    _refused(_fuzz(tmp_path, "triage", "run", "--no-minimize"), "triage", "'../../escaped'", "not one of")
    finding = _minimized_finding(tmp_path, [{"target": "../escaped", "environment": {}}], _valid_model())
    _refused(_fuzz(tmp_path, "promote", str(finding)), "promote", "'../escaped'")
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "reg").exists()


# -------------------------------------------------------------------------------------------- writes
def _plant(tmp_path: pathlib.Path, where: str) -> tuple[pathlib.Path, pathlib.Path]:
    """A finding of the verify target and a link at ``where`` (under the regressions directory ``reg``)
    pointing outside it; returns (finding, what the link points at)."""
    from fuzz.promote import stable_id

    data = _valid_model()
    finding = _minimized_finding(tmp_path, [{"target": "verify", "environment": {}}], data)
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim"
    victim.write_text("untouched\n")
    link = tmp_path / "reg" / where.format(id=stable_id("verify", data))
    link.parent.mkdir(parents=True)
    link.symlink_to(outside if where == "verify" else victim)
    return finding, victim


@pytest.mark.parametrize("where", ["verify", "verify/{id}.bin", "verify/{id}.json", "cases/wire/fuzz-verify.toml"])
def test_promote_never_writes_through_a_link(tmp_path, where):
    finding, victim = _plant(tmp_path, where)
    result = _fuzz(tmp_path, "promote", str(finding))
    assert victim.read_text() == "untouched\n" and sorted(p.name for p in victim.parent.iterdir()) == ["victim"]
    _refused(result, "promote", "symbolic link")
    if where != "verify":  # checked before anything was written
        assert sorted(p.name for p in (tmp_path / "reg").rglob("*") if not p.is_symlink() and p.is_file()) == []


def test_promote_writes_a_case_once_and_a_second_promotion_changes_nothing(tmp_path):
    finding = _minimized_finding(tmp_path, [{"target": "verify", "environment": {}}], _valid_model())
    first = _fuzz(tmp_path, "promote", str(finding))
    assert first.returncode == 0, first.stderr
    written = {p: p.read_bytes() for p in (tmp_path / "reg").rglob("*") if p.is_file()}
    assert len(written) == 3  # <id>.bin, <id>.json, cases/wire/fuzz-verify.toml
    second = _fuzz(tmp_path, "promote", str(finding))
    assert second.returncode == 0, second.stderr
    assert {p: p.read_bytes() for p in (tmp_path / "reg").rglob("*") if p.is_file()} == written


def test_triage_never_writes_through_a_link(tmp_path):
    run = _run_dir(tmp_path, {"target": "verify", "environment": {}})
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim"
    victim.write_text("untouched\n")
    (run / "triage.json").symlink_to(victim)
    (run / "triage.md").symlink_to(victim)
    result = _fuzz(tmp_path, "triage", "run", "--no-minimize")
    assert result.returncode == 0, result.stderr
    assert victim.read_text() == "untouched\n"
    assert not (run / "triage.json").is_symlink() and json.loads((run / "triage.json").read_text())
    (run / "minimized").rename(tmp_path / "old-minimized")
    (run / "minimized").symlink_to(outside)
    _refused(_fuzz(tmp_path, "triage", "run", "--no-minimize"), "triage", "symbolic link")
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]


# ------------------------------------------------------------------------------ malformed directories
def _deep() -> str:
    return "[" * 200_000


_REPORTS = {
    "bad-json": "{", "list-of-numbers": "[1, 2]", "string": '"verify"', "number-target": '{"target": 7}',
    "environment-list": '{"target": "verify", "environment": ["LD_PRELOAD=x"]}',
    "environment-number": '{"target": "verify", "environment": {"FUZZ_STRICT": 1}}',
    "deep-nesting": _deep(), "not-utf8": b"\xff\xfe{}", "huge": None, "fifo": None, "link": None,
}


@pytest.mark.parametrize("case", sorted(_REPORTS))
def test_a_malformed_report_gives_one_line_and_status_2(tmp_path, case):
    run = _run_dir(tmp_path)
    report = run / "report.json"
    content = _REPORTS[case]
    if case == "huge":
        with open(report, "wb") as handle:
            handle.truncate(40 << 20)
    elif case == "fifo":
        os.mkfifo(report)
    elif case == "link":
        (tmp_path / "elsewhere.json").write_text('{"target": "verify"}')
        report.symlink_to(tmp_path / "elsewhere.json")
    elif isinstance(content, bytes):
        report.write_bytes(content)
    else:
        report.write_text(content)
    _refused(_fuzz(tmp_path, "triage", "run", "--target", "verify", "--no-minimize"), "triage", "report.json")
    assert not (run / "triage.json").exists()


@pytest.mark.parametrize("case", ["fifo", "link", "huge", "directory", "findings-link"])
def test_a_malformed_finding_gives_one_line_and_status_2(tmp_path, case):
    run = _run_dir(tmp_path, {"target": "verify", "environment": {}})
    secret = tmp_path / "secret"
    secret.write_bytes(b"not for the artifact")
    entry = run / "findings" / "crash-b"
    if case == "fifo":
        os.mkfifo(entry)
    elif case == "link":
        entry.symlink_to(secret)
    elif case == "huge":
        with open(entry, "wb") as handle:
            handle.truncate(2 << 20)
    elif case == "directory":
        entry.mkdir()
    else:
        (run / "findings").rename(tmp_path / "elsewhere")
        (run / "findings").symlink_to(tmp_path / "elsewhere")
    _refused(_fuzz(tmp_path, "triage", "run", "--no-minimize"), "triage")
    assert not (run / "triage.json").exists() and not (run / "minimized").exists()


@pytest.mark.parametrize("case", ["fifo", "link", "huge"])
def test_promote_refuses_a_finding_that_is_not_a_regular_file(tmp_path, case):
    finding = tmp_path / "finding.bin"
    if case == "fifo":
        os.mkfifo(finding)
    elif case == "link":
        (tmp_path / "secret").write_bytes(_valid_model())
        finding.symlink_to(tmp_path / "secret")
    else:
        with open(finding, "wb") as handle:
            handle.truncate(2 << 20)
    _refused(_fuzz(tmp_path, "promote", "finding.bin", "--target", "verify"),
             "promote", "finding.bin")
    assert not (tmp_path / "reg" / "verify").exists()
