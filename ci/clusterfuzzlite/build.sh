#!/bin/bash -eu
# Build every fuzz/*_fuzzer.py into $OUT as ClusterFuzzLite / OSS-Fuzz expect: one PyInstaller
# executable per target, plus <name>_seed_corpus.zip, <name>.dict and <name>.options beside it.
cd "$SRC/onnx-light-conformance"
pip3 install ".[fuzz]"

# Targets import their modules dynamically (fuzz.targets.load) and the differential targets load
# adapters by name, so PyInstaller is told to bundle the packages whole; the case corpus an install
# carries inside conformance (conformance._corpus) is left out, no fuzzer imports it. The harness reads
# a target's INSTRUMENT list from its source before importing it, so the targets' sources go in as data
# too.
# Left out: what only the campaign driver, the test plugin or an optional peer subject imports (the
# executables fuzz the reference; `python -m fuzz run --subject onnxruntime` covers that peer).
bundle=(--collect-submodules fuzz --collect-submodules reference_impl --collect-submodules conformance
        --collect-data reference_impl --collect-data conformance --collect-data onnx --collect-data fuzz
        --add-data "fuzz/targets/*.py:fuzz/targets"
        --exclude-module conformance._corpus --exclude-module matplotlib --exclude-module onnxruntime --exclude-module torch
        --exclude-module pytest --exclude-module _pytest --exclude-module tkinter)

# The executables are built side by side, as many at once as there are cores (each PyInstaller run is
# one process with its own work directory and spec file); the first failure stops the build.
builds=()
for fuzzer in fuzz/*_fuzzer.py; do
  compile_python_fuzzer "$fuzzer" "${bundle[@]}" &
  builds+=("$!")
  while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do wait -n; done
done
for build in "${builds[@]}"; do wait "$build"; done

for fuzzer in fuzz/*_fuzzer.py; do
  name=$(basename "$fuzzer" .py)
  target=${name%_fuzzer}
  if [ -d "corpus/seeds/$target" ]; then
    (cd "corpus/seeds/$target" && zip -q -j "$OUT/${name}_seed_corpus.zip" ./*)
  fi
  dictionary=$(python3 -c "from fuzz.targets import load; print(load('$target').DICTIONARY or '')")
  if [ -n "$dictionary" ]; then
    cp "corpus/dict/$dictionary" "$OUT/${name}.dict"
  fi
  max_len=$(python3 -c "from fuzz.targets import load; print(load('$target').MAX_LEN)")
  printf '[libfuzzer]\nmax_len = %s\ntimeout = 30\nrss_limit_mb = 4096\n' "$max_len" > "$OUT/${name}.options"
done
