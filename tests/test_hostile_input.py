"""The oracle's public entry points under hostile input (docs/security.md): catalogues whose references
fan out exponentially, absurd numbers and shapes, hostile external locations, recursive functions,
deeply nested or foreign caller values, and huge declarations. Every outcome is a result or a
ContractError with a stable code, in time linear in the input."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from reference_impl import ContractError, Executor, decode, make_state, read_fields, schema, verify_model
from reference_impl.errors import ErrorCode
from reference_impl.structs import MAX_TYPE_NODES
from reference_impl.values import StructSpec, StructValue, compile_type

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run_child(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``code`` in a child importing this checkout (and this module): a regression that hangs or
    exhausts memory fails the test instead of the suite."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=str(ROOT))


def _raises(code: ErrorCode, fn, *args, **kwargs) -> ContractError:
    with pytest.raises(ContractError) as info:
        fn(*args, **kwargs)
    assert info.value.code is code, info.value
    return info.value


# ------------------------------------------------------------------------------ 1. type expansion
def diamond_model(levels: int):
    """Declarations 1..levels: declaration k has fields a and b both referencing k - 1 (2**levels paths
    through ``levels`` declarations), and a whole-struct state typed by the top one."""
    model = schema.parse_text('ir_version: 10 opset_import { domain: "" version: 23 }')
    for level in range(1, levels + 1):
        decl = model.struct_types.add(type_id=level)
        for name in ("a", "b"):
            field = decl.structure.field.add(name=name)
            if level == 1:
                field.type.tensor_type.elem_type = 1
                field.type.tensor_type.shape.dim.add(dim_value=2)
            else:
                field.type.struct_type.type_ref = level - 1
    graph = model.graph
    for name in ("x", "y"):
        info = (graph.input if name == "x" else graph.output).add(name=name)
        info.type.struct_type.type_ref = levels
    graph.node.add(op_type="Identity", input=["x"], output=["y"])
    graph.persistent_bindings.add(input_name="x", output_name="y")
    return model


def diamond_value(levels: int) -> StructValue:
    """A value of the diamond type sharing each level's struct between both parents."""
    value = StructValue({"a": np.zeros(2, np.float32), "b": np.ones(2, np.float32)}, 1)
    for level in range(2, levels + 1):
        value = StructValue({"a": value, "b": value}, level)
    return value


@pytest.mark.clause("DECL-DEPTH", "STATE-RESOLVE-ONCE")
def test_referenced_declarations_compile_once_and_are_shared():
    model = diamond_model(12)
    catalogue = verify_model(model).catalogue
    spec = compile_type(model.graph.input[0].type, catalogue)
    seen, pending = set(), [spec]
    while pending:
        current = pending.pop()
        if isinstance(current, StructSpec) and id(current) not in seen:
            seen.add(id(current))
            pending += [field for _, field in current.fields]
    assert len(seen) == 12  # one spec per declaration, not one per path (2**12 - 1)
    assert spec.fields[0][1] is spec.fields[1][1]
    assert len(repr(spec)) < 100  # printing (as the fuzz harness's digests do) does not expand paths


_DIAMOND_RUN = """
from test_hostile_input import diamond_model, diamond_value
from reference_impl import Executor, make_state
from reference_impl.structs import Catalogue
from reference_impl.bindings import validate_bindings
model = diamond_model(31)  # 2**31 paths through 31 declarations (63 levels: the deepest allowed)
assert validate_bindings(model, Catalogue(model.struct_types))[0].spec.type_id == 31
executor = Executor(model)
value = diamond_value(31)
executor.check_feeds({"x": value})
state = make_state(executor, {"x": value})
out = state.run({})
assert out["y"] is state.values["x"]
assert out["y"]["a"] is out["y"]["b"]  # adopted once: the sharing survives
assert len(repr(executor.bindings)) < 1000
print("done")
"""


@pytest.mark.clause("DECL-DEPTH", "ZC-RETAIN", "STATE-RESOLVE-ONCE")
def test_deepest_diamond_loads_binds_checks_and_runs():
    """Executor, bindings, value checks, adoption and a run over a diamond of 31 levels. Before the
    walks were memoized this never returned (time and memory doubled per level); a child turns such a
    regression into a timeout instead of a hung suite."""
    done = run_child(_DIAMOND_RUN)
    assert done.returncode == 0 and "done" in done.stdout, done.stderr[-3000:]


# ------------------------------------------------------------------ 4. unclassified exceptions
def _affine_external(location: str, length: str, offset: str | None = None):
    model = schema.parse_text('''
      ir_version: 10
      graph { name: "g" encoded_initializer { name: "w"
        affine { storage_type: 3 scale { data_type: 1 float_data: 0.5 } }
        logical_type { tensor_type { elem_type: 1 shape { dim { dim_value: 4 } } } }
        data_location: EXTERNAL } }''')
    value = model.graph.encoded_initializer[0]
    value.external_data.add(key="location", value=location)
    value.external_data.add(key="length", value=length)
    if offset is not None:
        value.external_data.add(key="offset", value=offset)
    return model


@pytest.mark.clause("PAY-EXTERNAL-KEYS")
@pytest.mark.parametrize("key", ["length", "offset"])
def test_decimal_longer_than_python_converts_is_classified(key):
    digits = "9" * 5000  # Python refuses int() on more than 4300 digits
    model = _affine_external("w.bin", digits if key == "length" else "4", digits if key == "offset" else None)
    _raises(ErrorCode.EXTERNAL_NUMBER_INVALID, verify_model, model)


@pytest.mark.clause("PAY-EXTERNAL-KEYS")
def test_leading_zeros_are_a_decimal_uint64(tmp_path):
    (tmp_path / "w.bin").write_bytes(bytes([2, 4, 0xFC, 0]))
    model = _affine_external("w.bin", "0" * 5000 + "4")
    np.testing.assert_array_equal(decode(model, "w", base_dir=tmp_path), [1.0, 2.0, -2.0, 0.0])


@pytest.mark.clause("PAY-EXTERNAL-EXTENT")
def test_extent_beyond_int64_is_rejected():
    """offset + length within uint64 but past INT64_MAX: no file offset reaches it (as onnx-light)."""
    error = _raises(ErrorCode.EXTERNAL_EXTENT_OVERFLOW, verify_model,
                    _affine_external("w.bin", "4", str(2**63 - 3)))
    assert "INT64_MAX" in error.message
    verify_model(_affine_external("w.bin", "4", str(2**63 - 5)))  # ends exactly at INT64_MAX


@pytest.mark.clause("ENC-OVERFLOW", "ENC-LOGICAL-EXACT", "RESOURCE-LIMITS")
def test_empty_logical_shape_numpy_cannot_describe_is_a_resource_limit():
    """[0, 2**62] has no elements (an empty payload is valid) but NumPy refuses the shape."""
    affine = schema.parse_text('''
      ir_version: 10
      graph { name: "g" encoded_initializer { name: "w"
        affine { storage_type: 3 scale { data_type: 1 float_data: 0.5 } }
        logical_type { tensor_type { elem_type: 1 shape {
          dim { dim_value: 0 } dim { dim_value: 4611686018427387904 } } } }
        raw_data: "" } }''')
    verify_model(affine)
    _raises(ErrorCode.RESOURCE_LIMIT, decode, affine, "w")
    from reference_impl import examples

    struct = examples.spec_example_model()
    value = struct.graph.encoded_initializer.add(name="empty", raw_data=b"")
    value.struct_type.type_ref = 2001
    for dim in (0, 2**62):
        value.logical_type.tensor_type.shape.dim.add(dim_value=dim)
    value.logical_type.tensor_type.elem_type = 1
    _raises(ErrorCode.RESOURCE_LIMIT, decode, struct, "empty")


@pytest.mark.clause("ENC-OVERFLOW", "DECL-CONSTANT", "RESOURCE-LIMITS")
def test_constant_and_dense_initializer_with_unrepresentable_shape():
    model = schema.parse_text('''
      ir_version: 10 opset_import { domain: "" version: 23 }
      struct_types { type_id: 7 structure {
        field { name: "v" type { tensor_type { elem_type: 2 shape { } } } }
        field { name: "k" constant { data_type: 1 dims: 0 dims: 4611686018427387904 } } } }
      graph { name: "g" encoded_initializer { name: "r" struct_type { type_ref: 7 } raw_data: "\\001" }
        initializer { name: "dense" data_type: 1 dims: 0 dims: 4611686018427387904 } }''')
    verified = verify_model(model)
    _raises(ErrorCode.RESOURCE_LIMIT, read_fields, model.graph.encoded_initializer[0], verified.catalogue)
    _raises(ErrorCode.TENSOR_DATA_INVALID, Executor, model)


_HUGE_DECODE = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, resource.RLIM_INFINITY))
from reference_impl import ContractError, decode, schema
model = schema.parse_text('''ir_version: 10 graph { name: "g" encoded_initializer { name: "w"
  affine { storage_type: 25 scale { data_type: 1 float_data: 0.5 } }
  logical_type { tensor_type { elem_type: 1 shape { dim { dim_value: 2147483644 } } } }
  data_location: EXTERNAL external_data { key: "location" value: "w.bin" }
  external_data { key: "length" value: "536870911" } } }''')
try:
    decode(model, "w", base_dir=sys.argv[1])
except ContractError as error:
    print(error.code.value)
"""


@pytest.mark.clause("RESOURCE-LIMITS")
def test_decode_budgets_output_bytes_before_allocating(tmp_path):
    """2**31 - 4 UINT2 codes (a 512 MiB sparse file) decode to 8 GiB of float32: refused before any
    allocation. Counting elements alone let it fail with MemoryError (here under a 3 GiB cap)."""
    with open(tmp_path / "w.bin", "wb") as handle:
        handle.truncate(536870911)
    done = run_child(_HUGE_DECODE, str(tmp_path), timeout=300)
    assert done.stdout.strip() == "RESOURCE_LIMIT", done.stderr[-2000:]


@pytest.mark.clause("PAY-EXTERNAL-EXTENT")
@pytest.mark.parametrize("location", ["a" * 300, "a/" * 3000 + "w.bin"], ids=["long-name", "long-path"])
def test_overlong_external_names_are_classified(tmp_path, location):
    """A 300-byte name, and a location far longer than PATH_MAX (opened one component at a time, it
    fails at the first missing directory)."""
    _raises(ErrorCode.EXTERNAL_FILE_INVALID, verify_model, _affine_external(location, "4"), base_dir=tmp_path)


@pytest.mark.clause("PAY-EXTERNAL-EXTENT")
def test_symlink_loop_is_classified(tmp_path):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    _raises(ErrorCode.EXTERNAL_PATH_INVALID, verify_model, _affine_external("loop", "4"), base_dir=tmp_path)
    (tmp_path / "d1").symlink_to(tmp_path / "d2")
    (tmp_path / "d2").symlink_to(tmp_path / "d1")
    _raises(ErrorCode.EXTERNAL_PATH_INVALID, verify_model, _affine_external("d1/w.bin", "4"), base_dir=tmp_path)


def _function_model(calls: str):
    return schema.parse_text(f'''
      ir_version: 10 opset_import {{ domain: "" version: 23 }} opset_import {{ domain: "local" version: 1 }}
      graph {{ name: "g" node {{ op_type: "F" domain: "local" input: "x" output: "y" }}
        input {{ name: "x" type {{ tensor_type {{ elem_type: 1 shape {{ dim {{ dim_value: 1 }} }} }} }} }}
        output {{ name: "y" type {{ tensor_type {{ elem_type: 1 shape {{ dim {{ dim_value: 1 }} }} }} }} }} }}
      {calls}''')


@pytest.mark.clause("GRAPH-STRUCT-IO")
def test_recursive_local_functions_are_refused():
    direct = _function_model('''functions { name: "F" domain: "local" input: "a" output: "b"
        opset_import { domain: "local" version: 1 } node { op_type: "F" domain: "local" input: "a" output: "b" } }''')
    error = _raises(ErrorCode.OPERATOR_UNSUPPORTED, Executor, direct)
    assert "calls itself" in error.message and error.path.startswith("model.functions[0]")
    mutual = _function_model('''
      functions { name: "F" domain: "local" input: "a" output: "b" opset_import { domain: "local" version: 1 }
        node { op_type: "G" domain: "local" input: "a" output: "b" } }
      functions { name: "G" domain: "local" input: "a" output: "b" opset_import { domain: "local" version: 1 }
        node { op_type: "F" domain: "local" input: "a" output: "b" } }''')
    _raises(ErrorCode.OPERATOR_UNSUPPORTED, Executor, mutual)


def test_function_diamond_compiles_each_body_once():
    """F_k calls F_(k-1) twice for 16 levels: one compiled body per function, shared by call sites
    (compiling each call site's body anew meant 2**16 bodies)."""
    bodies = []
    for level in range(16):
        node = 'node { op_type: "Identity" input: "a" output: "b" }' if level == 0 else \
            (f'node {{ op_type: "F{level - 1}" domain: "local" input: "a" output: "m" }} '
             f'node {{ op_type: "F{level - 1}" domain: "local" input: "m" output: "b" }}')
        bodies.append(f'functions {{ name: "F{level}" domain: "local" input: "a" output: "b" '
                      f'opset_import {{ domain: "" version: 23 }} opset_import {{ domain: "local" version: 1 }} '
                      f'{node} }}')
    model = _function_model(" ".join(bodies))
    model.graph.node[0].op_type = "F15"
    executor = Executor(model)
    assert len(executor.function_programs) == 16
    assert executor.run({"x": np.ones(1, np.float32)})["y"].tolist() == [1.0]


def test_function_calls_nest_at_most_the_depth_limit():
    bodies = []
    for level in range(80):
        node = 'node { op_type: "Identity" input: "a" output: "b" }' if level == 0 else \
            f'node {{ op_type: "F{level - 1}" domain: "local" input: "a" output: "b" }}'
        bodies.append(f'functions {{ name: "F{level}" domain: "local" input: "a" output: "b" '
                      f'opset_import {{ domain: "" version: 23 }} opset_import {{ domain: "local" version: 1 }} '
                      f'{node} }}')
    model = _function_model(" ".join(bodies))
    model.graph.node[0].op_type = "F79"
    _raises(ErrorCode.NESTING_TOO_DEEP, Executor, model)
    model.graph.node[0].op_type = "F50"
    Executor(model)


@pytest.mark.clause("STATE-INITIAL", "ZC-ENTRY-POINTS")
def test_deeply_nested_caller_values_are_classified():
    model = schema.parse_text('''
      ir_version: 10 opset_import { domain: "" version: 23 }
      graph { name: "g" node { op_type: "Identity" input: "s" output: "t" }
        input { name: "s" type { sequence_type { elem_type { tensor_type { elem_type: 1 } } } } }
        output { name: "t" type { sequence_type { elem_type { tensor_type { elem_type: 1 } } } } }
        persistent_bindings { input_name: "s" output_name: "t" } }''')
    nested: list = []
    for _ in range(5000):
        nested = [nested]
    _raises(ErrorCode.NESTING_TOO_DEEP, make_state, model, {"s": nested})
    state = make_state(model, {"s": [np.zeros(1, np.float32)]})
    _raises(ErrorCode.STATE_INITIAL_MISSING, make_state, model, None)
    _raises(ErrorCode.STATE_FEED_MISSING, state.run, ["s"])


class _Hostile:
    """A DLPack look-alike whose every method raises."""

    def __dlpack__(self, *args, **kwargs):
        raise RuntimeError("export refused")

    def __dlpack_device__(self):
        return (1, 0)

    def is_contiguous(self):
        raise ValueError("no layout")

    def data_ptr(self):
        raise OSError("no pointer")


class _HostileDevice(_Hostile):
    def __dlpack_device__(self):
        raise KeyError("no device")


class _HostileAttribute:
    @property
    def __dlpack__(self):
        raise ValueError("attribute lookup fails")


def _float_state_model():
    return schema.parse_text('''
      ir_version: 10 opset_import { domain: "" version: 23 }
      graph { name: "g" node { op_type: "Identity" input: "past" output: "present" }
        input { name: "past" type { tensor_type { elem_type: 1 shape { dim { dim_value: 1 } } } } }
        output { name: "present" type { tensor_type { elem_type: 1 shape { dim { dim_value: 1 } } } } }
        persistent_bindings { input_name: "past" output_name: "present" } }''')


@pytest.mark.clause("ZC-ENTRY-POINTS", "PAY-UNSUPPORTED-OWNERSHIP")
@pytest.mark.parametrize("value", [_Hostile(), _HostileDevice(), _HostileAttribute()],
                         ids=["methods", "device", "attribute"])
def test_hostile_dlpack_producers_are_refused(value):
    _raises(ErrorCode.STATE_UNRETAINABLE, make_state, _float_state_model(), {"past": value})


@pytest.mark.clause("BIND-NO-STRINGS", "PAY-UNSUPPORTED-OWNERSHIP")
def test_object_arrays_get_the_code_that_fits():
    objects = np.empty(1, dtype=object)
    objects[0] = {"not": "a string"}
    _raises(ErrorCode.STATE_UNRETAINABLE, make_state, _float_state_model(), {"past": objects})
    strings = np.array(["a"], dtype=object)
    _raises(ErrorCode.BINDING_STRING, make_state, _float_state_model(), {"past": strings})
    text_model = schema.parse_text('''
      ir_version: 10 opset_import { domain: "" version: 23 }
      graph { name: "g" node { op_type: "Identity" input: "s" output: "t" }
        input { name: "s" type { tensor_type { elem_type: 8 shape { dim { dim_value: 1 } } } } }
        output { name: "t" type { tensor_type { elem_type: 8 shape { dim { dim_value: 1 } } } } } }''')
    executor = Executor(text_model)
    _raises(ErrorCode.STATE_VALUE_INCOMPATIBLE, executor.check_feeds, {"s": objects})
    executor.check_feeds({"s": strings})


@pytest.mark.clause("WIRE-FIELDS")
def test_a_non_model_argument_is_a_parse_error():
    _raises(ErrorCode.MODEL_PARSE_ERROR, verify_model, "not bytes")


# ---------------------------------------------------------------------- 8. huge declarations
def _wide_struct(fields: int) -> bytes:
    """ModelProto bytes with one declaration of ``fields`` UINT8 fields, assembled from repeated bytes."""
    from conformance.wire import field, field_varint

    leaf = field(2, field(1, field_varint(1, 2) + field(2, b"")))  # Field.type = tensor(UINT8, [])
    body = b"".join(field(1, field(1, f"f{i}".encode()) + leaf) for i in range(fields))
    declaration = field_varint(10, 1) + field(2, body)
    return field_varint(1, 10) + field(1000, declaration)


@pytest.mark.clause("ENC-OVERFLOW")
def test_declarations_beyond_the_node_limit_are_refused_before_they_are_walked():
    verify_model(_wide_struct(MAX_TYPE_NODES - 1))  # one declaration + its fields: exactly the limit
    error = _raises(ErrorCode.RESOURCE_LIMIT, verify_model, _wide_struct(MAX_TYPE_NODES))
    assert error.path == "model.struct_types[0].structure"
    _raises(ErrorCode.RESOURCE_LIMIT, verify_model, _wide_struct(1_000_000))


@pytest.mark.clause("ENC-OVERFLOW")
def test_many_declarations_count_against_the_same_limit():
    model = schema.ModelProto(ir_version=10)
    for type_id in range(1, MAX_TYPE_NODES // 2 + 2):
        decl = model.struct_types.add(type_id=type_id)
        decl.bit_packing.component.add(name="x", bit_width=1)
        decl.bit_packing.dimension = 1
    _raises(ErrorCode.RESOURCE_LIMIT, verify_model, model)
