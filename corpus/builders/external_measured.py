"""How often a runtime opens an external payload file, counted from outside (conformance/measured.py,
``file_opens``: an audit hook in the runner's process). A runtime that re-validates or re-reads the file on
every run, or opens it once per record or chunk, opens it in proportion to the calls or to the payload,
whatever it reports.

Values: ``w`` of 4096 FLOAT elements in ``counted.bin`` (offset 0), either ``Affine`` (INT8 codes
``(i * 37) % 256 - 128``, scale 0.5, so element i is half its code) or ``Struct`` (128 records of the
spec's SCALED_CODEBOOK2_BLOCK_32, 1102 -> 1101: the spec's own "128 records" example, 1536 bytes). The
expected values are the NumPy formulas written from the spec (``codebook_at`` of
corpus/builders/encoding_chunks.py for the records), never the oracle's output.
"""

from __future__ import annotations

import numpy as np

from reference_impl import schema

from . import builder
from .common import model, spec_catalogue
from .encoding_chunks import codebook_at, codebook_payload

#: the external file every case counts the opens of
FILE = "counted.bin"
#: elements of the value (128 codebook records of 32)
ELEMENTS = 4096
RECORDS = ELEMENTS // 32
#: opens allowed for one load, verify or decode: a few (the reference makes three: it validates the extent
#: when verifying the model and again for the value, then maps it once), far below one per record (128)
#: or per 64-byte chunk (64 for the affine value)
OPENS_PER_CALL = 8
#: opens allowed in all over the runs of a state: the payload may be mapped lazily at the first run
OPENS_OVER_RUNS = 1
RUNS = 3


def _affine_codes() -> np.ndarray:
    return ((np.arange(ELEMENTS) * 37) % 256 - 128).astype(np.int8)


def _value(m, layout: str) -> tuple[bytes, np.ndarray]:
    """Add the external value ``w`` to ``m``; its file bytes and its decoded values."""
    value = m.graph.encoded_initializer.add(name="w")
    if layout == "Affine":
        value.affine.storage_type = 3  # INT8
        value.affine.scale.data_type = 1
        value.affine.scale.float_data.append(0.5)
        codes = _affine_codes()
        payload, expected = codes.tobytes(), codes.astype(np.float32) * np.float32(0.5)
    else:
        m.struct_types.extend(spec_catalogue())
        value.struct_type.type_ref = 1102
        payload, expected = codebook_payload(RECORDS), codebook_at(np.arange(ELEMENTS))
    tensor = value.logical_type.tensor_type
    tensor.elem_type = 1
    tensor.shape.dim.add(dim_value=ELEMENTS)
    value.data_location = 1  # EXTERNAL
    value.external_data.add(key="location", value=FILE)
    value.external_data.add(key="length", value=str(len(payload)))
    return payload, expected


def _literal(values: np.ndarray) -> dict:
    return {"dtype": "float32", "shape": [int(values.size)], "data": [float(v) for v in values]}


@builder
def external_state_opens(layout: str):
    """s <- s over [1, 2] beside y = Decode(w), ``w`` external. Opening the state opens ``counted.bin`` at
    most ``OPENS_PER_CALL`` times; the three runs that follow (each y = the decoded w) open it at most
    once in all."""
    m = model("external_opens")
    m.opset_import.add(domain="onnx_light", version=1)
    payload, expected = _value(m, layout)
    rest = schema.parse_text(
        'graph {\n'
        '  node { op_type: "Decode" domain: "onnx_light" input: "w" output: "y" }\n'
        '  input { name: "s" type { tensor_type { elem_type: 1 shape { dim { dim_value: 2 } } } } }\n'
        '  output { name: "s" type { tensor_type { elem_type: 1 shape { dim { dim_value: 2 } } } } }\n'
        '  output { name: "y" type { tensor_type { elem_type: 1 shape { dim { dim_value: ELEMENTS } } } } }\n'
        '  persistent_bindings { input_name: "s" output_name: "s" }\n}\n'.replace("ELEMENTS", str(ELEMENTS)),
        "ModelProto")
    m.graph.MergeFrom(rest.graph)
    small = {"dtype": "float32", "shape": [2], "data": [1.0, 2.0]}
    steps = [{"op": "file_opens", "file": FILE, "at_most": OPENS_PER_CALL,
              "call": {"op": "open", "initial": {"s": small}}},
             {"op": "file_opens", "file": FILE, "at_most": OPENS_OVER_RUNS, "count": RUNS,
              "call": {"op": "run", "feeds": {}, "outputs": {"y": _literal(expected), "s": small}}}]
    return {"model": m, "files": {FILE: payload}, "steps": steps}


@builder
def external_call_opens(layout: str, call: str):
    """``call`` is ``verify`` or ``decode`` of the model holding only ``w``: one call opens ``counted.bin``
    at most ``OPENS_PER_CALL`` times (a decode also yields the decoded w)."""
    m = model("external_opens")
    payload, expected = _value(m, layout)
    inner: dict = {"op": call}
    if call == "decode":
        inner.update(value="w", values=_literal(expected))
    steps = [{"op": "file_opens", "file": FILE, "at_most": OPENS_PER_CALL, "call": inner}]
    return {"model": m, "files": {FILE: payload}, "steps": steps}
