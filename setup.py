"""The distribution's package layout (its metadata is in pyproject.toml).

The wheel installs the import packages ``conformance``, ``reference_impl``, ``fuzz`` and ``size_gate`` with
the data the documented commands read. The repository's ``corpus/`` becomes ``conformance/_corpus/`` and
the documents read at run time become ``conformance/_docs/``, so no generic top-level ``corpus`` package is
installed (``conformance.locations`` finds either layout; docs/conformance.md, "Installing from a wheel").
Such a mapping cannot be written next to automatic package discovery in pyproject.toml, hence this file.

Folders without ``__init__.py`` (the C++ SDK, templates, budgets, case manifests, seeds) are listed as
packages of data, every file of them shipped; Python packages ship the data files named below.
"""

import os

from setuptools import find_namespace_packages, setup

IMPORT_PACKAGES = ("conformance", "reference_impl", "fuzz", "size_gate")
#: installed package -> the repository folder it is built from
MAPPED = {"conformance._corpus": "corpus", "conformance._docs": "docs"}
#: the documents the suite reads: the spec's text (quotes, line numbers), the peers' deviations
#: (dashboard), the committed kill matrix and the coverage table rendered from it (audit, spec-coverage)
DOCS = {"conformance._docs": ["peer-deviations.md", "spec-coverage.md"], "conformance._docs.spec": ["*.txt"],
        "conformance._docs.audit": ["kill-matrix.json"]}
NOT_PACKAGES = ["*__pycache__*", "*.egg-info*"]


def _under(package: str, folder: str) -> list[str]:
    """``package`` and every folder below ``folder`` as its subpackages."""
    found = find_namespace_packages(where=folder, exclude=NOT_PACKAGES)
    return [package, *(f"{package}.{name}" for name in found)]


def _folder(package: str) -> str:
    for mapped, folder in MAPPED.items():
        if package == mapped or package.startswith(mapped + "."):
            return os.path.join(folder, *package[len(mapped):].split(".")[1:])
    return os.path.join(*package.split("."))


packages = [name for name in find_namespace_packages(include=[f"{top}*" for top in IMPORT_PACKAGES],
                                                     exclude=NOT_PACKAGES)
            if name.split(".")[0] in IMPORT_PACKAGES]
packages += _under("conformance._corpus", "corpus")
packages += list(DOCS)
data = {name: ["*"] for name in packages if not os.path.isfile(os.path.join(_folder(name), "__init__.py"))}
data.update(DOCS)
data["conformance"] = ["testee.proto"]
data["conformance._corpus"] = ["renames.toml", "dimensions.toml"]  # case ID renames; dimensions by area

setup(packages=packages, package_dir=MAPPED, package_data=data,
      exclude_package_data={"": ["*.py[cod]"]})
