"""Named builders for cases whose inputs are too large or too regular to write as text.

Each builder returns a dict: ``model`` (an extended ModelProto or bytes), optionally ``files``
({relative path: bytes}) and ``expected`` (values derived here with NumPy formulas or onnx's reference
evaluator, never by running the oracle under test).
"""

from __future__ import annotations

import importlib

BUILDERS: dict = {}
#: The builder modules, imported (so their builders register) when the package is.
MODULES = ("representation", "affine_sweep", "affine_scales", "wire", "kv", "kv_formats", "kv_paged",
           "kv_contiguous", "kv_semantics", "coverage_models", "limits", "second_state", "state_more",
           "affine_more", "kv_more", "thin_repr", "thin_state", "mut_kv", "kv_combinations", "affine_chunks",
           "record_chunks", "kv_chunks", "positions", "declaration_forms")


def builder(fn):
    """Register ``fn`` under its name."""
    BUILDERS[fn.__name__] = fn
    return fn


for _name in MODULES:
    importlib.import_module(f"{__name__}.{_name}")
