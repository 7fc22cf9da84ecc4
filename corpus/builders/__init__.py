"""Named builders for cases whose inputs are too large or too regular to write as text.

Each builder returns a dict: ``model`` (an extended ModelProto or bytes), optionally ``files``
({relative path: bytes}) and ``expected`` (values derived here with NumPy formulas or onnx's reference
evaluator, never by running the oracle under test).
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys

BUILDERS: dict = {}


def builder(fn):
    """Register ``fn`` under its name."""
    BUILDERS[fn.__name__] = fn
    return fn


def _load(name: str) -> None:
    path = pathlib.Path(__file__).with_name(f"{name}.py")
    module_name = f"{__name__}.{name}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)


for _name in ("representation", "affine_sweep", "affine_scales", "wire", "kv", "kv_formats", "kv_paged",
              "kv_contiguous", "kv_semantics", "coverage_models", "limits"):
    _load(_name)
