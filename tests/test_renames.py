"""Every case ID the suite renamed keeps resolving (corpus/renames.toml): ``--cases`` and ``show`` take the
old ID with a one-line note, a failure list naming old IDs still waives its cases, and a bundle naming
cases by old IDs is refused with a message that names the rename."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys

from conformance import failure_list, renames
from conformance.bundle import _check_corpus
from conformance.cases import load_cases
from conformance.cli import main

TABLE = renames.table()


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_the_table_renames_to_current_cases_only():
    ids = {case.id for case in load_cases()}
    assert len(TABLE) >= 215
    assert set(TABLE.values()) <= ids and not set(TABLE) & ids


def test_every_old_id_selects_its_case_through_cases():
    arguments = [word for old in sorted(TABLE) for word in ("--cases", old)]
    listed = subprocess.run([sys.executable, "-m", "conformance", "list", *arguments],
                            capture_output=True, text=True, check=True)
    assert sorted(listed.stdout.split()) == sorted(set(TABLE.values()))
    assert listed.stderr.count("note: --cases ") == len(TABLE)


def test_every_old_id_shows_its_case_with_a_note():
    for old, new in sorted(TABLE.items()):
        code, out, err = _cli("show", old)
        assert code == 0 and new in out, old
        assert f"note: case {old} names {new}" in err


def test_an_old_prefix_selects_every_case_renamed_from_it():
    code, out, err = _cli("list", "--cases", "Required.ThinDecl")
    expected = sorted(new for old, new in TABLE.items() if old.startswith("Required.ThinDecl."))
    assert code == 0 and out.split() == expected and "note: --cases Required.ThinDecl" in err


def test_a_failure_list_of_old_ids_is_read_as_the_new_ones_with_a_note(tmp_path):
    old, new = "Required.AffineMore.Axis.MinusRankRank1", TABLE["Required.AffineMore.Axis.MinusRankRank1"]
    listing = tmp_path / "failures.txt"
    listing.write_text(f"{old}  # wrong axis\nRequired.Wire.Numbering.*\n")
    ids = [case.id for case in load_cases()]
    entries, notes = failure_list.upgrade(failure_list.read(listing), ids, TABLE)
    assert [e.pattern for e in entries] == [new, "Required.Wire.Numbering.*"]
    assert entries[0].message == "wrong axis"
    assert len(notes) == 1 and notes[0].startswith(f"line 1: note: entry {old} names {new}")


def test_a_bundle_naming_old_ids_is_refused_and_the_message_names_the_rename():
    cases = load_cases()
    old = next(o for o in sorted(TABLE) if o.startswith("Required.ThinState."))
    manifest = {"corpus": {"sha256": "0" * 64, "files_sha256": "0" * 64},
                "cases": [{"id": old, "sha256": "0" * 64, "level": "Required", "profile": "state"}]}
    problems = _check_corpus(manifest, cases, None)
    assert "renamed" in problems[0] and renames.FILE in problems[0] and TABLE[old] in problems[0]
    assert f"{old} is now {TABLE[old]}" in "\n".join(problems)
