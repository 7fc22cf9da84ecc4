#!/usr/bin/env bash
# The native vendor path: build the C++ testee SDK and its example runtime (release, and ASan+UBSan),
# certify the example with the conformance suite (affine, external-data, state, bindings, zero-copy), run
# every case of those profiles and a short differential fuzz campaign against the sanitizer build (any
# sanitizer report fails), and gate the extension's size on two proto libraries built with protoc's lite
# runtime.
#
# Everything it produces goes to $NATIVE_OUT (default build/native/artifacts): the certification
# bundle, the sanitizer run's reports and logs, the size comparison (Markdown and JSON) and summary.md,
# which is also appended to $GITHUB_STEP_SUMMARY when that is set. Build trees: build/native/<config>.
set -euo pipefail
native_out="${NATIVE_OUT:+$(realpath -m -- "$NATIVE_OUT")}"  # relative to where the caller stood
cd "$(dirname "$0")/.."
root="$PWD"
out="${native_out:-$root/build/native/artifacts}"
rm -rf "$out"
mkdir -p "$out"
phase_start=$SECONDS
timings=()
phase() {  # phase NAME: record how long the previous phase took
  timings+=("$1: $((SECONDS - phase_start)) s")
  phase_start=$SECONDS
}

# ------------------------------------------------------------------------------------- toolchain
# Debian packages, installed when missing (ci/system-packages.sh).
bash ci/system-packages.sh native
generator="Unix Makefiles"
command -v ninja > /dev/null && generator="Ninja"
phase "toolchain"

# ------------------------------------------------------------------------------------------ build
cmake -S conformance/sdk/cpp -B build/native/release -G "$generator" -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build/native/release -j2
phase "build (release)"
cmake -S conformance/sdk/cpp -B build/native/sanitize -G "$generator" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DONNX_LIGHT_TESTEE_SANITIZE=address,undefined > /dev/null
cmake --build build/native/sanitize -j2
phase "build (ASan+UBSan)"

# ---------------------------------------------------------------------------------- certification
testee="$root/build/native/release/example/onnx-light-example-testee"
python3 -m conformance run --testee "$testee" --quiet \
  --failure-list conformance/sdk/cpp/example/expected-failures.txt --report-dir "$out/certification"
python3 -m conformance verify-bundle "$out/certification" --rerun --testee "$testee"
# Every claimed profile certified, and at least these: the affine slice and the state profiles.
python3 - "$out/certification/manifest.json" affine external-data state bindings zero-copy <<'EOF'
import json, sys
profiles = json.load(open(sys.argv[1]))["profiles"]
print("certification: " + ", ".join(f"{name} {status}" for name, status in sorted(profiles.items())))
missing = [name for name in sys.argv[2:] if not profiles.get(name, "").startswith("certified")]
if missing:
    print("native: the example is not certified for " + ", ".join(missing))
sys.exit(0 if profiles and not missing and all(s.startswith("certified") for s in profiles.values()) else 1)
EOF
phase "certification"

# ------------------------------------------------------------------------------ sanitizer smoke
# Reports abort the testee (the build uses -fno-sanitize-recover; abort_on_error/halt_on_error say the
# same at run time), which the runner and the fuzz harness see as a crash. They are also written to
# $logs, which catches what happens at exit (leaks): any file there fails the job.
logs="$out/sanitizer-logs"
mkdir -p "$logs"
export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1:log_path=$logs/asan"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$logs/ubsan"
# The fuzz harness caps its own address space and the testee inherits that soft limit, which is far
# too small for ASan's shadow memory: the wrapper lifts it for the testee alone.
sanitized="sh -c 'ulimit -S -v unlimited && exec \"\$0\"' $root/build/native/sanitize/example/onnx-light-example-testee"
status=0
python3 -m conformance run --testee "$sanitized" --quiet --profile affine --profile external-data \
  --profile state --profile bindings --profile zero-copy \
  --report-dir "$out/sanitizer-cases" 2> "$logs/cases.stderr" || status=1
# A fixed number of executions from a fixed seed, not a time budget: the campaign CI runs is the one
# that ran here, whatever the machine's speed. --time only guards against a hang (its default, 60 s, would
# end the campaign first on a slow machine: about 4,000 executions on two busy cores).
python3 -m fuzz run differential --testee "$sanitized" --runs "${NATIVE_FUZZ_RUNS:-10000}" --time 1800 --jobs 1 --seed 1 \
  --quiet --fail-on-finding --out "$out/fuzz" --corpus "$(mktemp -d)" || status=1
unset ASAN_OPTIONS UBSAN_OPTIONS
# UBSan prints to the testee's stderr even with a log_path when it shares the process with ASan: that is
# the runner's stderr for the cases and the job log for the campaign.
if compgen -G "$logs/asan*" > /dev/null || grep -lE "runtime error:|Sanitizer" "$logs/cases.stderr" \
    "$out"/fuzz/logs/*.log > /dev/null 2>&1; then
  echo "native: sanitizer reports:"
  cat "$logs"/asan* 2> /dev/null || true
  grep -hE -A12 "runtime error:|ERROR: .*Sanitizer" "$logs/cases.stderr" "$out"/fuzz/logs/*.log || true
  status=1
fi
grep -E "^\| (executions|findings) " "$out/fuzz/report.md" || true
phase "sanitizer cases and fuzz campaign"
[ "$status" -eq 0 ] || { echo "native: the sanitizer build failed a case, fuzzing found something or a sanitizer reported"; exit 1; }

# ------------------------------------------------------------------------------------- size gate
gate="$out/size-gate"
onnx_ml_proto="$(python3 -c 'import onnx, pathlib; print(pathlib.Path(onnx.__file__).parent / "onnx-ml.proto")')"
python3 -m size_gate.protoc_lib "$onnx_ml_proto" --name onnx_ml_proto --out "$gate" > /dev/null
python3 -m size_gate.protoc_lib reference_impl/proto/onnx-light.proto --name onnx_light_proto --out "$gate" > /dev/null
gate_status=0
python3 -m size_gate compare "$gate/libonnx_ml_proto.so" "$gate/libonnx_light_proto.so" \
  --budget size_gate/budgets/protoc_lite.toml --markdown-out "$gate/size-gate.md" --json-out "$gate/size-gate.json" \
  > /dev/null || gate_status=$?
sed -n '/^| Metric/,/^$/p' "$gate/size-gate.md"
phase "proto-library size gate"

# ---------------------------------------------------------------------------------------- summary
{
  cat "$out/certification/summary.md"
  echo
  echo "## Example runtime under ASan+UBSan"
  echo
  echo "| metric | value |"
  echo "| --- | --- |"
  grep -E "^\| (executions|findings|wall time) " "$out/fuzz/report.md"
  echo
  echo "## Proto-library size gate (protoc lite, onnx-ml.proto vs onnx-light.proto)"
  echo
  sed -n '/^| Metric/,$p' "$gate/size-gate.md" | sed '/^\*\*Defined dynamic symbols:\*\*/,$d'
  echo "## Native job timings"
  echo
  printf -- '- %s\n' "${timings[@]}"
} > "$out/summary.md"
[ -z "${GITHUB_STEP_SUMMARY:-}" ] || cat "$out/summary.md" >> "$GITHUB_STEP_SUMMARY"
printf 'native: %s\n' "${timings[@]}"
if [ "$gate_status" -ne 0 ]; then
  echo "native: the extension is over its size allowance on the protoc-built libraries (see $gate/size-gate.md)"
  exit "$gate_status"
fi
echo "native: done; artifacts in $out"
