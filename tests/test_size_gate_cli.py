"""The command line: measure / check / compare outputs, exit codes, and the CI workflow's invocations."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from size_gate import load_budget, measure_path
from size_gate.cli import _parser, main

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures" / "elf"
DEFAULT, HIDDEN, EXTRA = (FIXTURES / n for n in ("default.so", "hidden.so", "libm_needed.so"))
NOSHDR = FIXTURES / "default-noshdr.so"


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _tight_budget(tmp_path: Path, text_limit: int) -> Path:
    """A one-stage budget limiting .text bytes to ``text_limit``."""
    path = tmp_path / "tight.toml"
    path.write_text(f"""
format = 1
[library]
pattern = "*.so"
[baseline]
text_bytes = 100
[stages.tight]
limits = {{ text_bytes = {text_limit} }}
[gate]
stage = "tight"
[dt_needed]
allowed = ["libc"]
""")
    return path


# -- measure -----------------------------------------------------------------------------------------
def test_measuring_a_library_imports_only_what_measuring_needs():
    """Start-up time is most of a command-line measurement: ``measure`` on a library file loads neither
    NumPy, onnx nor the oracle, and reads no budget (its pattern only selects inside directories and
    wheels); a directory still gets the shipped budget's pattern."""
    heavy = ("numpy", "onnx", "google.protobuf", "reference_impl.values", "tomllib", "size_gate.budget",
             "size_gate.gate", "size_gate.compare", "elftools.elf.elffile")
    probe = ("import sys\nfrom size_gate.cli import main\nstatus = main(sys.argv[1:])\n"
             f"print([m for m in {heavy!r} if m in sys.modules], status, file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", probe, "measure", str(DEFAULT), "--json"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.stderr.strip() == "[] 0", done.stderr
    assert json.loads(done.stdout)["text_bytes"] == measure_path(DEFAULT, "*").text_bytes
    done = subprocess.run([sys.executable, "-c", probe, "measure", str(FIXTURES), "--pattern", "default.so"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.stderr.strip() == "[] 0", done.stderr


def test_the_command_defers_the_debugger_modules_pyelftools_imports():
    """``python -m size_gate measure`` never loads pdb, inspect or traceback (pyelftools' construct package
    imports them for a debugging aid), yet its output is the in-process measurement; code that does read them
    through the stand-ins gets the real modules, however it imports them and however often."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "size_gate", "measure", str(DEFAULT), "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "elftools.construct.debug" in loaded and not loaded & {"pdb", "inspect", "traceback", "bdb", "dis"}
    assert json.loads(done.stdout) == measure_path(DEFAULT, "*").to_json()
    probe = ("import sys\nfrom size_gate.startup import defer_imports\ndefer_imports()\n"
             "import inspect, pdb\nstand_in = inspect\nfrom inspect import signature\n"
             "assert stand_in.signature is signature is sys.modules['inspect'].signature\n"
             "assert stand_in.getdoc is sys.modules['inspect'].getdoc and pdb.Pdb is sys.modules['pdb'].Pdb\n"
             "print(str(signature(len)), type(sys.modules['inspect']).__name__)")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["(obj,", "/)", "module"]


def test_a_directory_is_measured_with_the_shipped_budgets_pattern(tmp_path, capsys):
    library = tmp_path / "lib" / "onnx_light" / load_budget().pattern.replace("*", "x")
    library.parent.mkdir(parents=True)
    library.write_bytes(DEFAULT.read_bytes())
    (tmp_path / "lib" / "other.so").write_bytes(DEFAULT.read_bytes())
    code, out, _ = _run(capsys, "measure", tmp_path / "lib", "--json")
    assert code == 0 and json.loads(out)["path"] == str(library)
    code, _, err = _run(capsys, "measure", DEFAULT, "--budget", tmp_path / "missing.toml")
    assert code == 2 and "missing.toml" in err  # a budget named on the command line is always read


def test_measure_table(capsys):
    code, out, err = _run(capsys, "measure", DEFAULT)
    m = measure_path(DEFAULT, "*")
    assert code == 0 and err == ""
    assert out.splitlines()[0] == str(DEFAULT)
    assert re.search(rf"Installed bytes\s+{DEFAULT.stat().st_size:,}$", out, re.MULTILINE)
    assert re.search(rf"\.text bytes\s+{m.text_bytes:,}$", out, re.MULTILINE)
    assert re.search(r"DT_NEEDED\s+libc\.so\.6$", out, re.MULTILINE)


def test_measure_json_round_trips_every_metric(capsys):
    code, out, _ = _run(capsys, "measure", DEFAULT, "--json")
    data = json.loads(out)
    m = measure_path(DEFAULT, "*")
    assert code == 0 and data["schema"] == "size_gate.metrics/1"
    assert data["symbols"] == list(m.symbols) and data["defined_symbols"] == len(m.symbols)
    for key in ("installed_bytes", "alloc_bytes", "text_bytes", "section_bytes_total", "build_id"):
        assert data[key] == getattr(m, key)


def test_measure_several_paths_and_unmeasurable_fields(capsys):
    code, out, _ = _run(capsys, "measure", DEFAULT, NOSHDR, "--json")
    first, second = json.loads(out)
    assert code == 0 and first["symbols"] == second["symbols"]
    assert second["text_bytes"] is None and second["section_headers"] is False
    _run(capsys, "measure", NOSHDR)
    code, out, _ = _run(capsys, "measure", NOSHDR, "--symbols")
    assert "n/a (no section headers)" in out and "    sg_add" in out


# -- check -------------------------------------------------------------------------------------------
def test_check_within_packaged_budget(capsys):
    code, out, _ = _run(capsys, "check", DEFAULT)
    assert code == 0 and "PASS: within the PR04 budget" in out


def test_budget_by_name_is_the_shipped_one_from_any_directory_and_dot_slash_is_a_local_file(
        capsys, tmp_path, monkeypatch):
    """``--budget onnx_proto`` names the shipped budget wherever the command runs (an installed suite has no
    ``size_gate/budgets`` under the current directory); ``./onnx_proto`` is a file there."""
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(capsys, "check", DEFAULT, "--budget", "onnx_proto", "--json")
    assert code == 0, err
    assert Path(json.loads(out)["budget"]) == Path(load_budget().path)
    (tmp_path / "onnx_proto").write_text(_tight_budget(tmp_path, 1).read_text())
    code, out, err = _run(capsys, "check", DEFAULT, "--budget", "./onnx_proto", "--json")
    assert code == 1 and Path(json.loads(out)["budget"]) == tmp_path / "onnx_proto", err


def test_check_over_budget_names_metric_limit_actual_and_overshoot(capsys, tmp_path):
    text = measure_path(DEFAULT, "*").text_bytes
    code, out, _ = _run(capsys, "check", DEFAULT, "--budget", _tight_budget(tmp_path, text - 1))
    assert code == 1
    assert f"- .text bytes (text_bytes): {text:,} exceeds the tight limit of {text - 1:,} by 1 " in out
    code, _, _ = _run(capsys, "check", DEFAULT, "--budget", _tight_budget(tmp_path, text))
    assert code == 0


def test_check_against_a_zero_baseline_figure(capsys, tmp_path):
    budget = _tight_budget(tmp_path, 10**6)
    budget.write_text(budget.read_text().replace("text_bytes = 100\n", "text_bytes = 0\n", 1))
    code, out, _ = _run(capsys, "check", DEFAULT, "--budget", budget)
    text = measure_path(DEFAULT, "*").text_bytes
    assert code == 0 and re.search(rf"^  \.text bytes .* {text:+,}  ", out, re.MULTILINE)


def test_check_unallowed_dependency(capsys):
    code, out, _ = _run(capsys, "check", EXTRA)
    assert code == 1 and "DT_NEEDED libm.so.6 is not on the allowlist" in out


def test_check_json(capsys):
    code, out, _ = _run(capsys, "check", EXTRA, "--json", "--stage", "PR02")
    data = json.loads(out)
    assert code == 1 and data["passed"] is False and data["stage"] == "PR02"
    failed = [f for f in data["findings"] if f["status"] == "fail"]
    assert [f["actual"] for f in failed] == ["libm.so.6"]


def test_check_without_section_headers_is_unusable(capsys):
    code, out, err = _run(capsys, "check", NOSHDR)
    assert code == 2 and out == "" and "[metric-unavailable]" in err


def test_check_unknown_stage(capsys):
    code, _, err = _run(capsys, "check", DEFAULT, "--stage", "PR99")
    assert code == 2 and "[bad-budget]" in err and "PR99" in err


# -- compare -----------------------------------------------------------------------------------------
def test_compare_markdown_without_budget(capsys):
    code, out, _ = _run(capsys, "compare", DEFAULT, HIDDEN)
    base, cand = measure_path(DEFAULT, "*"), measure_path(HIDDEN, "*")
    assert code == 0
    delta = cand.installed_bytes - base.installed_bytes
    row = (f"| Installed bytes | {base.installed_bytes:,} | {cand.installed_bytes:,} | {delta:+,} | "
           f"{100 * delta / base.installed_bytes:+.2f}% |")
    assert row in out
    removed = sorted(set(base.symbols) - set(cand.symbols))
    assert f"**Defined dynamic symbols:** 0 added, {len(removed)} removed" in out
    block = out.split(f"<summary>Removed symbols ({len(removed)})</summary>")[1].split("</details>")[0]
    assert re.findall(r"^sg_\w+$", block, re.MULTILINE) == removed
    assert "**DT_NEEDED:** unchanged (`libc.so.6`)" in out
    assert "Limit" not in out  # no budget, no gate columns


def test_compare_json(capsys):
    code, out, _ = _run(capsys, "compare", DEFAULT, EXTRA, "--format", "json")
    data = json.loads(out)
    base, cand = measure_path(DEFAULT, "*"), measure_path(EXTRA, "*")
    assert code == 0 and data["schema"] == "size_gate.compare/1" and data["gate"] is None
    assert data["needed"] == {"added": ["libm.so.6"], "removed": []}
    rows = {r["metric"]: r for r in data["metrics"]}
    assert rows["alloc_bytes"]["delta"] == cand.alloc_bytes - base.alloc_bytes
    assert rows["alloc_bytes"]["percent"] == pytest.approx(100 * (cand.alloc_bytes - base.alloc_bytes)
                                                           / base.alloc_bytes)


@pytest.mark.clause("SIZE-SIDE-BY-SIDE")
def test_compare_with_budget_gates_and_writes_both_reports(capsys, tmp_path):
    md, js = tmp_path / "summary.md", tmp_path / "report.json"
    code, out, _ = _run(capsys, "compare", DEFAULT, EXTRA, "--budget", REPO / "size_gate/budgets/onnx_proto.toml",
                        "--markdown-out", md, "--json-out", js)
    assert code == 1
    assert md.read_text() == out
    assert "| Limit (PR04) | Status |" in out and "report only" in out
    assert "**DT_NEEDED:** added `libm.so.6`" in out
    assert "- ❌ DT_NEEDED libm.so.6 was added relative to the baseline" in out
    report = json.loads(js.read_text())
    assert report["gate"]["passed"] is False and report["gate"]["stage"] == "PR04"
    checks = sorted({f["check"] for f in report["gate"]["findings"] if f["status"] == "fail"})
    assert checks == ["dt_needed", "dt_needed_added"]


def test_compare_same_library_passes(capsys):
    code, out, _ = _run(capsys, "compare", DEFAULT, DEFAULT, "--stage", "PR04")
    assert code == 0 and "✅ within budget" in out and "0 added, 0 removed" in out


def test_python_m_entry_point(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "size_gate", "compare", str(DEFAULT), str(HIDDEN),
                           "--format", "json"], capture_output=True, text=True, env=env, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["symbols"]["removed"] == ["sg_helper", "sg_twice"]


# -- the CI workflow -----------------------------------------------------------------------------------
def _workflow_commands() -> list[list[str]]:
    """Every `python -m size_gate` command line in the workflow, with the job's env substituted."""
    yaml = pytest.importorskip("yaml")
    workflow = yaml.safe_load((REPO / "ci" / "size-gate.yml").read_text())
    commands = []
    for job in workflow["jobs"].values():
        env = {"PROTO_DIR_BASELINE": "/build/a", "PROTO_DIR_CANDIDATE": "/build/b", "STAGE_ARGS": "",
               **{k: v for k, v in job.get("env", {}).items() if "${{" not in v}}
        for step in job["steps"]:
            script = step.get("run", "").replace("\\\n", " ")
            for line in script.splitlines():
                if "python -m size_gate" in line:
                    args = line.split("python -m size_gate", 1)[1].split(" > ")[0]
                    args = re.sub(r"\$\{?(\w+)\}?", lambda m, env=env: env[m[1]], args)
                    commands.append(shlex.split(args))
    return commands


def test_workflow_invokes_valid_commands():
    commands = _workflow_commands()
    assert sorted(c[0] for c in commands) == ["check", "compare", "measure", "measure"]
    for argv in commands:
        args = _parser().parse_args(argv)
        budget_path = REPO / Path(str(args.budget)).relative_to("gate")
        assert load_budget(budget_path).default_stage == "PR04"
    compare = next(c for c in commands if c[0] == "compare")
    assert "--markdown-out" in compare and "--json-out" in compare
