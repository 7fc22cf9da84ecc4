"""Affine values at edges the happy cases rarely reach: axis = -rank, per-axis parameters of rank-3 and
rank-4 values, odd UINT4 and partial UINT2 tails, subnormal FLOAT16 scales, FLOAT scales decoded to a
narrower logical type (DequantizeLinear's output_dtype), and external payloads past the first page, of
zero length or one byte too long.

Expected values come from onnx's reference evaluator running DequantizeLinear on the same codes and
parameters (an independent implementation), with ``output_dtype`` when the logical type differs from
the scale's.
"""

from __future__ import annotations

import numpy as np

from . import builder
from .affine_scales import SCALE_TYPES, scale_array, scale_tensor
from .affine_sweep import packed
from .common import model

#: a page of filler before an extent placed past the first allocation-granularity boundary
PAGE = 4096


def onnx_dequantize(codes: np.ndarray, storage: int, scale: np.ndarray, zero_point, axis, block,
                    output_type: int | None = None) -> np.ndarray:
    """DequantizeLinear (opset 25) in onnx's reference evaluator; ``output_type`` sets output_dtype."""
    import onnx
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    x = helper.make_tensor("x", storage, list(codes.shape), vals=packed(codes, storage), raw=True)
    s = onnx.numpy_helper.from_array(scale, "s")
    inits, inputs = [x, s], ["x", "s"]
    if zero_point is not None:
        zp = np.asarray(zero_point)
        inits.append(helper.make_tensor("z", storage, list(zp.shape), vals=packed(zp, storage), raw=True))
        inputs.append("z")
    attrs = {}
    if axis is not None:
        attrs["axis"] = axis
    if block:
        attrs["block_size"] = block
    if output_type is not None:
        attrs["output_dtype"] = output_type
    node = helper.make_node("DequantizeLinear", inputs, ["y"], **attrs)
    out_type = output_type if output_type is not None else SCALE_TYPES_BY_NUMBER[s.data_type]
    graph = helper.make_graph([node], "dq", [], [helper.make_tensor_value_info("y", out_type, list(codes.shape))],
                              inits)
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)])
    with np.errstate(invalid="ignore", over="ignore"):  # NaN and infinity are the expected IEEE results
        return ReferenceEvaluator(onnx_model).run(None, {})[0]


SCALE_TYPES_BY_NUMBER = {number: number for number, _ in SCALE_TYPES.values()}
_TYPE_NAMES = {number: name for name, (number, _) in SCALE_TYPES.items()}


@builder
def affine_edge(storage: int, shape: list, codes: list, scale: list, scale_type: str = "float",
                elem: int | None = None, zero_point: list | int | None = None, axis: int | None = None,
                block: int | None = None, external: str = "", extra_bytes: int = 0, padding: int = 0,
                scale_raw: bool = False, zp_int32: bool = False, empty_offset: int = 4):
    """One affine value ``w``: ``codes`` (row-major) of ``shape``, a ``scale_type`` scale, an optional
    zero point, axis and block size, the logical element type ``elem`` (default: the scale's). The
    payload is inline, or external in ``w.bin``: ``external`` = "page" at offset 4100 (past the first
    page), = "empty" an extent of length 0 at ``empty_offset`` of a 4-byte file (its end by default),
    = "long" an extent ``extra_bytes`` longer than the codes. ``padding`` is ORed into the last payload
    byte (nonzero unused bits; the case then expects a rejection and ``expected`` is meaningless).
    ``scale_raw`` stores the scale in raw_data (little-endian) instead of its typed field; ``zp_int32``
    stores the zero point in int32_data, one packed byte per entry (two four-bit or four two-bit codes,
    as TensorProto packs them)."""
    from reference_impl import schema

    codes_array = np.asarray(codes, dtype=np.int64).reshape(shape)
    data_type = SCALE_TYPES[scale_type][0]
    scale_values = scale_array(scale_type, scale)
    if axis is None:
        scale_values = scale_values.reshape(())  # per tensor: a scalar, as DequantizeLinear requires
    param_shape = scale_values.shape
    codes_bytes = packed(codes_array, storage)
    if padding:
        codes_bytes = codes_bytes[:-1] + bytes([codes_bytes[-1] | padding])
    value = schema.EncodedValueProto(name="w")
    layout = value.affine
    layout.storage_type = storage
    layout.scale.CopyFrom(scale_tensor(scale_values, data_type, param_shape))
    if scale_raw:
        layout.scale.ClearField("float_data")
        layout.scale.ClearField("int32_data")
        layout.scale.ClearField("double_data")
        layout.scale.raw_data = scale_values.astype(scale_values.dtype.newbyteorder("<")).tobytes()
    zp = None
    if zero_point is not None:
        zp = np.asarray(zero_point, dtype=np.int64)
        layout.zero_point.data_type = storage
        layout.zero_point.dims.extend(zp.shape)
        if zp_int32:
            layout.zero_point.int32_data.extend(np.frombuffer(packed(zp, storage), np.uint8).tolist())
        else:
            layout.zero_point.raw_data = packed(zp, storage)
    if axis is not None:
        layout.axis = axis
    if block:
        layout.block_size = block
    logical = value.logical_type.tensor_type
    logical.elem_type = elem if elem is not None else data_type
    logical.shape.SetInParent()
    for dim in shape:
        logical.shape.dim.add(dim_value=dim)
    files = {}
    if not external:
        value.raw_data = codes_bytes
    else:
        value.data_location = 1
        offset, body = {"page": (PAGE + 4, codes_bytes), "empty": (empty_offset, b""),
                        "long": (0, codes_bytes + bytes(extra_bytes))}[external]
        filler = bytes([0x7F]) * (4 if external == "empty" else offset)  # codes that decode to something else
        files["w.bin"] = filler + body + (b"\x7f" * 4 if external == "page" else b"")
        value.external_data.add(key="location", value="w.bin")
        if offset:
            value.external_data.add(key="offset", value=str(offset))
        value.external_data.add(key="length", value=str(len(body)))
    m = model("affine_edge", opset=25)
    m.graph.encoded_initializer.append(value)
    output_type = elem if elem is not None and elem != data_type else None
    expected = onnx_dequantize(codes_array, storage, scale_values, zp, axis, block, output_type)
    return {"model": m, "expected": expected, "files": files}


def _codes_from_bytes(data: bytes, storage: int, shape) -> np.ndarray:
    """The row-major codes of ``shape`` in ``data`` (TensorProto.raw_data packing, low bits first)."""
    count = int(np.prod(shape))
    raw = np.frombuffer(data, np.uint8)
    if storage in (3, 2):
        return raw[:count].view(np.int8 if storage == 3 else np.uint8).astype(np.int64).reshape(shape)
    width = 4 if storage in (22, 21) else 2
    groups = (raw[:, None] >> (np.arange(0, 8, width)[None, :])) & ((1 << width) - 1)
    codes = groups.reshape(-1)[:count].astype(np.int64)
    if storage in (22, 26):  # two's complement
        codes = np.where(codes >= 1 << (width - 1), codes - (1 << width), codes)
    return codes.reshape(shape)


@builder
def affine_file_values(file: str, values: list, decode: str):
    """Several affine values with external payloads in one file ``w.bin`` (``file``: hex bytes). Each
    entry of ``values``: name, storage, shape, scale (a per-tensor FLOAT), offset, length. ``expected``:
    the value named ``decode``, its codes read from the file at its own extent and decoded by onnx's
    reference evaluator."""
    from reference_impl import schema

    data = bytes.fromhex(file.replace(" ", ""))
    m = model("affine_file_values", opset=25)
    expected = None
    for spec in values:
        value = schema.EncodedValueProto(name=spec["name"])
        layout = value.affine
        layout.storage_type = spec["storage"]
        layout.scale.data_type = 1
        layout.scale.float_data.append(spec["scale"])
        logical = value.logical_type.tensor_type
        logical.elem_type = 1
        logical.shape.SetInParent()
        for dim in spec["shape"]:
            logical.shape.dim.add(dim_value=dim)
        value.data_location = 1
        value.external_data.add(key="location", value="w.bin")
        value.external_data.add(key="offset", value=str(spec["offset"]))
        value.external_data.add(key="length", value=str(spec["length"]))
        m.graph.encoded_initializer.append(value)
        if spec["name"] == decode:
            extent = data[spec["offset"]:spec["offset"] + spec["length"]]
            codes = _codes_from_bytes(extent, spec["storage"], spec["shape"])
            expected = onnx_dequantize(codes, spec["storage"], np.asarray(spec["scale"], np.float32), None, None, None)
    return {"model": m, "expected": expected, "files": {"w.bin": data}}


@builder
def affine_long_rows(storage: int, rows: int, cols: int, zero_point: list | None = None):
    """A [rows, cols] value of four- or two-bit codes ``(7 * i) mod 2**bits`` (minus 8 for INT4) with one
    scale per row (axis 0, scales 0.5, 1, 2, ...), large enough (over 2**20 codes) that a runtime decodes it
    in parallel parts: with an odd ``cols``, every other row starts inside a byte. ``expected`` from onnx's
    reference evaluator."""
    from reference_impl import schema

    width = 4 if storage in (22, 21) else 2
    codes = (np.arange(rows * cols, dtype=np.int64) * 7) % (1 << width)
    if storage == 22:
        codes -= 8
    elif storage == 26:
        codes -= 2
    codes = codes.reshape(rows, cols)
    scale = (0.5 * 2.0 ** np.arange(rows)).astype(np.float32)
    value = schema.EncodedValueProto(name="w", raw_data=packed(codes, storage))
    layout = value.affine
    layout.storage_type = storage
    layout.scale.data_type = 1
    layout.scale.dims.append(rows)
    layout.scale.float_data.extend(scale.tolist())
    zp = None
    if zero_point is not None:
        zp = np.asarray(zero_point, dtype=np.int64)
        layout.zero_point.data_type = storage
        layout.zero_point.dims.append(rows)
        layout.zero_point.raw_data = packed(zp, storage)
    layout.axis = 0
    logical = value.logical_type.tensor_type
    logical.elem_type = 1
    logical.shape.SetInParent()
    logical.shape.dim.add(dim_value=rows)
    logical.shape.dim.add(dim_value=cols)
    m = model("affine_long_rows", opset=25)
    m.graph.encoded_initializer.append(value)
    return {"model": m, "expected": onnx_dequantize(codes, storage, scale, zp, 0, None)}
