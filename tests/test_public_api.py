"""The public API the docs show is the one the packages export: every import in a documentation code
block works, every ``reference_impl.name`` / ``ri.name`` the docs mention exists, and the README's list
of public names is exactly ``reference_impl.__all__``."""

from __future__ import annotations

import ast
import importlib
import pathlib
import re

import pytest

import reference_impl

ROOT = pathlib.Path(__file__).resolve().parents[1]
GENERATED = {"clauses.md", "error-codes.md", "spec-coverage.md", "peer-deviations.md"}
DOCS = [ROOT / "README.md"] + [p for p in sorted((ROOT / "docs").glob("*.md")) if p.name not in GENERATED]


def _code_blocks(path: pathlib.Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_every_import_in_the_docs_works(path):
    for block in _code_blocks(path):
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in (
                    "reference_impl", "conformance", "fuzz", "size_gate"):
                module = importlib.import_module(node.module)
                missing = [a.name for a in node.names if not hasattr(module, a.name)]
                assert not missing, f"{path.name}: {node.module} has no {missing}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] in ("reference_impl", "conformance", "fuzz", "size_gate"):
                        importlib.import_module(alias.name)


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_every_qualified_name_the_docs_mention_exists(path):
    text = path.read_text()
    names = set(re.findall(r"`(reference_impl(?:\.\w+)+)", text))
    names |= {f"reference_impl.{n}" for block in _code_blocks(path) for n in re.findall(r"\bri\.(\w+)", block)}
    for dotted in sorted(names):
        parts = dotted.split(".")
        for split in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:split]))
            except ImportError:
                continue
            for attr in parts[split:]:
                assert hasattr(obj, attr), f"{path.name}: {dotted} does not exist"
                obj = getattr(obj, attr)
            break


def test_the_readme_lists_exactly_the_public_names():
    text = (ROOT / "README.md").read_text()
    paragraph = text[text.index("The public API is what `reference_impl` exports"):]
    paragraph = paragraph[:paragraph.index("plus `reference_impl.kv`")]
    listed = set(re.findall(r"`(\w+)`", paragraph)) - {"reference_impl"}
    assert listed == set(reference_impl.__all__)


def test_type_checkers_see_exactly_the_lazy_exports():
    """The package root imports its names on first use; the ``TYPE_CHECKING`` block shows the same names
    to mypy. The two lists must not drift apart."""
    import ast
    import pathlib

    import reference_impl

    tree = ast.parse(pathlib.Path(reference_impl.__file__).read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If)
                 and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
    seen = {alias.name for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert seen == set(reference_impl.__all__)
