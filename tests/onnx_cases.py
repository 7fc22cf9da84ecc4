"""The onnx package's backend node cases for one operator (its data directory is not shipped)."""

from __future__ import annotations

import functools
import importlib
import sys
import warnings


@functools.cache
def node_cases(op_type: str) -> tuple:
    """The onnx backend cases of one operator, made by that operator's exporters only.

    ``collect_testcases`` would import (and so run) the exporters of every operator, seconds of work at
    collection time; the cases of one operator come from its own module, whose class runs its exporters
    when the module is first imported (or run here if it was imported already). onnx refuses a case
    name made twice, so each operator's cases are made once per process."""
    from onnx.backend.test.case import node
    from onnx.backend.test.case.base import Base

    module_name = f"{node.__name__}.{op_type.lower()}"
    start = len(node._NodeTestCases)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if module_name in sys.modules:
            exporter = getattr(sys.modules[module_name], op_type)
            assert isinstance(exporter, type) and issubclass(exporter, Base), exporter
            for attr in dir(exporter):
                if attr.startswith("export"):
                    getattr(exporter, attr)()
        else:
            importlib.import_module(module_name)
    return tuple(c for c in node._NodeTestCases[start:] if c.model.graph.node[0].op_type == op_type)
