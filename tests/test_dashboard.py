"""``python -m conformance dashboard``: the site's numbers are the bundles', its case pages show the corpus's
spec sentences with their lines, a baseline comparison lists exactly what changed, and hostile bundles are
inert or a one-line error (exit 2). The browser tests are in test_dashboard_browser.py."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
from collections import Counter
from html.parser import HTMLParser

import pytest
from dashboard_bundles import (
    DEVIATION_CASE,
    LIMITATION_CASE,
    SELECTION,
    STATE_CASE,
    edit,
    expected_matrix,
    make_bundles,
    read_matrix,
    results,
    run_labels,
)

from conformance import attestation
from conformance.cases import load_cases
from conformance.cli import main
from conformance.dashboard import area_of
from conformance.dashboard.build import page_name, script_json
from conformance.dashboard.details import quote_lines
from conformance.dashboard.deviations import DOCUMENT
from conformance.dashboard.deviations import load as load_deviations
from conformance.spec import normalize, spec_text

pytest.importorskip("jinja2", reason="the dashboard needs Jinja2: pip install -e \".[dashboard]\"")

HOSTILE = "<script>alert(1)</script> javascript:alert(2) </script><script>alert(3)</script> & \u2028"


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict[str, pathlib.Path]:
    return make_bundles(tmp_path_factory.mktemp("bundles"))


def _build(out: pathlib.Path, *args: str) -> int:
    return main(["dashboard", *args, "--out", str(out), "-j", "1"])


@pytest.fixture(scope="module")
def site(bundles, tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("site")
    assert _build(out, *map(str, bundles.values())) == 0
    return out


def _page(site: pathlib.Path, case_id: str) -> str:
    return (site / "cases" / page_name(case_id)).read_text()


# ----------------------------------------------------------------------------------------------- index
def test_the_matrix_numbers_are_the_bundles_results(bundles, site):
    index = (site / "index.html").read_text()
    labels = run_labels(index)
    assert labels == list(bundles)
    assert read_matrix(index, labels) == expected_matrix(bundles)
    faulty = results(bundles["offbyone"])["results"]
    assert {r["verdict"] for r in faulty} >= {"passed", "failed"}, "the faulty runtime should fail some cases"


def test_the_index_shows_each_runs_identity_and_certification(bundles, site):
    index = (site / "index.html").read_text()
    manifest = json.loads((bundles["reference"] / "manifest.json").read_text())
    assert manifest["corpus"]["sha256"][:16] in index
    assert manifest["suite"]["version"] in index
    for profile, status in manifest["profiles"].items():  # a partial run: every claimed profile "partial"
        assert re.search(rf"<th scope=\"row\">{profile}</th>.*?{status}", index)
    assert "<td>offbyone reference_impl (spec " in index
    assert "⚠" in index and "crashed" in index, "a verdict the suite does not write is shown as found"


def test_every_case_of_the_bundles_has_a_page(bundles, site):
    ids = {item["id"] for directory in bundles.values() for item in results(directory)["results"]}
    assert {path.name for path in (site / "cases").iterdir()} == {page_name(case_id) for case_id in ids}
    assert {path.name for path in (site / "areas").iterdir()} == {page_name(area_of(i)) for i in ids}


def test_a_merged_sharded_run_is_one_run(bundles, tmp_path):
    shards = []
    for index in (1, 2):
        argv = ["run", "--quiet", "--shard", f"{index}/2", "--report-dir", str(tmp_path / f"shard{index}")]
        for pattern in SELECTION:
            argv += ["--cases", pattern]
        assert main(argv) == 0
        shards.append(str(tmp_path / f"shard{index}"))
    assert main(["merge", *shards, "--report-dir", str(tmp_path / "merged")]) == 0
    assert _build(tmp_path / "site", str(tmp_path / "merged"), str(bundles["offbyone"])) == 0
    index = (tmp_path / "site" / "index.html").read_text()
    assert read_matrix(index, run_labels(index)) == expected_matrix(
        {"reference": tmp_path / "merged", "offbyone": bundles["offbyone"]})
    assert sum(expected_matrix({"reference": tmp_path / "merged"}).values(), Counter()) == \
        sum(expected_matrix({"reference": bundles["reference"]}).values(), Counter()), "both shards' cases"


def test_an_out_that_is_a_file_is_a_one_line_error(bundles, tmp_path, capsys):
    (tmp_path / "site").write_text("")
    assert "exists and is not a directory" in _one_line_error(capsys, tmp_path / "site", bundles["reference"])


# ------------------------------------------------------------------------------------------- case pages
def test_a_case_page_shows_its_spec_sentences_with_their_lines(site):
    cases = {case.id: case for case in load_cases()}
    case = cases[LIMITATION_CASE]
    page = _page(site, LIMITATION_CASE)
    lines = spec_text().splitlines()
    assert case.quote
    for quote in case.quote:
        assert f"<blockquote>{quote}</blockquote>" in page
        number = next(n for n, line in enumerate(lines, 1) if normalize(quote)[:30] in normalize(line))
        assert f'href="../spec.html#L{number}">line {number}' in page
    spec = (site / "spec.html").read_text()
    assert re.search(rf'id="L{number}".*?{re.escape(lines[number - 1].strip()[:20])}', spec)
    assert "encoded_initializer" in page, "the model in text form"
    assert "AFFINE_PADDING_NONZERO" in page, "the expected outcome"


def test_a_state_case_page_shows_where_each_run_failed(site):
    page = _page(site, STATE_CASE)
    steps = re.findall(r"<tr><td>(\d+)</td>", page)
    assert steps == [str(n) for n in range(len(steps))] and len(steps) >= 3
    cells = re.findall(r'<td class="c t-([a-z-]+)" rowspan="(\d+)" data-run="(\d+)">', page)
    # the reference passed: one cell over every step; "onnxruntime" (run 2) held steps 0-1 and failed at 2
    assert ("held", str(len(steps)), "0") in cells
    assert [(kind, rows) for kind, rows, run in cells if run == "2"] == [
        ("held", "2"), ("failed", "1"), ("unreached", str(len(steps) - 3))]


def test_a_peer_failure_shows_its_classification_and_reproduction(site):
    page = _page(site, DEVIATION_CASE)
    assert "runtime deviation" in page and 'href="#finding-R-BFLOAT16"' in page
    assert 'id="finding-R-BFLOAT16"' in page and "import onnxruntime as ort" in page
    limitation = _page(site, LIMITATION_CASE)
    assert "adapter limitation" in limitation and 'id="finding-L-PADDING"' in limitation
    assert "finding-" not in _page(site, "Required.Affine.Storage.Int8PerTensor"), "not classified for a peer"


def test_the_peer_document_is_read_row_by_row():
    text = DOCUMENT.read_text()
    rows = re.findall(r"^\| `([^`]+)` \|", text, re.M)
    parsed = load_deviations()
    assert sum(len(classes) for classes in parsed.classes.values()) == len(rows)
    assert set(parsed.classes) == {"onnxruntime", "onnx-reference", "openvino", "tract"}
    for classes in parsed.classes.values():
        assert all(c.finding in parsed.findings for c in classes.values()), "every finding has its section"


def test_every_quote_of_the_corpus_is_found_on_its_lines():
    lines = spec_text().splitlines()
    for case in load_cases():
        for quote in case.quote:
            found = quote_lines(quote)
            assert found, (case.id, quote)
            first, last = found
            text = normalize(" ".join(lines[first - 1:last]))
            assert normalize(quote) in text, (case.id, quote, first, last)


# ------------------------------------------------------------------------------------------------ compare
def test_compare_lists_exactly_the_changed_cases(bundles, tmp_path):
    current = results(bundles["offbyone"])["results"]
    passed = [r["id"] for r in current if r["verdict"] == "passed"]
    failed = [r["id"] for r in current if r["verdict"] == "failed"]
    assert len(passed) >= 5 and failed
    baseline = edit(bundles["offbyone"], tmp_path / "before", changes={
        passed[0]: {"verdict": "failed", "message": "was failing"},
        passed[1]: {"verdict": "not supported", "message": "was not supported"},
        failed[0]: {"verdict": "passed", "message": "passed"},
        passed[2]: {"verdict": "passed without code", "message": "passed, but a rejection carried no error code"},
        passed[3]: {"message": "an earlier wording"}}, drop=(passed[4],))
    out = tmp_path / "site"
    assert _build(out, *map(str, bundles.values()), "--baseline", str(baseline)) == 0
    page = (out / "compare.html").read_text()
    sections = {key: re.findall(r'<tr data-case="([^"]+)">', body)
                for key, body in re.findall(r'<section id="(\w+)" class="changes"[^>]*>(.*?)</section>', page, re.S)}
    assert sections == {"newly_passing": [min(passed[0], passed[1]), max(passed[0], passed[1])],
                        "newly_failing": [failed[0]], "verdict_changed": [passed[2]],
                        "message_changed": [passed[3]], "only_baseline": [], "only_current": [passed[4]]}
    assert f'href="cases/{page_name(failed[0])}"' in page
    assert "Baseline:" in _page(out, passed[3]) and "an earlier wording" in _page(out, passed[3])


def test_a_baseline_of_another_runtime_is_a_one_line_error(bundles, tmp_path, capsys):
    status = _build(tmp_path / "site", str(bundles["reference"]), "--baseline", str(bundles["offbyone"]))
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "'offbyone', and no bundle given is" in err


# ------------------------------------------------------------------------------------------------- signed
def test_signed_bundles_are_verified_only_under_a_trusted_key(bundles, tmp_path, capsys):
    attestation.generate_key(tmp_path / "vendor.pem", tmp_path / "vendor.pub.pem")
    attestation.generate_key(tmp_path / "other.pem", tmp_path / "other.pub.pem")
    signed = pathlib.Path(shutil.copytree(bundles["reference"], tmp_path / "signed"))
    assert main(["sign", str(signed), "--key", str(tmp_path / "vendor.pem")]) == 0
    runs = [str(signed), str(bundles["offbyone"])]

    def signature_cells(*options: str) -> list[str]:
        out = tmp_path / f"site-{len(options)}-{options[-1][-12:] if options else ''}"
        assert _build(out, *runs, *options) == 0
        return re.findall(r'<td class="sig (\w+)">', (out / "index.html").read_text())

    assert signature_cells() == ["signed", "unsigned"]
    assert signature_cells("--trusted-key", str(tmp_path / "vendor.pub.pem")) == ["verified", "unsigned"]
    assert signature_cells("--trusted-key", str(tmp_path / "other.pub.pem")) == ["signed", "unsigned"]


# ------------------------------------------------------------------------------------------------ hostile
@pytest.fixture(scope="module")
def hostile_site(bundles, tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path]:
    root = tmp_path_factory.mktemp("hostile")
    hostile = edit(bundles["reference"], root / "bundle", runtime="<img src=x onerror=alert(4)>", changes={
        LIMITATION_CASE: {"verdict": "failed", "message": HOSTILE, "detail": HOSTILE, "traceback": HOSTILE},
        STATE_CASE: {"verdict": "<b>odd</b>", "message": HOSTILE}})
    records = results(hostile)
    records["results"].append(dict(records["results"][0], id="../../<script>alert(5)</script>", message=HOSTILE))
    (hostile / "results.json").write_text(json.dumps(records))
    out = root / "site"
    assert _build(out, str(hostile)) == 0
    return out, hostile


def test_hostile_strings_are_escaped_everywhere(hostile_site):
    out, _ = hostile_site
    pages = list(out.rglob("*.html"))
    assert all(path.resolve().is_relative_to(out.resolve()) for path in pages), "no page outside the site"
    for path in pages:
        elements = _elements(path.read_text())
        assert not [tag for tag, _ in elements if tag in ("img", "b", "iframe", "object", "embed")], path
        assert not [name for _, attrs in elements for name, _ in attrs if name.startswith("on")], path
        links = [value or "" for _, attrs in elements for name, value in attrs if name in ("href", "src")]
        assert not [link for link in links if ":" in link.split("#")[0] and not link.startswith("data:,")], path
        scripts = [dict(attrs) for tag, attrs in elements if tag == "script"]
        assert scripts[0]["src"].endswith("static/dashboard.js") and scripts[1:] in (
            [], [{"type": "application/json", "id": "dashboard-data"}]), path
    index = (out / "index.html").read_text()
    data = index.split('<script type="application/json" id="dashboard-data">', 1)[1].split("</script>", 1)[0]
    assert "<" not in data and ">" not in data and "&" not in data
    assert HOSTILE in json.dumps(json.loads(data), ensure_ascii=False), "the message itself reaches the script"
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in _page(out, LIMITATION_CASE)


class _Elements(HTMLParser):
    def __init__(self):
        super().__init__()
        self.found: list[tuple[str, list]] = []

    def handle_starttag(self, tag, attrs):
        self.found.append((tag, attrs))


def _elements(text: str) -> list[tuple[str, list]]:
    """Every start tag of a page with its attributes, as a browser's tokenizer sees them."""
    parser = _Elements()
    parser.feed(text)
    return parser.found


def test_script_json_cannot_close_its_element():
    text = script_json({"m": "</script><!-- & \u2028"})
    assert "<" not in text and ">" not in text and "&" not in text and "\u2028" not in text
    assert json.loads(text) == {"m": "</script><!-- & \u2028"}


def test_page_names_are_plain_and_distinct():
    hostile = ["../x", "a/b", "a_b", ".hidden", "", "x" * 400, "Required.Affine.Storage.X"]
    names = [page_name(key) for key in hostile]
    assert len(set(names)) == len(names)
    assert names[-1] == "Required.Affine.Storage.X.html"
    assert all("/" not in name and not name.startswith(".") and len(name) < 200 for name in names)


def _one_line_error(capsys, out: pathlib.Path, *bundles: pathlib.Path) -> str:
    capsys.readouterr()
    assert _build(out, *map(str, bundles)) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and captured.err.startswith("conformance: ")
    assert "Traceback" not in captured.err
    return captured.err


def test_a_symlinked_results_json_is_refused(bundles, tmp_path, capsys):
    linked = edit(bundles["reference"], tmp_path / "linked")
    (linked / "results.json").unlink()
    os.symlink(bundles["offbyone"] / "results.json", linked / "results.json")
    err = _one_line_error(capsys, tmp_path / "site", linked)
    assert str(linked) in err and "results.json cannot be opened without following links" in err
    assert not (tmp_path / "site" / "index.html").exists()


@pytest.mark.parametrize("content,reason", [
    (b"{\"results\": [", "results.json is not valid JSON"),
    (b"\xff\xfe", "results.json is not UTF-8 text"),
    (b"[1, 2]", "results.json should be an object"),
    (b"{\"results\": [{\"id\": \"Required.X.Y.Z\", \"verdict\": 5}]}", "verdict should be a string"),
    (b"{\"results\": [{\"id\": \"Required.X.Y.Z\", \"verdict\": \"passed\", \"message\": {}}]}",
     "message should be a string"),
    (b"{\"results\": [{\"id\": \"A.B.C.D\", \"verdict\": \"passed\"}, {\"id\": \"A.B.C.D\", \"verdict\": \"x\"}]}",
     "more than once"),
    (b"[" * 100000 + b"]" * 100000, "results.json"),
], ids=["truncated", "not-utf8", "not-an-object", "verdict-kind", "message-kind", "duplicate", "deep"])
def test_a_malformed_results_json_is_a_one_line_error(bundles, tmp_path, capsys, content, reason):
    broken = edit(bundles["reference"], tmp_path / "broken")
    (broken / "results.json").write_bytes(content)
    assert reason in _one_line_error(capsys, tmp_path / "site", bundles["offbyone"], broken)


def test_a_malformed_manifest_or_a_missing_bundle_is_a_one_line_error(bundles, tmp_path, capsys):
    broken = edit(bundles["reference"], tmp_path / "broken")
    manifest = json.loads((broken / "manifest.json").read_text())
    manifest["profiles"] = {"affine": ["certified"]}
    (broken / "manifest.json").write_text(json.dumps(manifest))
    assert "manifest.json.profiles.affine should be a string" in _one_line_error(capsys, tmp_path / "s1", broken)
    assert "not a readable directory" in _one_line_error(capsys, tmp_path / "s2", tmp_path / "missing")
    fifo = edit(bundles["reference"], tmp_path / "fifo")
    (fifo / "manifest.json").unlink()
    os.mkfifo(fifo / "manifest.json")
    assert "manifest.json is not a regular file" in _one_line_error(capsys, tmp_path / "s3", fifo)


def test_the_area_is_the_second_component_of_the_id():
    assert area_of("Required.Affine.Storage.X") == "Affine"
    assert area_of("Recommended.KV.Paged.Y") == "KV"
    assert area_of("odd") == "(no area)"
