"""The onnx package's backend node cases for one operator (its data directory is not shipped)."""

from __future__ import annotations

import warnings


def node_cases(op_type: str) -> list:
    """The onnx backend cases of one operator. collect_testcases fills a process-wide list once, filtered
    by the first caller's op_type; when another filter came first, re-run this operator's exporters."""
    import sys

    from onnx.backend.test.case import node
    from onnx.backend.test.case.base import Base

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = [c for c in node.collect_testcases(None) if c.model.graph.node[0].op_type == op_type]
        if not cases:
            start = len(node._NodeTestCases)
            for name, module in list(sys.modules.items()):
                exporter = getattr(module, op_type, None) if name.startswith(node.__name__ + ".") else None
                if isinstance(exporter, type) and issubclass(exporter, Base):
                    for attr in dir(exporter):
                        if attr.startswith("export"):
                            getattr(exporter, attr)()
            cases = [c for c in node._NodeTestCases[start:] if c.model.graph.node[0].op_type == op_type]
    return cases
