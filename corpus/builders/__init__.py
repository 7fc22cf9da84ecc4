"""Named builders for cases whose inputs are too large or too regular to write as text.

Each builder returns a dict: ``model`` (an extended ModelProto or bytes), optionally ``files``
({relative path: bytes}) and ``expected`` (values derived here with NumPy formulas or onnx's reference
evaluator, never by running the oracle under test).
"""

from __future__ import annotations

import importlib

BUILDERS: dict = {}
#: The builder modules, imported (so their builders register) when the package is.
MODULES = ("structured_examples", "affine_sweep", "affine_scales", "wire", "kv", "kv_formats", "kv_paged",
           "kv_contiguous", "kv_semantics", "wire_fields", "limits", "kv_reuse", "kv_masks",
           "affine_layouts", "kv_batches", "limits_leaves", "kv_workspace", "kv_padding", "kv_combinations",
           "affine_chunks",
           "encoding_chunks", "kv_chunks", "zero_copy_layouts", "state_positions", "state_identity",
           "state_cost", "catalogue_positions", "declarations_forms", "kv_identity", "kv_caller_layouts",
           "external_measured", "kv_attention_inputs")


def builder(fn):
    """Register ``fn`` under its name; two builders of one name would silently replace each other."""
    if fn.__name__ in BUILDERS:
        raise RuntimeError(f"two corpus builders are named {fn.__name__}")
    BUILDERS[fn.__name__] = fn
    return fn


for _name in MODULES:
    importlib.import_module(f"{__name__}.{_name}")
