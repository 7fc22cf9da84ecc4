"""Result bundles for the dashboard tests: real runs of a few cases, and edited copies of them.

A real run of the reference and of ``OffByOneDecode`` (a runtime whose decoded values are one too high)
over ``SELECTION``; edited copies stand for other runtimes, earlier runs and hostile bundles (the
dashboard shows what a bundle says without checking its digests, unless asked to verify a signature).
"""

from __future__ import annotations

import html
import json
import pathlib
import re
import shutil
from collections import Counter
from html.parser import HTMLParser

import numpy as np

from conformance.adapters.reference import ReferenceAdapter
from conformance.cli import main

#: Affine storage and scale-type cases (value and rejection cases; some listed for onnxruntime in
#: docs/peer-deviations.md), two state cases and a few Recommended cases.
SELECTION = ("Required.Affine.Storage", "Required.Affine.ScaleType", "Required.State.ModelUse",
             "Recommended.Affine.Axis")
#: A state case of the selection (six steps) and a Required case whose outcome the tests edit.
STATE_CASE = "Required.State.ModelUse.StructuredStateNoModelScan"
#: Cases docs/peer-deviations.md classifies for onnxruntime: a runtime deviation with a reproduction and
#: an adapter limitation explained under "Shared findings".
DEVIATION_CASE = "Required.Affine.ScaleType.Bfloat16.PerTensor"
LIMITATION_CASE = "Required.Affine.Storage.Int4PaddingNonzero"


class OffByOneDecode(ReferenceAdapter):
    """Decodes every floating-point value one too high: fails the value-comparing decode cases."""

    name = "offbyone"

    def decode(self, model_bytes, value_name, base_dir):
        values = super().decode(model_bytes, value_name, base_dir)
        return values + np.asarray(1, dtype=values.dtype) if values.dtype.kind == "f" else values


def run_bundle(directory: pathlib.Path, adapter: str | None = None) -> pathlib.Path:
    """A real run of ``SELECTION`` written to ``directory`` as a bundle."""
    argv = ["run", "--quiet", "--report-dir", str(directory)]
    for pattern in SELECTION:
        argv += ["--cases", pattern]
    if adapter:
        argv += ["--adapter", adapter]
    assert main(argv) in (0, 1)
    return directory


def make_bundles(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """Run label -> bundle: the reference, a faulty runtime, and an "onnxruntime" that fails two cases the
    peer-deviation document classifies, a state case at its step 2, and one case with a "crashed" verdict
    (which no suite writes)."""
    reference = run_bundle(root / "reference")
    faulty = run_bundle(root / "faulty", "dashboard_bundles:OffByOneDecode")
    failure = {"verdict": "failed", "message": "the model was accepted but should be rejected"}
    peer = edit(reference, root / "peer", runtime="onnxruntime", changes={
        DEVIATION_CASE: failure, LIMITATION_CASE: failure,
        STATE_CASE: {"verdict": "failed", "message": "step 2 (values) retained values ['x'], expected ['cache']"},
        "Required.Affine.Storage.Int8PerTensor": {"verdict": "crashed", "message": "the runtime died"}})
    return {"reference": reference, "offbyone": faulty, "onnxruntime": peer}


def results(directory: pathlib.Path) -> dict:
    return json.loads((directory / "results.json").read_text())


def edit(source: pathlib.Path, target: pathlib.Path, runtime: str | None = None,
         changes: dict[str, dict] | None = None, drop: tuple[str, ...] = ()) -> pathlib.Path:
    """A copy of the bundle ``source`` at ``target`` with its runtime renamed, the fields of some results
    replaced (``{case id: {field: value}}``) and some results dropped."""
    shutil.copytree(source, target)
    recorded = results(target)
    recorded["results"] = [dict(item, **(changes or {}).get(item["id"], {})) for item in recorded["results"]
                           if item["id"] not in drop]
    if runtime:
        recorded["run"]["adapter"]["name"] = runtime
        manifest = json.loads((target / "manifest.json").read_text())
        manifest["adapter"]["name"] = runtime
        (target / "manifest.json").write_text(json.dumps(manifest))
    (target / "results.json").write_text(json.dumps(recorded))
    return target


def expected_matrix(bundles: dict[str, pathlib.Path], only: set[str] | None = None
                    ) -> dict[tuple[str, str, str], Counter]:
    """(level, area, run label) -> verdict counts, straight from each bundle's results.json (of the cases
    ``only`` names, when given)."""
    matrix: dict[tuple[str, str, str], Counter] = {}
    for label, directory in bundles.items():
        for item in results(directory)["results"]:
            if only is not None and item["id"] not in only:
                continue
            level, area = item["id"].split(".")[:2]
            matrix.setdefault((level, area, label), Counter())[item["verdict"]] += 1
    return matrix


class MatrixReader(HTMLParser):
    """The matrix of an index page: (level, area, run index) -> {verdict: count}, from the data attributes
    of its cells (the totals row is left out)."""

    def __init__(self):
        super().__init__()
        self.cells: dict[tuple[str, str, int], Counter] = {}
        self._level = self._area = None
        self._cell: tuple | None = None

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if tag == "table" and "matrix" in (attributes.get("class") or ""):
            self._level = attributes.get("data-level")
        elif tag == "tr" and "data-area" in attributes:
            self._area = attributes["data-area"]
        elif tag == "tfoot":
            self._area = None
        elif tag == "td" and self._level and self._area and "data-run" in attributes:
            self._cell = (self._level, self._area, int(attributes["data-run"]))
            self.cells[self._cell] = Counter()
        elif tag == "span" and self._cell and "data-verdict" in attributes:
            self.cells[self._cell][attributes["data-verdict"]] += int(attributes["data-count"])

    def handle_endtag(self, tag):
        if tag == "td":
            self._cell = None
        elif tag == "table":
            self._level = None


def read_matrix(index_html: str, labels: list[str]) -> dict[tuple[str, str, str], Counter]:
    reader = MatrixReader()
    reader.feed(index_html)
    return {(level, area, labels[run]): counts for (level, area, run), counts in reader.cells.items() if counts}


def run_labels(index_html: str) -> list[str]:
    """The runs' labels in the index's column order (the first column of the runs table)."""
    return [html.unescape(re.sub(r"<[^>]+>", "", label)) for label in
            re.findall(r'<tr class="run-row"><th scope="row">(.*?)</th>', index_html)]
