"""Time to build the dashboard for five runtimes (the reference and the four peers) and the site's size,
and, when Chromium and Playwright are there, how soon the index is interactive.

    python benchmarks/bench_dashboard.py [--bundles DIR] [--screenshot docs/dashboard-index.png]

The bundles are made with ``python -m conformance run --adapter NAME --quiet --report-dir DIR/NAME`` (a
few minutes; ``--bundles DIR`` keeps them and reuses the ones already there). Targets: the build within
10 s on a 2-core machine, the site within 15 MB, the index interactive within 1 s; figures are printed,
never asserted.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
RUNTIMES = ("reference", "onnxruntime", "onnx-reference", "openvino", "tract")
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run"]


def make_bundles(directory: pathlib.Path) -> list[pathlib.Path]:
    bundles = []
    for name in RUNTIMES:
        target = directory / name
        if not (target / "results.json").exists():
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "conformance", "run", "--adapter", name, "--quiet",
                            "--report-dir", str(target)], cwd=ROOT, stdout=subprocess.DEVNULL, check=False)
            print(f"bundle {name:15s} made in {time.perf_counter() - start:6.1f} s")
        bundles.append(target)
    return bundles


def build(bundles: list[pathlib.Path], out: pathlib.Path) -> tuple[float, float]:
    """Wall and CPU seconds of ``python -m conformance dashboard`` (the CPU time of its workers included)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "conformance", "dashboard", *map(str, bundles), "--out", str(out)],
                   cwd=ROOT, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def site_size(out: pathlib.Path) -> tuple[int, int, pathlib.Path]:
    files = [path for path in out.rglob("*") if path.is_file()]
    largest = max(files, key=lambda path: path.stat().st_size)
    return sum(path.stat().st_size for path in files), len(files), largest


#: In the page: the milliseconds to apply a verdict filter, then a text filter (laid out, as on screen).
FILTER_TIMES = """() => {
    const time = (id, value) => {
        const start = performance.now();
        const field = document.getElementById(id);
        field.value = value;
        field.dispatchEvent(new Event('change', {bubbles: true}));
        document.body.getBoundingClientRect();
        return performance.now() - start;
    };
    return [time('f-verdict', 'f'), time('f-text', 'bfloat16')];
}"""


def browse(out: pathlib.Path, screenshot: str | None) -> None:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("index in Chromium: skipped (pip install playwright; apt-get install -y chromium)")
        return
    if not os.access(CHROMIUM, os.X_OK):
        print(f"index in Chromium: skipped ({CHROMIUM} missing: apt-get install -y chromium)")
        return
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.goto((out / "index.html").as_uri(), wait_until="load")
        timing = page.evaluate("() => performance.getEntriesByType('navigation')[0].toJSON()")
        filters = page.evaluate(FILTER_TIMES)
        print(f"index in Chromium: interactive after {timing['domInteractive']:.0f} ms, loaded after "
              f"{timing['loadEventEnd']:.0f} ms; a verdict filter applied in {filters[0]:.0f} ms, a text filter in "
              f"{filters[1]:.0f} ms (target: interactive within 1 s)")
        if screenshot:
            page.goto((out / "index.html").as_uri() + "#level=Required", wait_until="load")
            page.reload(wait_until="load")
            page.screenshot(path=screenshot)
            print(f"screenshot: {screenshot} ({pathlib.Path(screenshot).stat().st_size / 1e3:.0f} kB)")
        browser.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundles", help="where the five bundles are kept (default: a temporary directory)")
    parser.add_argument("--screenshot", help="write a PNG of the index here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        keep = pathlib.Path(args.bundles) if args.bundles else pathlib.Path(scratch) / "bundles"
        bundles = make_bundles(keep)
        out = pathlib.Path(scratch) / "site"
        wall, cpu = build(bundles, out)
        size, files, largest = site_size(out)
        print(f"dashboard for {len(bundles)} runtimes: built in {wall:.1f} s wall, {cpu:.1f} s CPU on "
              f"{os.cpu_count()} cores (target: 10 s); site {size / 1e6:.1f} MB in {files} files (target: 15 MB), "
              f"largest {largest.relative_to(out)} {largest.stat().st_size / 1e3:.0f} kB")
        browse(out, args.screenshot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
