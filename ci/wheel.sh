#!/usr/bin/env bash
# The suite as vendors install it: build the wheel and the sdist, check their metadata, install the wheel
# into a fresh virtual environment outside the checkout and, from a scratch directory, run the documented
# commands: the main job, a testee run, the bundle check by rerun, the size gate with a shipped budget
# named, a short fuzz campaign, and a configure of the C++ SDK's CMake project (docs/conformance.md,
# "Installing from a wheel"); then check that the sdist builds that same wheel, byte for byte, as pip
# does when it installs the sdist. Dependencies come from the package index (pip's cache makes this quick).
#
# WHEEL_OUT (default: a temporary directory) keeps the built distributions.
set -euo pipefail
wheel_out="${WHEEL_OUT:+$(realpath -m -- "$WHEEL_OUT")}"  # relative to where the caller stood
cd "$(dirname "$0")/.."
root="$PWD"
started=$SECONDS
pip_quiet=(--quiet --disable-pip-version-check)

python3 -m pip install "${pip_quiet[@]}" build twine
if [ -n "$wheel_out" ]; then
  dist="$wheel_out"
else
  dist="$(mktemp -d)"
  trap 'rm -rf "$dist"' EXIT
fi
mkdir -p "$dist"
rm -f "$dist"/*.whl "$dist"/*.tar.gz
python3 -m build --outdir "$dist" . > "$dist/build.log" 2>&1 || { cat "$dist/build.log"; exit 1; }
python3 -m twine check --strict "$dist"/*.whl "$dist"/*.tar.gz
wheel="$(echo "$dist"/*.whl)"
sdist="$(echo "$dist"/*.tar.gz)"
echo "wheel: $(basename "$wheel") $(stat -c %s "$wheel") bytes; sdist: $(stat -c %s "$sdist") bytes ($((SECONDS - started)) s)"

# exercise LABEL ARTIFACT: install ARTIFACT (with the fuzz extra) into a new venv and run the commands.
exercise() {
  local label="$1" artifact="$2" phase_start=$SECONDS
  local venv scratch
  venv="$(mktemp -d)/venv"
  scratch="$(mktemp -d)"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install "${pip_quiet[@]}" "$artifact[fuzz]"
  echo "$label: installed in $((SECONDS - phase_start)) s"
  (
    cd "$scratch"
    export PATH="$venv/bin:$PATH"
    unset PYTHONPATH
    # The installed copy, not the checkout, and no top-level corpus package beside it.
    python - "$root" <<'EOF'
import importlib.metadata, importlib.util, pathlib, sys
import conformance
from conformance import SUITE_VERSION, locations
checkout = pathlib.Path(sys.argv[1]).resolve()
where = pathlib.Path(conformance.__file__).resolve()
assert checkout not in where.parents, f"conformance imported from the checkout: {where}"
assert importlib.util.find_spec("corpus") is None, "a top-level corpus package is installed"
assert importlib.metadata.version("onnx-light-conformance") == SUITE_VERSION
assert locations.corpus_dir() == where.parent / "_corpus", locations.corpus_dir()
EOF
    python -m conformance --version
    python -m conformance run -j 2 --quiet --report-dir r
    python -m conformance run -j 2 --testee "python -m conformance.testee" --quiet --report-dir rt
    python -m conformance verify-bundle r --rerun --adapter reference -j 2

    # The size gate with a shipped budget named: onnx's extension module is far over the proto library's
    # budget, so the check measures it and exits 1 (0 within budget, 2 unusable input: docs/size_gate.md).
    library="$(python -c 'import onnx.onnx_cpp2py_export as m; print(m.__file__)')"
    status=0
    python -m size_gate check "$library" --budget onnx_proto --json > size.json || status=$?
    python - "$status" "$venv" <<'EOF'
import json, pathlib, sys
status, venv = int(sys.argv[1]), pathlib.Path(sys.argv[2]).resolve()
report = json.load(open("size.json"))
budget = pathlib.Path(report["budget"]).resolve()
assert status == 1 and not report["passed"], f"size_gate check exited {status}"
assert venv in budget.parents and budget.name == "onnx_proto.toml", budget
print(f"size gate: {report['library']['path']} over the {report['stage']} budget, as expected")
EOF

    python -m fuzz run verify --time 5 --jobs 1 --seed 1 --quiet --fail-on-finding --out fz --corpus fzc
    # ... starting from the installed seed corpus.
    grep -Eq "[1-9][0-9]* files found in .*/conformance/_corpus/seeds/verify" fz/logs/job-0.log \
      || { cat fz/logs/job-0.log; echo "the campaign did not read the installed seeds"; exit 1; }
    echo "fuzz: verify campaign from the installed seeds, no findings"

    # The C++ SDK's CMake project configures from the install (it finds the .proto files beside it).
    # (ci/native.sh installs that toolchain; without it this step is skipped.)
    if command -v cmake > /dev/null && command -v protoc > /dev/null \
        && [ -f /usr/include/google/protobuf/message_lite.h ]; then
      sdk="$(python -c 'import conformance, pathlib; print(pathlib.Path(conformance.__file__).parent / "sdk" / "cpp")')"
      cmake -S "$sdk" -B sdk-build > sdk-configure.log 2>&1 || { cat sdk-configure.log; exit 1; }
      echo "C++ SDK configured from $sdk"
    fi
  )
  rm -rf "$(dirname "$venv")" "$scratch"
  echo "$label: all commands passed in $((SECONDS - phase_start)) s"
}

exercise wheel "$wheel"

# The sdist: `python -m build` made the wheel exercised above from the sdist it had just made, and pip installs
# the sdist by building a wheel from it the same way, so an install from the sdist holds the same files. That
# is checked rather than assumed: the wheel pip builds from the sdist has the same members, byte for byte.
phase_start=$SECONDS
rebuilt="$(mktemp -d)"
python3 -m pip wheel "${pip_quiet[@]}" --no-deps --wheel-dir "$rebuilt" "$sdist"
python3 - "$wheel" "$rebuilt"/*.whl <<'EOF'
import hashlib, sys, zipfile

def members(path):
    with zipfile.ZipFile(path) as archive:
        return {info.filename: hashlib.sha256(archive.read(info)).hexdigest() for info in archive.infolist()}

built, from_sdist = members(sys.argv[1]), members(sys.argv[2])
differ = sorted(name for name in built.keys() | from_sdist.keys() if built.get(name) != from_sdist.get(name))
if differ:
    sys.exit(f"the wheel built from the sdist differs from the wheel exercised in {len(differ)} member(s): "
             + ", ".join(differ[:10]))
print(f"sdist: pip builds the same wheel from it ({len(built)} members, byte for byte)")
EOF
rm -rf "$rebuilt"
echo "sdist: checked in $((SECONDS - phase_start)) s"
echo "wheel.sh: $((SECONDS - started)) s"
