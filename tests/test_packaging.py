"""The suite as an installed distribution: what the wheel carries, and that an installed copy finds its
data without a checkout (docs/conformance.md, "Installing from a wheel"; ci/wheel.sh runs the documented
commands from a real install)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conformance import SPEC_REVISION, SUITE_VERSION, locations
from conformance.cases import load_cases
from conformance.certificate import corpus_files_digest
from reference_impl.clauses import SPEC_FILE

REPO = Path(__file__).resolve().parents[1]
IMPORT_PACKAGES = {"conformance", "reference_impl", "fuzz", "size_gate"}
#: What a build reads from the checkout is copied before building, so concurrent builds (xdist workers)
#: never share the checkout's build/ and *.egg-info folders.
_NOT_COPIED = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".hypothesis",
                                     "fuzz-runs", "reports", "conformance-report", "tests", "benchmarks")


def _files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel ``python -m build --wheel`` makes of this checkout (built once per test process)."""
    pytest.importorskip("build", reason="building the wheel needs the 'build' package (pip install build)")
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    shutil.copytree(REPO, source, ignore=_NOT_COPIED, symlinks=True)
    done = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(work / "dist"), str(source)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (built,) = (work / "dist").glob("*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """The wheel's contents unpacked as pip lays out a pure-Python wheel in site-packages."""
    site = tmp_path_factory.mktemp("site-packages")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    return site


def test_the_wheel_carries_the_corpus_docs_sdk_protos_and_budgets_and_no_top_level_corpus(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    tops = {name.split("/", 1)[0] for name in names if ".dist-info/" not in name}
    assert tops == IMPORT_PACKAGES  # no generic top-level corpus package beside them
    corpus = {f"conformance/_corpus/{rel}" for rel in _files(REPO / "corpus")}
    assert corpus <= names, sorted(corpus - names)[:10]
    assert any(n.startswith("conformance/_corpus/cases/") and n.endswith(".toml") for n in names)
    assert any(n.startswith("conformance/_corpus/seeds/verify/") for n in names)
    sdk = {f"conformance/sdk/cpp/{rel}" for rel in _files(REPO / "conformance" / "sdk" / "cpp")}
    assert "conformance/sdk/cpp/CMakeLists.txt" in sdk and sdk <= names, sorted(sdk - names)[:10]
    docs = {f"conformance/_docs/spec/{SPEC_FILE}", "conformance/_docs/peer-deviations.md",
            "conformance/_docs/audit/kill-matrix.json", "conformance/_docs/spec-coverage.md"}
    assert docs <= names, sorted(docs - names)
    # Every data file of the import packages (protos, budgets, dashboard templates, ...) is installed.
    package_data = {f"{top}/{rel}" for top in IMPORT_PACKAGES for rel in _files(REPO / top)}
    assert {"reference_impl/proto/onnx-light.proto", "conformance/testee.proto",
            "size_gate/budgets/onnx_proto.toml"} <= package_data
    assert package_data <= names, sorted(package_data - names)[:10]
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert re.search(r"^Version: (.+)$", metadata, re.M).group(1) == SUITE_VERSION


#: Run in the unpacked wheel from an unrelated directory: where each data reader looks, and what it finds.
_PROBE = """
import importlib.util, json
from conformance import locations, spec
from conformance.cases import builders, load_cases
from conformance.certificate import corpus_files_digest
from conformance.dashboard import deviations
from conformance.audit import report
import fuzz.corpus, fuzz.promote, fuzz.kvscript
from size_gate.budget import budget_path
import reference_impl.proto_render as proto
cases = load_cases()
print(json.dumps({
    "corpus": str(locations.corpus_dir()), "cases": len(cases), "builders": len(builders()),
    "digest": corpus_files_digest(locations.corpus_dir()), "builders_package": locations.builders_package(),
    "spec": str(spec.VENDORED), "spec_text": spec.spec_text(),
    "deviations": len(deviations.load().classes), "kill_matrix": str(report.COMMITTED),
    "seeds": str(fuzz.corpus.SEEDS), "regressions": str(fuzz.promote.REGRESSIONS),
    "budget": str(budget_path("onnx_proto")), "proto": str(proto.PROTO_PATH), "source_tree": locations.source_tree(),
    "top_level_corpus": importlib.util.find_spec("corpus") is not None,
}, default=str))
"""


#: Prefixed to what runs in the unpacked wheel: a machine with an editable install of this project (a
#: developer's) has its import hooks active in every interpreter; dropped, the interpreter sees what a
#: clean virtual environment holding the wheel sees.
_WITHOUT_EDITABLE_HOOKS = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
sys.path[:] = [p for p in sys.path if "__editable__" not in p]
"""
_AS_MAIN = "import runpy\nsys.argv = sys.argv[1:]\nrunpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)\n"


def _run_installed(site: Path, cwd: Path, code: str = "", module: str = "", *argv: str) -> subprocess.CompletedProcess:
    """``code``, or ``python -m module argv...``, run from ``cwd`` with only ``site`` added to the path."""
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("CONFORMANCE_CORPUS", None)
    env.pop("FUZZ_REGRESSIONS_DIR", None)
    program = _WITHOUT_EDITABLE_HOOKS + (code or _AS_MAIN)
    return subprocess.run([sys.executable, "-P", "-c", program, *([module] if module else []), *argv], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300)


def test_an_installed_copy_reads_every_data_file_from_its_own_packages(installed, tmp_path):
    done = _run_installed(installed, tmp_path, _PROBE)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    package = installed / "conformance"
    assert found["corpus"] == str(package / "_corpus") and found["source_tree"] is None
    assert not found["top_level_corpus"]
    assert found["cases"] == len(load_cases(str(locations.corpus_dir())))
    assert found["builders"] > 0 and found["builders_package"] == "conformance._corpus.builders"
    assert found["digest"] == corpus_files_digest(locations.corpus_dir())  # the same definitions, byte for byte
    assert found["spec"] == str(package / "_docs" / "spec" / SPEC_FILE)
    assert found["spec_text"] == (REPO / "docs" / "spec" / SPEC_FILE).read_text(encoding="utf-8")
    assert found["deviations"] > 0
    assert found["kill_matrix"] == str(package / "_docs" / "audit" / "kill-matrix.json")
    assert found["seeds"] == str(package / "_corpus" / "seeds")
    assert found["regressions"] == str(package / "_corpus" / "regressions")
    assert found["budget"] == str(installed / "size_gate" / "budgets" / "onnx_proto.toml")
    assert Path(found["proto"]).is_file() and installed in Path(found["proto"]).parents


def test_installed_commands_run_outside_any_checkout(installed, tmp_path):
    """A few cases through ``python -m conformance run``, and the size gate with a shipped budget named."""
    done = _run_installed(installed, tmp_path, "", "conformance", "run", "--cases", "Required.Affine", "--quiet",
                          "--report-dir", "r")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert re.search(r"^[1-9]\d* passed, 0 failed", done.stdout, re.M), done.stdout
    library = REPO / "tests" / "fixtures" / "elf" / "default.so"
    done = _run_installed(installed, tmp_path, "", "size_gate", "check", str(library), "--budget", "onnx_proto",
                          "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["budget"] == str(installed / "size_gate" / "budgets" / "onnx_proto.toml")
    done = _run_installed(installed, tmp_path, "", "conformance", "--version")
    words = done.stdout.split()
    assert words[words.index(SUITE_VERSION):][:3] == [SUITE_VERSION, "spec", SPEC_REVISION]


def test_an_installed_copy_refuses_to_rewrite_its_own_corpus_and_documents(installed, tmp_path):
    """The maintainers' regenerating commands write the repository's files: an install is left unchanged."""
    def state() -> dict:
        return {p: p.stat().st_mtime_ns for p in (installed / "conformance").rglob("*")
                if p.is_file() and "__pycache__" not in p.parts}

    before = state()
    for argv in (("fuzz", "seeds"), ("fuzz", "dict"), ("conformance", "spec-coverage", "--write")):
        done = _run_installed(installed, tmp_path, "", *argv)
        assert done.returncode == 2 and "source checkout" in done.stderr, (argv, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert state() == before


def test_in_the_checkout_data_comes_from_the_repository_folders():
    """A source checkout has no packaged copies: the corpus, builders and docs are the repository's own."""
    assert locations.source_tree() == REPO
    assert locations.corpus_dir() == REPO / "corpus"
    assert locations.builders_package() == "corpus.builders"
    assert locations.docs_file("spec", SPEC_FILE) == REPO / "docs" / "spec" / SPEC_FILE


#: Modules that derive a path from their own file's ancestors, and why that is not a data lookup.
_ALLOWED_ANCESTOR_PATHS = {
    "conformance/locations.py": "the one place that knows the checkout layout",
    "fuzz/children.py": "the import root put on the children's PYTHONPATH",
    "corpus/builders/common.py": "the corpus's own _templates.toml, inside whichever corpus it belongs to",
}
_ANCESTOR = re.compile(r"__file__.*(parents\[\d+\]|\.parent\.parent)|dirname\(os\.path\.dirname\(.*__file__")


def test_no_module_reads_data_through_a_path_relative_to_the_checkout():
    offenders = []
    for top in (*sorted(IMPORT_PACKAGES), "corpus"):
        for path in sorted((REPO / top).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            if relative in _ALLOWED_ANCESTOR_PATHS or re.fullmatch(r"fuzz/\w+_fuzzer\.py", relative):
                continue  # the fuzzer scripts put the import root on sys.path when run as files
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if _ANCESTOR.search(line) and not line.lstrip().startswith("#"):
                    offenders.append(f"{relative}:{number}: {line.strip()}")
    assert not offenders, "use conformance.locations for suite data:\n" + "\n".join(offenders)
