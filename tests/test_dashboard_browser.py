"""The dashboard in a real browser: Chromium (Debian's package) driven by Playwright, from ``file://`` with
no server. The index's numbers are the bundles', filters change what is shown (and the matrix follows),
the keyboard moves through the cases, a case page shows its spec sentences, the comparison lists exactly
the changed cases, hostile bundle text stays text, and no page raises a JavaScript error or asks the
network for anything."""

from __future__ import annotations

import os
import pathlib
import shutil
from collections import Counter

import pytest
from dashboard_bundles import LIMITATION_CASE, STATE_CASE, edit, expected_matrix, make_bundles, results

from conformance.cases import load_cases
from conformance.cli import main
from conformance.spec import normalize

CHROMIUM = "/usr/bin/chromium"
INSTALL = "apt-get install -y chromium && pip install playwright jinja2"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run"]

try:
    import jinja2  # noqa: F401
    from playwright.sync_api import sync_playwright
except ImportError:
    pytest.skip(f"needs Playwright and Jinja2 ({INSTALL})", allow_module_level=True)
if not os.access(CHROMIUM, os.X_OK):
    pytest.skip(f"needs Debian's Chromium at {CHROMIUM} ({INSTALL})", allow_module_level=True)

#: the verdict codes the index's script uses
CODES = {"passed": "p", "passed without code": "w", "failed": "f", "not supported": "n"}


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict[str, pathlib.Path]:
    return make_bundles(tmp_path_factory.mktemp("bundles"))


@pytest.fixture(scope="module")
def changes(bundles, tmp_path_factory) -> tuple[pathlib.Path, dict[str, list[str]]]:
    """A baseline of the faulty runtime with some outcomes edited, and the changes the site must list."""
    current = results(bundles["offbyone"])["results"]
    passed = [r["id"] for r in current if r["verdict"] == "passed"]
    failed = [r["id"] for r in current if r["verdict"] == "failed"]
    baseline = edit(bundles["offbyone"], tmp_path_factory.mktemp("baseline") / "before", changes={
        passed[0]: {"verdict": "failed", "message": "was failing"},
        failed[0]: {"verdict": "passed", "message": "passed"},
        passed[1]: {"message": "an earlier wording"}})
    return baseline, {"newly_passing": [passed[0]], "newly_failing": [failed[0]], "verdict_changed": [],
                      "message_changed": [passed[1]], "only_baseline": [], "only_current": []}


@pytest.fixture(scope="module")
def site(bundles, changes, tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("site")
    assert main(["dashboard", *map(str, bundles.values()), "--baseline", str(changes[0]), "--out", str(out),
                 "-j", "1"]) == 0
    return out


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser):
    """A fresh page that records JavaScript errors, console errors, dialogs and every request it makes; the
    test fails if any error or dialog happened or a request left ``file://``."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    opened = context.new_page()
    problems: list[str] = []
    opened.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    opened.on("console", lambda message: message.type == "error" and problems.append(f"console: {message.text}"))
    opened.on("dialog", lambda dialog: (problems.append(f"dialog: {dialog.message}"), dialog.dismiss()))
    opened.on("request", lambda request: request.url.startswith(("file://", "data:")) or
              problems.append(f"request: {request.url}"))
    yield opened
    context.close()
    assert problems == []


def _url(site: pathlib.Path, name: str = "index.html") -> str:
    return (site / name).as_uri()


def _dom_matrix(page) -> dict[tuple[str, str, str], Counter]:
    """(level, area, run label) -> verdict counts, as the page shows them now (hidden rows left out)."""
    cells = page.eval_on_selector_all("table.matrix[data-level] tbody tr[data-area]", """rows => rows
        .filter(row => !row.hidden && !row.closest('table').hidden)
        .flatMap(row => Array.from(row.querySelectorAll('td.cell')).map(cell => [
            row.closest('table').dataset.level, row.dataset.area, Number(cell.dataset.run),
            Array.from(cell.querySelectorAll('[data-verdict]')).map(s => [s.dataset.verdict, Number(s.dataset.count)])
        ]))""")
    labels = page.eval_on_selector_all("table.runs tbody th", "ths => ths.map(th => th.textContent)")
    return {(level, area, labels[run]): Counter(dict(counts)) for level, area, run, counts in cells if counts}


def _visible_cases(page) -> list[str]:
    return page.eval_on_selector_all("#case-list tbody tr", "rows => rows.filter(r => !r.hidden)"
                                     ".map(r => r.querySelector('a').textContent)")


def _wait_for(page, text: str) -> None:
    page.wait_for_function("t => document.getElementById('shown').textContent.includes(t)", arg=text)


def test_the_index_shows_the_bundles_numbers(site, bundles, page):
    page.goto(_url(site))
    assert _dom_matrix(page) == expected_matrix(bundles)
    page.select_option("#f-verdict", "f")
    page.click("#f-reset")
    _wait_for(page, "Showing all")
    assert _dom_matrix(page) == expected_matrix(bundles), "the script's counts are the page's"


def test_filters_change_what_is_shown(site, bundles, page):
    page.goto(_url(site))
    everything = {item["id"]: {} for item in results(bundles["reference"])["results"]}
    for label, directory in bundles.items():
        for item in results(directory)["results"]:
            everything.setdefault(item["id"], {})[label] = item["verdict"]
    assert len(_visible_cases(page)) == len(everything)

    page.select_option("#f-verdict", "f")
    failing = sorted(case for case, verdicts in everything.items() if "failed" in verdicts.values())
    _wait_for(page, f"Showing {len(failing)} of")
    assert sorted(_visible_cases(page)) == failing and failing
    assert _dom_matrix(page) == expected_matrix(bundles, set(failing)), "the matrix counts the shown cases"

    page.select_option("#f-run", "1")  # failed in the second run (the faulty runtime) only
    offbyone = sorted(case for case, verdicts in everything.items() if verdicts.get("offbyone") == "failed")
    _wait_for(page, f"Showing {len(offbyone)} of")
    assert sorted(_visible_cases(page)) == offbyone

    page.click("#f-reset")
    page.select_option("#f-level", "Recommended")
    recommended = sorted(case for case in everything if case.startswith("Recommended."))
    _wait_for(page, f"Showing {len(recommended)} of")
    assert sorted(_visible_cases(page)) == recommended
    assert page.is_hidden("table.matrix[data-level=Required]")

    page.click("#f-reset")
    page.fill("#f-text", "bfloat16")
    wanted = sorted(case for case in everything if "bfloat16" in case.lower())
    _wait_for(page, f"Showing {len(wanted)} of")
    assert sorted(_visible_cases(page)) == wanted
    assert "text=bfloat16" in page.url, "the filters are in the address, so a link keeps them"
    page.goto(_url(site) + "#verdict=f&level=Required")
    assert page.input_value("#f-verdict") == "f" and page.input_value("#f-level") == "Required"
    assert sorted(_visible_cases(page)) == [case for case in failing if case.startswith("Required.")]


def test_clicking_to_a_case_page_shows_its_spec_sentences(site, page):
    quotes = {case.id: case.quote for case in load_cases()}[LIMITATION_CASE]
    page.goto(_url(site))
    page.click(f"#case-list a:text-is('{LIMITATION_CASE}')")
    page.wait_for_selector("h1.case-id")
    assert page.inner_text("h1.case-id") == LIMITATION_CASE
    shown = page.eval_on_selector_all("li.quote blockquote", "els => els.map(e => e.textContent)")
    assert shown == quotes and quotes
    page.click("li.quote a")
    target = page.url.split("#")[1]
    assert normalize(quotes[0]) in normalize(page.inner_text(f"[id='{target}'] .text")), "the link is its line"


def test_the_keyboard_moves_through_cases(site, page):
    page.goto(_url(site))
    page.keyboard.press("/")
    assert page.evaluate("document.activeElement.id") == "f-text"
    page.keyboard.type("ModelUse")
    page.keyboard.press("Escape")
    visible = _visible_cases(page)
    assert STATE_CASE in visible and all("modeluse" in case.lower() for case in visible)
    for _ in range(visible.index(STATE_CASE) + 1):
        page.keyboard.press("j")
    page.keyboard.press("k")
    page.keyboard.press("j")
    assert page.inner_text("#case-list tr.selected a") == STATE_CASE
    page.keyboard.press("Enter")
    page.wait_for_selector("h1.case-id")
    assert page.inner_text("h1.case-id") == STATE_CASE
    assert page.locator("table.trace td.t-failed").count() == 1, "the state trace marks where a run failed"
    page.keyboard.press("n")
    page.wait_for_function("id => document.querySelector('h1.case-id').textContent !== id", arg=STATE_CASE)
    page.keyboard.press("p")
    page.wait_for_function("id => document.querySelector('h1.case-id').textContent === id", arg=STATE_CASE)
    page.keyboard.press("u")
    page.wait_for_selector("section.clause")
    assert page.inner_text("h1") == "Area State"


def test_compare_lists_exactly_the_changed_cases(site, changes, page):
    page.goto(_url(site))
    page.click("text=Compared with a baseline")
    page.wait_for_selector("section.changes")
    listed = page.eval_on_selector_all("section.changes", """sections => Object.fromEntries(sections.map(s =>
        [s.dataset.section, Array.from(s.querySelectorAll('tr[data-case]')).map(r => r.dataset.case)]))""")
    assert listed == changes[1]
    page.click(f"section#newly_failing a:text-is('{changes[1]['newly_failing'][0]}')")
    page.wait_for_selector("h1.case-id")
    assert page.inner_text("h1.case-id") == changes[1]["newly_failing"][0]
    assert "Baseline:" in page.inner_text("article.outcome[data-run='1']")


def test_hostile_bundle_text_stays_text(bundles, tmp_path, page):
    hostile = "<script>alert(1)</script><img src=x onerror=alert(2)> javascript:alert(3) </script>"
    bundle = edit(bundles["reference"], tmp_path / "hostile", runtime="<b onmouseover=alert(4)>rt</b>",
                  changes={LIMITATION_CASE: {"verdict": "failed", "message": hostile, "detail": hostile}})
    out = tmp_path / "site"
    assert main(["dashboard", str(bundle), "--out", str(out), "-j", "1"]) == 0
    page.goto(_url(out))
    page.fill("#f-text", "alert(1)")
    _wait_for(page, "Showing 1 of")
    page.hover("table.runs tbody th")
    assert page.inner_text("table.runs tbody th") == "<b onmouseover=alert(4)>rt</b>"
    page.click(f"#case-list a:text-is('{LIMITATION_CASE}')")
    page.wait_for_selector("dd.message")
    assert page.inner_text("dd.message") == hostile
    assert page.locator("img").count() == 0 and page.locator("script:not([src]):not([type])").count() == 0


def test_every_page_loads_without_errors(site, page):
    names = ["index.html", "compare.html", "spec.html"] + [f"areas/{p.name}" for p in (site / "areas").iterdir()]
    names += [f"cases/{p.name}" for p in sorted((site / "cases").iterdir())[:12]]
    for name in names:
        page.goto(_url(site, name))
        assert page.title().endswith("conformance dashboard")


def test_a_copied_site_still_works(site, tmp_path, page):
    """Relative links only: the site moved elsewhere opens and navigates the same."""
    moved = pathlib.Path(shutil.copytree(site, tmp_path / "moved"))
    page.goto(_url(moved))
    page.click("table.matrix tbody a")
    page.wait_for_selector("section.clause")
    assert page.url.startswith(moved.as_uri())
