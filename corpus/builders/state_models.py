"""Builders for state cases whose graphs are long or computed: a deliberately slow state model."""

from __future__ import annotations

from conformance_corpus_builders import builder


@builder
def slow_state(chain: int = 24, width: int = 256):
    """present = past + 1 (bound to past); y = a @ W @ W ... (``chain`` MatMuls, W = identity), so a run
    takes long enough, in proportion to the rows of ``a``, for a second call to overlap it."""
    import numpy as np
    from conformance_corpus_builders.common import model
    from onnx import numpy_helper

    from reference_impl import schema

    m = model("slow")
    g = m.graph
    g.initializer.append(schema.from_onnx(numpy_helper.from_array(np.eye(width, dtype=np.float32), "w")))
    g.initializer.append(schema.from_onnx(numpy_helper.from_array(np.ones(2, dtype=np.float32), "one")))
    previous = "a"
    for k in range(chain):
        g.node.add(op_type="MatMul", input=[previous, "w"], output=[f"y{k}"])
        previous = f"y{k}"
    g.node.add(op_type="Add", input=["past", "one"], output=["present"])
    for name, dims in (("past", [2]), ("a", ["n", width])):
        vi = g.input.add(name=name)
        vi.type.tensor_type.elem_type = 1
        for d in dims:
            dim = vi.type.tensor_type.shape.dim.add()
            if isinstance(d, str):
                dim.dim_param = d
            else:
                dim.dim_value = d
    for name, dims in (("present", [2]), (previous, None)):
        vi = g.output.add(name=name)
        vi.type.tensor_type.elem_type = 1
        if dims:
            vi.type.tensor_type.shape.dim.add(dim_value=2)
    g.persistent_bindings.add(input_name="past", output_name="present")
    return {"model": m}
