"""``fuzz run`` without the fuzz extra says in one line what is missing, instead of running no execution
and ending in a traceback; the vendor's install recipe installs the extra."""

from __future__ import annotations

import pathlib

from fuzz import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_a_missing_fuzz_extra_is_one_line(monkeypatch, tmp_path, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "atheris" else real(name, *a))
    code = cli.main(["run", "verify", "--time", "1", "--out", str(tmp_path / "out"), "--corpus", str(tmp_path / "c")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "atheris not installed" in err and ".[fuzz]" in err
    assert not (tmp_path / "out").exists()


def test_the_install_recipe_installs_the_fuzz_extra():
    recipe = (ROOT / "docs" / "testee-protocol.md").read_text()
    assert 'python -m pip install -e "./suite[fuzz]"' in recipe
