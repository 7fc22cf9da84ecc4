#!/usr/bin/env bash
# Build every fuzzer the way ClusterFuzzLite / OSS-Fuzz do, then run each built executable on its seed
# corpus. A module, data file or case the one-file executables lack fails here, not on the fuzzing
# infrastructure.
#
#   ci/fuzz-build.sh [RUNS]      RUNS executions per fuzzer (default 2000)
#
# ci/clusterfuzzlite/build.sh runs unchanged with $SRC, $OUT and $WORK laid out as in the builder
# image and ci/oss-fuzz-local/ (a stand-in for the image's compile_python_fuzzer) first on PATH. It runs
# inside a virtual environment over the system's packages, so its `pip3 install` and PyInstaller (a
# build tool for this check only) change nothing outside it.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
runs="${1:-2000}"

base="$(mktemp -d)"
trap 'rm -rf "$base"' EXIT
export SRC="$base/src" OUT="$base/out" WORK="$base/work"
mkdir -p "$SRC/onnx-light-conformance" "$OUT" "$WORK"

# The builder image copies the repository into $SRC and build.sh into $SRC/.
# (one tar reads the whole list: xargs would split a long list over several archives on one pipe)
(cd "$root" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf -) \
  | tar -xf - -C "$SRC/onnx-light-conformance"
cp "$root/ci/clusterfuzzlite/build.sh" "$SRC/build.sh"

export PIP_QUIET=1 PIP_DISABLE_PIP_VERSION_CHECK=1
python3 -m venv --system-site-packages "$WORK/venv"
export PATH="$root/ci/oss-fuzz-local:$WORK/venv/bin:$PATH"
pip3 install "pyinstaller>=6.0"

start=$SECONDS
(cd "$SRC" && bash -eu build.sh)
echo "fuzz build: $(find "$OUT" -name '*.pkg' | wc -l) executables in $((SECONDS - start)) s"

# Run each fuzzer as the infrastructure does: its launcher, its options, its dictionary, its seeds; two at a
# time (two cores), each into its own log. Outside the venv, so the executables can rely on nothing but what
# they bundle.
export PATH="${PATH#"$root/ci/oss-fuzz-local:$WORK/venv/bin:"}"
cd "$WORK"
run_fuzzer() {  # run_fuzzer LAUNCHER: prints one line, or the log's tail and fails
  local launcher=$1 name seeds count options=() start=$SECONDS log
  name=$(basename "$launcher")
  seeds="$WORK/seeds/$name"
  log="$WORK/$name.log"
  mkdir -p "$seeds"
  unzip -q "$OUT/${name}_seed_corpus.zip" -d "$seeds"
  count=$(find "$seeds" -type f | wc -l)
  if [ -f "$OUT/$name.options" ]; then
    while IFS= read -r option; do options+=("$option"); done \
      < <(sed -n 's/^\([a-z_]*\) *= *\(.*\)$/-\1=\2/p' "$OUT/$name.options")
  fi
  if [ -f "$OUT/$name.dict" ]; then
    options+=("-dict=$OUT/$name.dict")
  fi
  if ! "$launcher" "${options[@]}" -runs="$runs" -seed=1 "$seeds" > "$log" 2>&1; then
    tail -n 60 "$log"
    echo "fuzz build: $name failed on its seed corpus (log above)"
    return 1
  fi
  echo "fuzz build: $name ran $runs inputs from $count seeds in $((SECONDS - start)) s"
}
jobs_started=()
for launcher in "$OUT"/*_fuzzer; do
  run_fuzzer "$launcher" > "$WORK/$(basename "$launcher").result" 2>&1 &
  jobs_started+=("$!:$WORK/$(basename "$launcher").result")
  while [ "$(jobs -rp | wc -l)" -ge 2 ]; do wait -n || true; done
done
status=0
for entry in "${jobs_started[@]}"; do
  wait "${entry%%:*}" || status=1
  cat "${entry#*:}"
done
exit "$status"
