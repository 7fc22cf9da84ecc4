"""Wall time of ``python -m size_gate measure`` against binutils computing the same metrics.

Both sides run as fresh processes, interleaved, on the same file in one run:
size_gate's ``measure --json`` (interpreter start-up included) versus the
sequence ``readelf -S -W``, ``readelf -d``, ``readelf --dyn-syms -W``,
``readelf -n``, ``size -A -d`` and ``nm -D --defined-only``. The target is a
ratio of at most 2.0 on the largest shared library at hand.

    python benchmarks/bench_size_gate.py [LIBRARY ...] [--repeat N]

Without LIBRARY it measures the largest ELF shared library found among
onnxruntime's and NumPy's files and the system library directories, plus
onnxruntime's main library and libstdc++ when present.

size_gate's modules are byte-compiled first (``compileall``, into their
``__pycache__``), as installing a package does: with PYTHONDONTWRITEBYTECODE
set, as on the project's CI machines, a source checkout would otherwise be
compiled again at every start, which is not what an installed tool does. The
figure for that uncached start is printed too.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from size_gate import measure_path  # noqa: E402 - after the path setup above

BINUTILS = (
    ("readelf", "-S", "-W"),
    ("readelf", "-d"),
    ("readelf", "--dyn-syms", "-W"),
    ("readelf", "-n"),
    ("size", "-A", "-d"),
    ("nm", "-D", "--defined-only"),
)
SYSTEM_DIRS = ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")


def _is_shared_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(18)
    except OSError:
        return False
    return len(head) == 18 and head[:4] == b"\x7fELF" and head[16] == 3 and head[17] == 0


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    return Path(next(iter(spec.submodule_search_locations))) if spec and spec.submodule_search_locations else None


def candidates() -> list[Path]:
    found: list[Path] = []
    for name in ("onnxruntime", "numpy"):
        root = _package_dir(name)
        if root:
            found += [p for p in root.parent.glob(f"{name}*/**/*.so*") if p.is_file()]
    for d in SYSTEM_DIRS:
        if os.path.isdir(d):
            found += [p for p in Path(d).glob("*.so*") if p.is_file() and not p.is_symlink()]
    return [p for p in found if _is_shared_elf(p)]


def default_libraries() -> list[Path]:
    libs = candidates()
    if not libs:
        raise SystemExit("no ELF shared library found; pass one as an argument")
    chosen = [max(libs, key=lambda p: p.stat().st_size)]
    ort = _package_dir("onnxruntime")
    if ort:
        main_lib = sorted((ort / "capi").glob("libonnxruntime.so*"))
        if main_lib and main_lib[0] not in chosen:
            chosen.append(main_lib[0])
    stdcxx = sorted(p for p in libs if p.name.startswith("libstdc++.so"))
    if stdcxx and stdcxx[-1] not in chosen:
        chosen.append(stdcxx[-1])
    return chosen


#: What ``python -m size_gate measure`` imports from the repository (the rest is installed with bytecode).
MEASURE_MODULES = ("size_gate", "reference_impl/__init__.py", "reference_impl/lazy_package.py",
                   "reference_impl/broken_pipe.py", "reference_impl/cli_paths.py")


def byte_compile() -> None:
    """Write the measure path's bytecode, as installing the package would."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", *(str(REPO / m) for m in MEASURE_MODULES)],
                   stdout=subprocess.DEVNULL, check=True)


def without_bytecode(argv: list[str]) -> float:
    """One start of ``argv`` with the measure path's bytecode moved aside (restored afterwards)."""
    caches: list[Path] = []
    for module in MEASURE_MODULES:
        path = REPO / module
        cache = (path.parent if path.suffix == ".py" else path) / "__pycache__"
        if cache.is_dir() and cache not in caches:
            caches.append(cache)
    aside = [(cache, cache.with_name("__pycache__.bench")) for cache in caches]
    for cache, moved in aside:
        cache.rename(moved)
    try:
        return _run(argv)
    finally:
        for cache, moved in aside:
            moved.rename(cache)


def _run(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def bench(lib: Path, repeat: int) -> dict:
    gate_cmd = [sys.executable, "-m", "size_gate", "measure", str(lib), "--json"]
    env_ok = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env_ok]))
    gate, uncached, tools, inproc = [], [], [], []
    byte_compile()
    for _ in range(repeat):  # interleaved so both sides see the same page cache and load
        gate.append(_run(gate_cmd))
        uncached.append(without_bytecode(gate_cmd) if os.environ.get("PYTHONDONTWRITEBYTECODE") else gate[-1])
        tools.append(sum(_run([*cmd, str(lib)]) for cmd in BINUTILS))
        start = time.perf_counter()
        metrics = measure_path(lib, "*")
        inproc.append(time.perf_counter() - start)
    g, t = statistics.median(gate), statistics.median(tools)
    return {"library": str(lib), "bytes": lib.stat().st_size, "defined_symbols": metrics.defined_symbols,
            "size_gate_s": g, "binutils_s": t, "ratio": g / t, "in_process_s": statistics.median(inproc),
            "uncached_s": statistics.median(uncached),
            "repeat": repeat}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("libraries", nargs="*", type=Path)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print one JSON object per library")
    args = parser.parse_args()
    missing = [t for t in ("readelf", "size", "nm") if shutil.which(t) is None]
    if missing:
        raise SystemExit(f"binutils missing: {', '.join(missing)}")
    for lib in args.libraries or default_libraries():
        result = bench(lib, args.repeat)
        if args.json:
            print(json.dumps(result))
            continue
        verdict = "meets" if result["ratio"] <= 2.0 else "MISSES"
        print(f"{result['library']}  ({result['bytes']:,} bytes, {result['defined_symbols']:,} defined "
              f"dynamic symbols, median of {result['repeat']})")
        print(f"  size_gate measure (new process): {result['size_gate_s'] * 1000:8.1f} ms")
        print(f"    without bytecode (compiled at start): {result['uncached_s'] * 1000:6.1f} ms "
              f"({result['uncached_s'] / result['binutils_s']:.2f}x binutils)")
        print(f"  binutils, {len(BINUTILS)} commands:       {result['binutils_s'] * 1000:8.1f} ms")
        print(f"  ratio size_gate/binutils:        {result['ratio']:8.2f}  ({verdict} the 2.0 target)")
        print(f"  size_gate in-process measure:    {result['in_process_s'] * 1000:8.1f} ms")


if __name__ == "__main__":
    main()
